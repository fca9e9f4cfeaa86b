"""Several types in one configuration, against ``llama-speculative-simple --spec-type a,b`` of the same build.

llama.cpp (``common_speculative_init``) asks its types in a fixed priority order whatever order
``--spec-type`` lists them in, verifies the first non-empty draft, and credits it to that type.
Every draft-* type of a list runs on the one draft context llama.cpp creates, so a list holds at
most one of them; the rest are n-gram types. Compared: the greedy text, and per type the drafts,
drafted tokens and accepted tokens the tool reports.
"""

from __future__ import annotations

import pytest

from llama_cpp import SpeculativeError
from llama_cpp.speculative import SpecConfig

from ._tool import tool_drafted_tokens, tool_stats
from .util import CTX, config, greedy_sampler

N = 48
PROMPT = "the cat sat on the mat and the dog sat on the log and the cat sat on the mat and the dog sat on the"


def _tool_args(types: tuple[str, ...], m: int, draft: str | None) -> list[object]:
    out: list[object] = []
    for t in types:
        if t == "ngram-simple":
            out += ["--spec-ngram-simple-size-n", min(2, m), "--spec-ngram-simple-size-m", m]
        elif t in ("ngram-map-k", "ngram-map-k4v"):
            k = t.removeprefix("ngram-")
            out += [f"--spec-ngram-{k}-size-n", 2, f"--spec-ngram-{k}-size-m", m, f"--spec-ngram-{k}-min-hits", 1]
        elif t == "ngram-mod":
            out += ["--spec-ngram-mod-n-match", 2, "--spec-ngram-mod-n-max", m, "--spec-ngram-mod-n-min", 1]
        elif t.startswith("draft-"):
            out += ["--spec-draft-n-max", m] + (["-md", draft] if draft else [])
    return out


def _drive(dec, prompt: list[int], n: int) -> tuple[list[int], dict[str, int]]:
    """Generate as the tool does with ``-n n`` (each draft cut to ``n - done - 1``, no cut at 0 or
    less; stop after the step that passes ``n``); returns the tokens and the drafts per type."""
    st = dec.stats
    drafts: dict[str, int] = {}
    count = st.count_draft

    def counted(k: int, n_acc: int, kind: str | None = None) -> None:
        if k:
            drafts[kind] = drafts.get(kind, 0) + 1
        count(k, n_acc, kind)

    st.count_draft = counted
    dec.prefill(prompt)
    while st.generated <= n:
        budget = n - st.generated - 1
        gen = dec.generate(greedy_sampler(), budget + 1 if budget > 0 else 10 * n)
        next(gen)
        gen.close()
    return dec.history[len(prompt):], drafts


def _compare(model, model_path, types, m, run_tool, draft=None, ctx=None, **kw):
    from llama_cpp.speculative import make_decoder

    prompt = model.tokenize(PROMPT.encode(), add_special=True, parse_special=True)
    if "ngram-cache" in types:
        kw.setdefault("ngram_cache", {"n_draft": 8})  # llama.cpp's fixed draft length
    cfg = config(list(types), m, draft_model_path=draft, **kw)
    with make_decoder(model, cfg, ctx_params=dict(ctx or CTX)) as dec:
        got, drafts = _drive(dec, prompt, N)
        st = dec.stats
    mine = model.detokenize(got[:N]).decode("utf-8", errors="replace")
    proc = run_tool("llama-speculative-simple", "-m", model_path, "--spec-type", ",".join(types),
                    *_tool_args(types, m, draft), "-lv", 4, "--temp", "0", "-p", PROMPT, "-n", N,
                    "-c", (ctx or CTX)["n_ctx"], "-t", 1, "-tb", 1, "--seed", 1,
                    complete=lambda out, k=len(PROMPT) + len(mine.strip()): len(out.decode(errors="replace").strip()) >= k)
    text = proc.stdout.decode("utf-8", errors="replace").lstrip("\n")
    assert text.startswith(PROMPT) and text[len(PROMPT):].startswith(mine), (types, m, text[:300], mine[:300])
    for t in types:
        n_drafts, n_acc, _ = tool_stats(proc.stderr, t)
        theirs = (n_drafts, tool_drafted_tokens(proc.stderr, t), n_acc)
        assert (drafts.get(t, 0), st.drafted_by.get(t, 0), st.accepted_by.get(t, 0)) == theirs, (types, m, t, str(st))
    assert sum(drafts.values()) > 0 and len([t for t in types if drafts.get(t)]) >= 1
    return drafts


@pytest.mark.parametrize("types", [("ngram-simple", "ngram-mod"), ("ngram-mod", "ngram-map-k4v"),
                                   ("ngram-map-k", "draft-simple"), ("draft-simple", "ngram-cache"),
                                   ("ngram-cache", "ngram-simple", "ngram-map-k")])
@pytest.mark.parametrize("m", (4, 8))
def test_combined_types_match_llama_speculative_simple(targets, target_path, draft_path, run_tool, types, m):
    """Attention target (no checkpoints in either loop): same text, and per type the same drafts."""
    draft = str(draft_path("noisy")) if "draft-simple" in types else None
    drafts = _compare(targets["bpe"], target_path("bpe"), types, m, run_tool, draft=draft)
    if types == ("draft-simple", "ngram-cache"):
        assert drafts.get("ngram-cache", 0) > 0  # listed last, asked first


@pytest.fixture(scope="module")
def mtp_noisy():
    from build_tools.fixtures import fixture_path
    from llama_cpp.speculative import load_mtp_model

    path = fixture_path("qwen35_mtp", form="noisy")
    model = load_mtp_model(path)
    yield model, path
    model.close()


@pytest.mark.parametrize("types", [("ngram-simple", "draft-mtp"), ("draft-mtp", "ngram-mod")])
def test_ngram_with_mtp_matches_llama_speculative_simple(mtp_noisy, run_tool, types):
    """The MTP head drafts when the n-gram types have nothing (n-gram drafts no longer than the
    ``n_rs_seq`` snapshots both loops keep, so neither takes a checkpoint)."""
    model, path = mtp_noisy
    drafts = _compare(model, path, types, 3, run_tool)
    assert drafts.get("draft-mtp", 0) > 0


@pytest.mark.parametrize("types", [["draft-simple", "draft-mtp"], ["draft-mtp", "draft-simple"],
                                   "draft-eagle3,draft-mtp", ["draft-simple", "draft-dflash"],
                                   ["ngram-mod", "draft-dspark", "draft-eagle3"]])
def test_two_draft_types_are_refused(types):
    """llama.cpp hands its one draft context to every draft-* type of a list (draft-simple +
    draft-mtp fails there: the MTP context cannot decode plain tokens, or cannot be made over the
    draft model): refused here, before anything loads, with or without a draft file."""
    for path in (None, "draft.gguf"):
        with pytest.raises(SpeculativeError, match="cannot be combined: llama.cpp runs every draft-"):
            SpecConfig(types, draft_model_path=path)


@pytest.mark.parametrize("types", [["ngram-simple", "ngram-mod", "draft-mtp"], ["ngram-cache", "draft-simple"],
                                   ["ngram-map-k4v", "draft-eagle3"], ["ngram-simple", "draft-dspark"]])
def test_ngram_types_combine_with_one_draft_type(types):
    cfg = SpecConfig(types, draft_model_path="draft.gguf")
    assert set(cfg.types) == set(types)
