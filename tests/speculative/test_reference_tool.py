"""Greedy output equals ``llama-speculative-simple --spec-type <type> --temp 0`` of the same build."""

from __future__ import annotations

import pytest

from .util import config, spec_generate

PROMPTS = ("the cat sat on the mat and the dog sat on the log and the cat sat on the",
           "Once upon a time there was a test, and once upon a time there was")
N = 32


def _tool_args(spec_type: str, m: int, draft: str) -> list[object]:
    n = min(2, m)
    if spec_type == "ngram-simple":
        return ["--spec-ngram-simple-size-n", n, "--spec-ngram-simple-size-m", m]
    if spec_type in ("ngram-map-k", "ngram-map-k4v"):
        k = spec_type.removeprefix("ngram-")
        return [f"--spec-ngram-{k}-size-n", 2, f"--spec-ngram-{k}-size-m", m, f"--spec-ngram-{k}-min-hits", 1]
    if spec_type == "ngram-mod":
        return ["--spec-ngram-mod-n-match", 2, "--spec-ngram-mod-n-max", m, "--spec-ngram-mod-n-min", 1]
    if spec_type == "ngram-cache":
        return []
    return ["-md", draft, "--spec-draft-n-max", m]


def _generated_text(stdout: bytes, prompt: str) -> str:
    text = stdout.decode("utf-8", errors="replace").lstrip("\n")
    assert text.startswith(prompt), text[:200]
    return text[len(prompt):]


@pytest.mark.parametrize("target", ("bpe", "echo"))
@pytest.mark.parametrize("spec_type", ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
                                       "draft-simple"))
def test_matches_llama_speculative_simple(targets, target_path, draft_path, run_tool, target, spec_type):
    model = targets[target]
    draft = str(draft_path("noisy"))
    for p in PROMPTS:
        prompt = model.tokenize(p.encode(), add_special=True, parse_special=True)
        for m in (2, 8):
            cfg = config(spec_type, m, draft_model_path=draft) if spec_type != "ngram-cache" else config(spec_type)
            got, _ = spec_generate(model, prompt, N, cfg)
            mine = model.detokenize(got).decode("utf-8", errors="replace")
            need = len(p) + len(mine.strip())
            proc = run_tool("llama-speculative-simple", "-m", target_path(target), "--spec-type", spec_type,
                            *_tool_args(spec_type, m, draft), "--temp", "0", "-p", p, "-n", N, "-c", 512,
                            "-t", 1, "-tb", 1, "--seed", 1,
                            complete=lambda out, n=need: len(out.decode(errors="replace").strip()) >= n)
            theirs = _generated_text(proc.stdout, p)
            # the tool may overshoot -n by up to one draft; compare over our tokens
            assert theirs.startswith(mine), (target, spec_type, m, p, theirs[:200], mine[:200])


def _tool_counts(stderr: bytes) -> tuple[int, int, int]:
    import re

    err = stderr.decode(errors="replace")
    get = lambda key: int(re.search(key + r"\s*=\s*(\d+)", err).group(1))  # noqa: E731
    return get("n_predict"), get("n_drafted"), get("n_accept")


def _simulate_tool(model, drafters, prompt: list[int], greedy: list[int], n_predict: int, n_ctx: int):
    """llama-speculative-simple's loop over a known greedy continuation: (n_predict, n_drafted, n_accept)."""
    hist, id_last = list(prompt[:-1]), prompt[-1]
    for d in drafters:
        d.begin(hist)
    done = drafted = accepted = 0
    while True:
        budget = max(min(n_ctx - len(hist) - 2, n_predict - done - 1), 0)  # 0: no limit, as in the tool
        draft, src = [], None
        for d in drafters:
            if getattr(d, "takes_limit", False):
                got = d.draft(hist, id_last, budget if budget > 0 else None)
            else:
                got = d.draft(hist, id_last)
            if got:
                draft, src = list(got), d
                break
        if budget > 0:
            draft = draft[:budget]
        acc = 0
        while acc < len(draft) and draft[acc] == greedy[done + acc]:
            acc += 1
        if src is not None:
            src.accept(acc)
        ids = greedy[done:done + acc + 1]
        drafted, accepted, done = drafted + len(draft), accepted + acc, done + len(ids)
        for t in ids:
            hist.append(id_last)
            id_last = t
        if done > n_predict:
            return done, drafted, accepted


@pytest.mark.parametrize("spec_type", ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
                                       "draft-simple"))
@pytest.mark.parametrize("m", (4, 8))
def test_drafts_count_as_llama_cpp(targets, target_path, draft_path, run_tool, spec_type, m):
    """Driven by the tool's own loop (its draft budget included), our drafters (n-gram and draft
    model) draft and have accepted exactly as many tokens as llama.cpp's on the attention target
    (no checkpoints there)."""
    from llama_cpp.speculative import build_drafters, make_decoder

    from .util import CTX, plain_generate

    model = targets["bpe"]
    n = 96
    text = PROMPTS[0] + " " + PROMPTS[0]
    prompt = model.tokenize(text.encode(), add_special=True, parse_special=True)
    greedy = plain_generate(model, prompt, n + 16)
    draft = str(draft_path("echo"))
    cfg = config(spec_type, m, draft_model_path=draft) if spec_type != "ngram-cache" else config(spec_type)
    with make_decoder(model, cfg, ctx_params=dict(CTX)) as dec:  # the target context the draft model mirrors
        mine = _simulate_tool(model, build_drafters(model, cfg, dec.target), prompt, greedy, n, 512)
    proc = run_tool("llama-speculative-simple", "-m", target_path("bpe"), "--spec-type", spec_type,
                    *_tool_args(spec_type, m, draft), "--temp", "0", "-p", text, "-n", n, "-c", 512,
                    "-t", 1, "-tb", 1, "--seed", 1)
    assert mine == _tool_counts(proc.stderr), (spec_type, m)
