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
