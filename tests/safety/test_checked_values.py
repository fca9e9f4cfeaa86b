"""Issue 13 item 2: every value that would reach C unchecked is refused first, naming the parameter
and its range; the interpreter stays alive (all cases run in one subprocess)."""

from __future__ import annotations

import logging
import textwrap

import pytest

from build_tools.fixtures import fixture_path
from llama_cpp._errors import ParameterError
from llama_cpp._safety import checks as _checks

from .probe import run_python

PROBE = textwrap.dedent('''
    import json, sys
    from llama_cpp import Llama
    path = sys.argv[1]
    out = {}

    def probe(name, fn):
        try:
            fn()
            out[name] = ["ok", ""]
        except Exception as e:
            out[name] = [type(e).__name__ + (":ValueError" if isinstance(e, ValueError) else ""), str(e)]

    nan, inf = float("nan"), float("inf")
    for kw in ({"type_k": 999}, {"type_v": 999}, {"load_mode": 99}, {"n_batch": 2**32}, {"n_ctx": 2**32 + 16},
               {"n_ubatch": 2**32}, {"n_seq_max": 2**32}, {"n_threads": 4096}, {"n_threads_batch": 10**6},
               {"n_threads": 0}, {"pooling_type": 99}, {"rope_scaling_type": 7}, {"split_mode": 9},
               {"yarn_ext_factor": nan}, {"rope_freq_base": inf}, {"yarn_orig_ctx": -1}):
        key, value = next(iter(kw.items()))
        probe("ctor " + key + (" 0" if value == 0 else ""), lambda kw=kw: Llama(path, n_ctx=kw.pop("n_ctx", 64), verbose=False, **kw).close())
    llm = Llama(path, n_ctx=64, n_batch=16, n_ubatch=16, verbose=False)
    n = llm.n_vocab()
    m = llm.model
    probe("token_to_piece high", lambda: m.token_to_piece(n + 10))
    probe("token_to_piece negative", lambda: m.token_to_piece(-5))
    probe("detokenize high", lambda: llm.detokenize([n + 10]))
    probe("detokenize negative", lambda: llm.detokenize([-5]))
    probe("eval high", lambda: llm.eval([n]))
    probe("prompt negative", lambda: llm([1, -5], max_tokens=2))
    probe("generate high", lambda: next(llm.generate([1, n + 10])))
    probe("logit_bias high", lambda: llm("hi", max_tokens=2, logit_bias={n + 10: 1.0}))
    probe("penalty_last_n int32 max", lambda: llm("hi", max_tokens=2, repeat_penalty=1.1, penalty_last_n=2**31 - 1))
    probe("penalty_last_n 1e9", lambda: llm("hi", max_tokens=2, repeat_penalty=1.1, penalty_last_n=10**9))
    probe("penalty_last_n -2", lambda: llm("hi", max_tokens=2, repeat_penalty=1.1, penalty_last_n=-2))
    probe("penalty_last_n -1 (n_ctx)", lambda: llm("hi", max_tokens=2, repeat_penalty=1.1, penalty_last_n=-1))
    probe("mirostat_mode", lambda: llm("hi", max_tokens=2, mirostat_mode=7))
    probe("temperature nan", lambda: llm("hi", max_tokens=2, temperature=nan))
    probe("top_p inf", lambda: llm("hi", max_tokens=2, top_p=inf))
    probe("top_k 2**40", lambda: llm("hi", max_tokens=2, top_k=2**40))
    probe("seed -2", lambda: llm("hi", max_tokens=2, seed=-2))
    probe("seed -1 (random, as upstream)", lambda: llm("hi", max_tokens=2, seed=-1))
    probe("still works", lambda: llm("hi", max_tokens=2, temperature=0))
    print(json.dumps(out))
''')

# case -> (the parameter the message must name, a piece of the accepted range)
REFUSED = {
    "ctor type_k": ("type_k", "q8_0"), "ctor type_v": ("type_v", "f16"), "ctor load_mode": ("load_mode", "mmap"),
    "ctor n_batch": ("n_batch", "4294967295"), "ctor n_ctx": ("n_ctx", "4294967295"),
    "ctor n_ubatch": ("n_ubatch", "4294967295"), "ctor n_seq_max": ("n_seq_max", "4294967295"),
    "ctor n_threads": ("n_threads", "[1, "), "ctor n_threads_batch": ("n_threads_batch", "[1, "),
    "ctor n_threads 0": None, "ctor pooling_type": ("pooling_type", "mean"),
    "ctor rope_scaling_type": ("rope_scaling_type", "yarn"), "ctor split_mode": ("split_mode", "layer"),
    "ctor yarn_ext_factor": ("yarn_ext_factor", "finite"), "ctor rope_freq_base": ("rope_freq_base", "finite"),
    "ctor yarn_orig_ctx": ("yarn_orig_ctx", "[0, "),
    "token_to_piece high": ("token id", "[0, "), "token_to_piece negative": ("token id -5", "[0, "),
    "detokenize high": ("token id", "[0, "), "detokenize negative": ("token id -5", "[0, "),
    "eval high": ("token id", "[0, "), "prompt negative": ("prompt token id -5", "[0, "),
    "generate high": ("prompt token id", "[0, "), "logit_bias high": ("logit_bias", "[0, "),
    "penalty_last_n int32 max": ("penalty_last_n", "[-1, "), "penalty_last_n 1e9": ("penalty_last_n", "[-1, "),
    "penalty_last_n -2": ("penalty_last_n", "[-1, "), "mirostat_mode": ("mirostat_mode", "mirostat v2"),
    "temperature nan": ("temperature", "finite"), "top_p inf": ("top_p", "finite"), "top_k 2**40": ("top_k", "2147483647"),
    "seed -2": ("seed", "4294967295"),
}
ACCEPTED = ("penalty_last_n -1 (n_ctx)", "seed -1 (random, as upstream)", "still works")


@pytest.fixture(scope="module")
def results() -> dict[str, list[str]]:
    return run_python(PROBE, str(fixture_path("llama_spm")), timeout=90)


@pytest.mark.parametrize("case", sorted(k for k in REFUSED if k != "ctor n_threads 0"))
def test_refused_before_c(results: dict[str, list[str]], case: str) -> None:
    kind, message = results[case]
    assert kind.endswith(":ValueError"), (case, kind, message)
    name, accepted = REFUSED[case]
    assert name in message and accepted in message, message


def test_zero_threads_refused(results: dict[str, list[str]]) -> None:
    kind, message = results["ctor n_threads 0"]
    assert "ParameterError" in kind and "n_threads=0 is out of range [1, " in message


@pytest.mark.parametrize("case", ACCEPTED)
def test_accepted(results: dict[str, list[str]], case: str) -> None:
    assert results[case][0] == "ok", results[case]


def test_threads_above_cores_warn(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    with caplog.at_level(logging.WARNING, logger="llama_cpp"):
        assert _checks.threads("n_threads", 5) == 5
    assert "above this machine's 2 cores" in caplog.text
    with pytest.raises(ParameterError, match=r"n_threads=9 is out of range \[1, 8\]"):
        _checks.threads("n_threads", 9)


def test_struct_field_ranges() -> None:
    from llama_cpp.llama_cpp import llama_context_params

    assert _checks.struct_field(llama_context_params, "n_ctx", 2**32 - 1) == 2**32 - 1
    with pytest.raises(ParameterError, match="n_batch=-1 is out of range"):
        _checks.struct_field(llama_context_params, "n_batch", -1)
    with pytest.raises(ParameterError, match="must be an integer"):
        _checks.struct_field(llama_context_params, "n_ctx", 1.5)
