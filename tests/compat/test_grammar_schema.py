"""JSON schema → GBNF with llama.cpp's converter semantics, checked three ways: the grammars equal
the ones llama.cpp's own converter test expects, llama.cpp's grammar parser accepts them, and
constrained generation on a fixture model yields JSON that validates against the schema."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llama_cpp import Llama
from llama_cpp._errors import GrammarError
from llama_cpp.llama_grammar import LlamaGrammar, json_schema_to_gbnf

REPO = Path(__file__).resolve().parents[2]
LLAMA_CPP_CASES = REPO / "vendor" / "llama.cpp" / "tests" / "test-json-schema-to-grammar.cpp"
_CASE = re.compile(r'test\(\{\s*(SUCCESS|FAILURE),\s*"((?:[^"\\]|\\.)*)",\s*R"""\((.*?)\)""",\s*'
                   r'R"""\((.*?)\)"""\s*\}\);', re.S)


def _trim(text: str) -> str:
    return re.sub(r"(^|\n)[ \t]+", r"\1", text.strip(" \n\r\t"))


def _llama_cpp_cases() -> list[tuple[str, str, str, str]]:
    if not LLAMA_CPP_CASES.exists():
        return []
    return _CASE.findall(LLAMA_CPP_CASES.read_text(encoding="utf-8"))


CASES = _llama_cpp_cases()


@pytest.mark.skipif(not CASES, reason="vendor/llama.cpp/tests is not checked out")
def test_reads_llama_cpps_converter_cases():
    assert len(CASES) >= 70, "the case reader no longer matches llama.cpp's test file"
    assert {c[0] for c in CASES} == {"SUCCESS", "FAILURE"}


@pytest.mark.parametrize(("status", "name", "schema", "expected"), CASES, ids=[c[1] for c in CASES])
def test_same_grammar_as_llama_cpp(status, name, schema, expected):
    if status == "FAILURE":
        with pytest.raises(ValueError):
            json_schema_to_gbnf(json.loads(schema))
        return
    assert _trim(json_schema_to_gbnf(json.loads(schema))) == _trim(expected)


@pytest.fixture(scope="module")
def llm():
    from build_tools.fixtures import fixture_path

    with Llama(str(fixture_path("llama_spm")), n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False) as m:
        yield m


def test_llama_cpp_parses_every_converted_grammar(llm):
    converted = [json_schema_to_gbnf(json.loads(schema)) for status, _, schema, _ in CASES if status == "SUCCESS"]
    converted.append(json_schema_to_gbnf(PYDANTIC_SCHEMA))
    for gbnf in converted:
        # a grammar llama.cpp's parser refused raises here, before any token
        llm("{", max_tokens=1, temperature=0, grammar=LlamaGrammar.from_string(gbnf))
    with pytest.raises(Exception, match="grammar"):
        llm("{", max_tokens=1, grammar=LlamaGrammar.from_string('root ::= "a" undefined-rule'))


# what pydantic 2 writes for: class Tag(BaseModel): name: constr(max_length=6)
# class Item(BaseModel): id: conint(ge=1, le=500); tags: conlist(Tag, max_length=2);
# kind: Literal["a", "b"]; code: constr(pattern=r"^[A-Z]{2}[0-9]{2}$"); price: float | None = None
PYDANTIC_SCHEMA = {
    "$defs": {"Tag": {"properties": {"name": {"maxLength": 6, "title": "Name", "type": "string"}},
                      "required": ["name"], "title": "Tag", "type": "object"}},
    "properties": {
        "id": {"maximum": 500, "minimum": 1, "title": "Id", "type": "integer"},
        "tags": {"items": {"$ref": "#/$defs/Tag"}, "maxItems": 2, "title": "Tags", "type": "array"},
        "kind": {"enum": ["a", "b"], "title": "Kind", "type": "string"},
        "code": {"pattern": "^[A-Z]{2}[0-9]{2}$", "title": "Code", "type": "string"},
        "price": {"anyOf": [{"type": "number"}, {"type": "null"}], "default": None, "title": "Price"},
    },
    "required": ["id", "tags", "kind", "code"], "title": "Item", "type": "object",
}

# every schema here has a finite language (bounded lengths, counts and digits), so a constrained
# generation with enough tokens must end, and what it wrote must validate
GENERATION_SCHEMAS = {
    "pydantic": PYDANTIC_SCHEMA,
    "int-range": {"type": "integer", "minimum": -40, "maximum": 1250},
    "exclusive": {"type": "integer", "exclusiveMinimum": 7, "exclusiveMaximum": 12},
    "pattern": {"type": "string", "pattern": "^(ab|c[0-9]{1,3})-x?$"},
    "all-of": {"allOf": [{"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]},
                         {"type": "object", "properties": {"b": {"const": 3}}, "required": ["b"]}]},
    "tuple": {"type": "array", "prefixItems": [{"type": "integer", "minimum": 0, "maximum": 9},
                                               {"enum": ["x", "y"]}, {"type": "null"}]},
    "unique-items": {"type": "array", "items": {"enum": [1, 2, 3]}, "uniqueItems": False,
                     "minItems": 1, "maxItems": 3},
    "formats": {"type": "object", "properties": {"d": {"type": "string", "format": "date"},
                                                 "u": {"type": "string", "format": "uuid"}},
                "required": ["d", "u"], "additionalProperties": False},
    "type-list": {"type": ["boolean", "null"]},
    "lengths": {"type": "string", "minLength": 2, "maxLength": 4},
}


@pytest.mark.parametrize("name", sorted(GENERATION_SCHEMAS))
@pytest.mark.parametrize("seed", [1, 2])
def test_constrained_generation_validates(llm, name, seed):
    jsonschema = pytest.importorskip("jsonschema")
    schema = GENERATION_SCHEMAS[name]
    grammar = LlamaGrammar.from_json_schema(json.dumps(schema))
    r = llm("{", max_tokens=300, temperature=1.0, seed=seed, grammar=grammar)
    text = r["choices"][0]["text"]
    assert r["choices"][0]["finish_reason"] == "stop", text
    jsonschema.validate(json.loads(text), schema)


def test_upstream_grammar_api(tmp_path):
    g = LlamaGrammar(_grammar='root ::= "x"')
    assert g._grammar == 'root ::= "x"' and g._root == "root"
    path = tmp_path / "g.gbnf"
    path.write_text('root ::= [a-z]+\n')
    assert LlamaGrammar.from_file(path).grammar == "root ::= [a-z]+\n"
    with pytest.raises(ValueError, match="cannot read"):
        LlamaGrammar.from_file(tmp_path / "missing.gbnf")
    # prop_order puts the named properties first
    schema = {"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}}, "required": ["a", "b"]}
    assert 'root ::= "{" space b-kv "," space a-kv' in json_schema_to_gbnf(json.dumps(schema), prop_order=["b"])


@pytest.mark.parametrize(("schema", "match"), [
    ({"type": "integer", "minimum": 10, "maximum": 2}, "maximum .2. is smaller than minimum .10."),
    ({"type": "string", "minLength": 4, "maxLength": 1}, "maxLength .1. is smaller than minLength .4."),
    ({"$ref": "#/$defs/missing"}, "cannot resolve"),
    ({"$ref": "https://example.com/s.json"}, "only references into the same document"),
    ({"type": "string", "pattern": "^(ab$"}, "unbalanced parentheses"),
    ({"type": "integer", "minimum": "3"}, "must be a finite number"),
    ({"type": "frobnicate"}, "unrecognized type"),
    ({"enum": []}, "non-empty"),
])
def test_bad_schemas_name_the_problem(schema, match):
    with pytest.raises(GrammarError, match=match):
        json_schema_to_gbnf(schema)


def test_unsupported_pattern_accepts_any_string(caplog):
    with caplog.at_level("WARNING", logger="llama_cpp.grammar"):
        gbnf = json_schema_to_gbnf({"type": "string", "pattern": "^(?=a)b$"})
    assert "root ::= string\n" in gbnf and 'string ::= "\\"" char* "\\""' in gbnf
    assert "not supported" in caplog.text


def test_upstream_module_names():
    import llama_cpp.llama_grammar as g

    for name in ("ARITHMETIC_GBNF", "C_GBNF", "CHESS_GBNF", "JAPANESE_GBNF", "JSON_ARR_GBNF", "LIST_GBNF", "JSON_GBNF"):
        assert LlamaGrammar.from_string(getattr(g, name)).root == "root"
    assert g.PRIMITIVE_RULES["integer"].deps == ["integral-part"]
    conv = g.SchemaConverter(prop_order={"b": 0}, allow_fetch=False, dotall=False, raw_pattern=False)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "required": ["a", "b"]}
    conv.visit(conv.resolve_refs(schema, "stdin"), "")
    assert conv.format_grammar() == json_schema_to_gbnf(schema, prop_order=["b"])
    with pytest.raises(ValueError, match="remote"):
        g.SchemaConverter(prop_order={}, allow_fetch=True, dotall=False, raw_pattern=False)


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_pydantic_models_convert_and_constrain(llm, seed):
    pydantic = pytest.importorskip("pydantic")
    jsonschema = pytest.importorskip("jsonschema")
    from typing import Literal, Optional

    class Tag(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=5)
        weight: float  # number bounds are not grammar-enforced (as in llama.cpp), so none here

    class Order(pydantic.BaseModel):
        id: int = pydantic.Field(ge=1, le=99)
        status: Literal["new", "done"]
        tags: list[Tag] = pydantic.Field(max_length=2)
        note: Optional[str] = pydantic.Field(default=None, max_length=4)  # noqa: UP045
        code: str = pydantic.Field(pattern=r"^[a-z]{2}-[0-9]$")
        pair: tuple[int, bool]

    schema = Order.model_json_schema()
    grammar = LlamaGrammar.from_json_schema(json.dumps(schema))
    r = llm("{", max_tokens=500, temperature=1.0, seed=seed, grammar=grammar)
    assert r["choices"][0]["finish_reason"] == "stop", r["choices"][0]["text"]
    data = json.loads(r["choices"][0]["text"])
    jsonschema.validate(data, schema)
    Order.model_validate(data)
