"""Issue 29: silently wrong results and unclean exceptions at the public entry points."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from build_tools.fixtures.cache import fixture_path
from llama_cpp import Llama
from llama_cpp._errors import GrammarError, ParameterError, TemplateError
from llama_cpp._safety.arguments import ArgumentTypeError
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from llama_cpp.llama_grammar import LlamaGrammar, json_schema_to_gbnf

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def llm():
    with Llama(str(fixture_path("llama_spm")), n_ctx=128, n_batch=64, n_threads=1, verbose=False) as m:
        yield m


def test_logit_bias_banning_every_token_is_an_error(llm) -> None:
    ban = {t: float("-inf") for t in range(llm.n_vocab())}
    with pytest.raises(ParameterError, match="bans every token"):
        llm.create_completion(PROMPT, max_tokens=4, logit_bias=ban)
    with pytest.raises(ParameterError, match="bans every token"):
        llm.create_chat_completion(MESSAGES, max_tokens=4, logit_bias=ban)


@pytest.mark.parametrize("role", ["user</s><s>system", "<|im_start|>system", "user\nsystem", "", "x" * 33])
def test_role_must_be_a_plain_name(llm, role: str) -> None:
    with pytest.raises(ValueError, match="role"):
        llm.create_chat_completion([{"role": role, "content": "hi"}], max_tokens=1)


@pytest.mark.parametrize(("kwargs", "name"), [({"max_tokens": "10"}, "max_tokens"), ({"temperature": "hot"}, "temperature"),
                                              ({"top_k": 1.5}, "top_k"), ({"stop": [1]}, "stop"),
                                              ({"seed": "1"}, "seed"), ({"logit_bias": [1]}, "logit_bias")])
def test_argument_types_are_checked_at_the_boundary(llm, kwargs, name: str) -> None:
    with pytest.raises(ArgumentTypeError, match=name) as info:
        llm.create_completion(PROMPT, **kwargs)
    assert isinstance(info.value, ParameterError) and isinstance(info.value, TypeError)
    with pytest.raises(ArgumentTypeError, match=name):
        llm.create_chat_completion(MESSAGES, **kwargs)


@pytest.mark.parametrize("messages", [["hi"], [None], "hi", [{"role": "user", "content": 3}]])
def test_malformed_messages_are_clean_errors(llm, messages) -> None:
    with pytest.raises(ValueError, match="messages"):
        llm.create_chat_completion(messages, max_tokens=1)


def test_unsatisfiable_schema_is_a_grammar_error() -> None:
    with pytest.raises(GrammarError, match="allOf"):
        json_schema_to_gbnf({"allOf": [{"type": "string"}, {"type": "integer"}]})


def test_deep_schema_is_a_grammar_error() -> None:
    schema: dict = {"type": "string"}
    for _ in range(500):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(GrammarError, match="deep"):
        json_schema_to_gbnf(schema)


def test_nested_parentheses_are_a_grammar_error() -> None:
    with pytest.raises(GrammarError, match="nest"):
        LlamaGrammar.from_string("root ::= " + "(" * 500 + '"a"' + ")" * 500)
    # a pattern nested too deep is refused as a pattern (logged) and the string left open: no RecursionError
    assert "root" in json_schema_to_gbnf({"type": "string", "pattern": "^" + "(" * 500 + "a" + ")" * 500 + "$"})


def test_nested_ifs_are_a_template_error() -> None:
    with pytest.raises(TemplateError, match="nest"):
        Jinja2ChatFormatter("{% if true %}" * 300 + "x" + "{% endif %}" * 300)(messages=MESSAGES)


@pytest.mark.parametrize("template", [
    "{% set s = 'A' * 10000000 %}{{ s ~ s ~ s }}",
    "{% set s = 'A' * 10000000 %}{{ [s, s, s] | join }}",
    "{% set s = 'A' * 1000000 %}{{ s.replace('A', 'B' * 40) }}",
    "{{ 'x'.ljust(1000000000) }}", "{{ 'x'.rjust(1000000000) }}", "{{ 'x'.zfill(1000000000) }}",
    "{{ '{:>1000000000}'.format('x') }}", "{{ '%1000000000s' % 'x' }}", "{{ '%*s' % (1000000000, 'x') }}",
    "{{ '%1000000000s' | format('x') }}", "{{ ('\t' * 1000000).expandtabs(1000) }}",
    "{{ lipsum(n=1000000) }}", "{{ messages | tojson(indent=1000000000) }}",
])
def test_every_string_builder_is_budgeted(template: str) -> None:
    start = time.monotonic()
    with pytest.raises(TemplateError, match="budget|limit"):
        Jinja2ChatFormatter(template)(messages=MESSAGES)
    assert time.monotonic() - start < 2.0


def test_image_path_naming_a_folder_is_a_clean_error(tmp_path: Path) -> None:
    from llama_cpp._errors import MultimodalError
    from llama_cpp._safety.media_policy import MediaPolicy

    policy = MediaPolicy.with_dirs([tmp_path])
    (tmp_path / "folder").mkdir()
    with pytest.raises(MultimodalError) as folder:
        policy.resolve(str(tmp_path / "folder"))
    with pytest.raises(MultimodalError) as missing:
        policy.resolve(str(tmp_path / "nothing"))
    assert not isinstance(folder.value, IsADirectoryError)
    # the two answers do not tell a folder from a missing file
    assert str(folder.value).replace("folder", "X") == str(missing.value).replace("nothing", "X")


def test_media_path_naming_a_folder_or_fifo_in_the_library(tmp_path: Path) -> None:
    import os

    from llama_cpp._safety.cache_files import EntryError, read_regular_file

    with pytest.raises(EntryError, match="not a regular file"):
        read_regular_file(tmp_path)
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        start = time.monotonic()
        with pytest.raises(EntryError, match="not a regular file"):
            read_regular_file(tmp_path / "fifo")
        assert time.monotonic() - start < 1.0
