"""A drafter that raises in a server slot (drafting, told a prompt, told what was accepted) ends only the
request(s) it drafts for: their stream
ends with an error naming the drafter and its exception, and the other slots of the step go on with
plain decoding's tokens. The failing drafter is a toy type added through the table (as
tests/multimodal/test_spec_registry.py adds one)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from build_tools.fixtures import fixture_path
from llama_cpp.speculative import SpecConfig, registry
from llama_cpp.speculative.drafter import DrafterBase
from llama_cpp.speculative.slots import DrafterFailed

from ..engine_jobs import job_text

TOY = "toy-failing"
KW = {"n_ctx": 512, "n_batch": 128, "n_ubatch": 128, "n_threads": 1, "n_threads_batch": 1, "verbose": False,
      "n_seq_max": 2, "kv_unified": True}
GOOD = "one two three one two three one two"
BAD = "seven eight nine seven eight nine seven eight"
GREEDY = {"temperature": 0.0, "top_k": 40, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
          "frequency_penalty": 0.0, "presence_penalty": 0.0, "penalty_last_n": None, "mirostat_mode": 0,
          "mirostat_tau": 5.0, "mirostat_eta": 0.1, "seed": None, "logit_bias": None}


class FailingBigram(DrafterBase):
    """The chain of "the token that followed this one last time"; raises for a history holding ``bad``."""

    kind = TOY

    def __init__(self, n_max: int, bad: int, where: str) -> None:
        self.n_max, self.bad, self.where = n_max, bad, where
        self.failing = False

    def begin(self, prompt: Sequence[int]) -> None:
        self.failing = self.bad in prompt
        if self.failing and self.where == "begin":
            raise RuntimeError("boom")

    def draft(self, prompt: list[int], id_last: int) -> list[int]:
        if self.failing and self.where == "draft":
            raise RuntimeError("boom")
        nxt = dict(zip(prompt, [*prompt[1:], id_last]))
        out: list[int] = []
        t = id_last
        while len(out) < self.n_max and t in nxt:
            t = nxt[t]
            out.append(t)
        return out

    def accept(self, n_accepted: int) -> None:
        if self.failing and self.where == "accept":
            raise RuntimeError("boom")

    def reset(self) -> None:
        pass


def _run(llama, spec, *rounds: list[list[int]]) -> list[list[str | BaseException]]:
    """Each round's prompts served at once by one two-slot engine (the rounds one after another): each
    job's text, or the error it ended with."""
    from llama_cpp.server.engine import GenRequest, Job, SlotEngine

    async def one(job) -> str | BaseException:
        try:
            return await job_text(job)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            return exc

    async def run() -> list[list[str | BaseException]]:
        engine = SlotEngine(llama, 2, 256, 4, spec=spec)
        out = []
        try:
            for prompts in rounds:
                jobs = [Job() for _ in prompts]
                engine.submit_many([(j, GenRequest(prompt_tokens=list(p), max_tokens=60, sampling=GREEDY))
                                    for j, p in zip(jobs, prompts)])
                out.append(list(await asyncio.gather(*(one(j) for j in jobs))))
            return out
        finally:
            engine.close()

    return asyncio.run(run())


@pytest.mark.parametrize("where", ["draft", "begin", "accept"])
@pytest.mark.parametrize("target", [("llama_bpe", {}), ("qwen35_mtp", {"form": "echo"})])
def test_a_failing_drafter_ends_only_its_request(target, where):
    from llama_cpp.llama import Llama
    from llama_cpp.speculative.slots import SlotSpeculation

    path = str(fixture_path(target[0], **target[1]))
    with Llama(path, **KW) as llama:
        good, bad = llama.tokenize(GOOD.encode()), llama.tokenize(BAD.encode())
        marker = next(t for t in bad if t not in good)
        ref = _run(llama, None, [good])[0][0]
    registry.register(registry.TypeSpec(registry.CustomType(TOY),
                                        lambda a: FailingBigram(a.config.draft_n_max, marker, where)))
    try:
        with Llama(path, **KW) as llama:
            spec = SlotSpeculation(llama.model, llama.ctx, 2, config=SpecConfig(TOY, draft_n_max=4))
            (got_good, got_bad), after = _run(llama, spec, [good, bad], [good])
            assert isinstance(got_bad, DrafterFailed), got_bad
            assert TOY in str(got_bad) and "RuntimeError: boom" in str(got_bad)
            assert isinstance(got_bad.__cause__, RuntimeError)
            assert got_good == ref and ref
            assert spec.stats.drafted_by.get(TOY, 0) > 0
            assert after == [ref]  # the engine serves on
    finally:
        registry.unregister(TOY)


@pytest.mark.parametrize("where", ["draft", "observe"])
def test_a_failing_nextn_drafter_ends_only_its_request(where):
    """draft-mtp's per-slot NextN drafter raising (in its draft decode, or reading the target's rows) ends
    the request of its slot alone, with a DrafterFailed naming draft-mtp; the other slot drafts on."""
    from llama_cpp.llama import Llama
    from llama_cpp.speculative.slots import SlotSpeculation

    path = str(fixture_path("qwen35_mtp", form="noisy"))
    with Llama(path, load_mtp=True, **KW) as llama:
        good, bad = llama.tokenize(GOOD.encode()), llama.tokenize(BAD.encode())
        marker = next(t for t in bad if t not in good)
        ref = _run(llama, None, [good])[0][0]
    with Llama(path, load_mtp=True, **KW) as llama:
        spec = SlotSpeculation(llama.model, llama.ctx, 2, config=SpecConfig("draft-mtp", draft_n_max=3))
        for ds in spec.seq_drafters:
            d = next(d for d in ds if d.kind == "draft-mtp")
            real = getattr(d, where)

            def failing(tokens, *args, real=real):
                if marker in tokens:
                    raise RuntimeError("boom")
                return real(tokens, *args)

            setattr(d, where, failing)
        (got_good, got_bad), after = _run(llama, spec, [good, bad], [good])
        assert isinstance(got_bad, DrafterFailed), got_bad
        assert "draft-mtp" in str(got_bad) and "RuntimeError: boom" in str(got_bad)
        assert got_good == ref and ref
        assert spec.stats.drafted_by.get("draft-mtp", 0) > 0
        assert after == [ref]  # the engine serves on
