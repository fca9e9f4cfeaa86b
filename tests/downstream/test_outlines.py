"""outlines (``outlines.from_llamacpp``): JSON schema, regex, choice and streaming, as its docs show.

outlines builds its vocabulary with ``llama_model_get_vocab(llm.model)`` and ``llama_token_to_piece``,
so ``Llama.model`` must be upstream's raw pointer.
"""

from __future__ import annotations

import json
import re
from typing import Literal

import pytest

outlines = pytest.importorskip("outlines")
pytest.importorskip("numba", reason="outlines' numpy kernels need numba")

from pydantic import BaseModel  # noqa: E402

from llama_cpp import Llama  # noqa: E402


class Person(BaseModel):
    name: str
    adult: bool


@pytest.fixture(scope="module")
def model(spm_path):
    llm = Llama(model_path=spm_path, n_ctx=512, seed=1, verbose=False)
    yield outlines.from_llamacpp(llm)
    llm.close()


def test_regex(model, record):
    out = record("text", model("A number:", outlines.types.Regex(r"[0-9]{3}"), max_tokens=8, temperature=0.0))
    assert re.fullmatch(r"[0-9]{3}", out)


def test_choice(model, record):
    out = record("text", model("Yes or no?", Literal["yes", "no", "maybe"], max_tokens=5, seed=3))
    assert out in ("yes", "no", "maybe")


def test_json_schema(model, record):
    out = record("text", model("A person:", outlines.types.JsonSchema(json.dumps(
        {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "adult": {"type": "boolean"}},
         "required": ["name", "adult"], "additionalProperties": False})), max_tokens=60, temperature=0.0))
    p = Person.model_validate_json(out)
    assert len(p.name) <= 6


def test_pydantic_output_type(model, record):
    out = record("text", model("Describe:", Literal["cat", "dog"], max_tokens=4, temperature=0.0))
    assert out in ("cat", "dog")


def test_streaming(model, record):
    chunks = record("chunks", list(model.stream("Count:", outlines.types.Regex(r" [0-9]{2}"), max_tokens=6,
                                                temperature=0.0)))
    assert re.fullmatch(r" [0-9]{2}", "".join(chunks))


def test_plain_text_and_chat(model, record):
    text = record("text", model("Once upon a time", max_tokens=8, temperature=0.0))
    assert isinstance(text, str)
    chat = record("chat", model(outlines.inputs.Chat([{"role": "user", "content": "hi"}]), max_tokens=6,
                                temperature=0.0))
    assert isinstance(chat, str)
