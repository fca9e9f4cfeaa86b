"""guidance (``models.LlamaCpp``): gen, select, regex and json, as its docs show.

guidance decodes through the raw API: ``llama_model_get_vocab(llm.model)``, its own ``llama_batch``,
``llama_memory_seq_rm(llama_get_memory(llm.ctx), ...)``, ``llama_decode(llm.ctx, batch)``,
``llama_get_logits(llm.ctx)``; llguidance casts ``llama_cpp.llama_cpp._lib.llama_tokenize``.
"""

from __future__ import annotations

import json
import re
import warnings

import pytest

guidance = pytest.importorskip("guidance")

from guidance import gen, regex, select  # noqa: E402
from guidance import json as gjson  # noqa: E402


@pytest.fixture(scope="module")
def lm(spm_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fixture's ChatML template: guidance says it falls back to ChatML
        return guidance.models.LlamaCpp(spm_path, n_ctx=512, echo=False, verbose=False)


def test_gen(lm, record):
    out = lm + "The sky is " + gen("c", max_tokens=8, temperature=0.0)
    assert isinstance(record("c", out["c"]), str)


def test_gen_stop_and_regex(lm, record):
    out = lm + "Digits: " + gen("d", regex=r"[0-9]+", max_tokens=6, temperature=0.0)
    assert re.fullmatch(r"[0-9]+", record("d", out["d"]))


def test_select(lm, record):
    out = lm + "Pick: " + select(["red", "green", "blue"], name="s")
    assert record("s", out["s"]) in ("red", "green", "blue")


def test_regex(lm, record):
    out = lm + "Code: " + regex(r"[A-Z]{2}-[0-9]{3}", name="r")
    assert re.fullmatch(r"[A-Z]{2}-[0-9]{3}", record("r", out["r"]))


def test_json(lm, record):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                               "adult": {"type": "boolean"}},
              "required": ["name", "adult"], "additionalProperties": False}
    out = lm + "Person: " + gjson(name="j", schema=schema, max_tokens=60, temperature=0.0)
    data = json.loads(record("j", out["j"]))
    assert set(data) == {"name", "adult"}
