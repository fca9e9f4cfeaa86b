"""A ``PER_SEQUENCE`` type added through the table alone (one row, a drafter written here) runs in the
server's slots: one drafter per slot sequence, kept between requests, told after every target decode
the tokens of its slot at their positions (prompt chunks, pending tokens, verify rows, replays). The
toy drafter keeps what it was told by position and drafts from it (the token that followed the
pending one last time), raising if a history it is asked to draft after disagrees with what it was
told: so a span handed to the wrong slot, at the wrong position or not at all fails the request.

The target is ``qwen35_mtp(form="echo")`` (hybrid: rejected rows roll back through checkpoints and
are decoded again), whose greedy output cycles: the toy drafts right once the cycle has been seen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from build_tools.fixtures import fixture_path
from llama_cpp.speculative import SpecConfig, registry
from llama_cpp.speculative.drafter import DrafterBase

TOY = "toy-observer"
KW = {"n_ctx": 1024, "n_batch": 128, "n_ubatch": 128, "n_threads": 1, "n_threads_batch": 1, "verbose": False,
      "n_seq_max": 4, "kv_unified": True}
GREEDY = {"temperature": 0.0, "top_k": 40, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
          "frequency_penalty": 0.0, "presence_penalty": 0.0, "penalty_last_n": None, "mirostat_mode": 0,
          "mirostat_tau": 5.0, "mirostat_eta": 0.1, "seed": None, "logit_bias": None}
BUILT: list[Any] = []


class ObservingDrafter(DrafterBase):
    """Keeps the tokens the target decoded on its sequence by position; drafts the chain of what
    followed each token there."""

    kind = TOY
    observes = True

    def __init__(self, n_max: int, seq: int) -> None:
        self.n_max, self.seq = n_max, seq
        self.seen: list[int] = []
        self.observed = 0
        BUILT.append(self)

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def observe(self, tokens: Sequence[int], pos0: int, first: int = 0) -> None:
        assert pos0 <= len(self.seen), (pos0, len(self.seen))
        del self.seen[pos0:]  # the target dropped everything from pos0 on
        self.seen.extend(int(t) for t in tokens)
        self.observed += len(tokens)

    def draft(self, prompt: list[int], id_last: int) -> list[int]:
        n = len(prompt)
        if self.seen[:n] != list(prompt):
            raise AssertionError(f"slot {self.seq}: told {self.seen[:n]}, the history is {prompt}")
        nxt = dict(zip(prompt, [*prompt[1:], id_last]))
        out: list[int] = []
        t = id_last
        while len(out) < self.n_max and t in nxt:
            t = nxt[t]
            out.append(t)
        return out

    def accept(self, n_accepted: int) -> None:
        pass

    def reset(self) -> None:
        self.seen.clear()


@pytest.fixture
def toy():
    BUILT.clear()
    registry.register(registry.TypeSpec(registry.CustomType(TOY),
                                        lambda a: ObservingDrafter(a.config.draft_n_max, a.seq),
                                        slots=registry.PER_SEQUENCE))
    try:
        yield SpecConfig(TOY, draft_n_max=4)
    finally:
        registry.unregister(TOY)


def _serve(llama: Any, spec: Any, rounds: list[list[list[int]]], n_slots: int = 4) -> list[list[str]]:
    """Each round's greedy completions (its prompts submitted at once) on one slot engine."""
    from llama_cpp.server.engine import GenRequest, Job, SlotEngine

    from ..engine_jobs import job_text

    async def one(engine: Any, prompt: list[int]) -> str:
        job = Job()
        engine.submit(job, GenRequest(prompt_tokens=prompt, max_tokens=60, sampling=GREEDY))
        return await job_text(job)

    async def run() -> list[list[str]]:
        engine = SlotEngine(llama, n_slots, 256, 8, spec=spec)
        try:
            return [list(await asyncio.gather(*(one(engine, p) for p in prompts))) for prompts in rounds]
        finally:
            engine.close()

    return asyncio.run(run())


def test_a_per_sequence_type_sees_every_span_of_its_slot(toy):
    from llama_cpp.llama import Llama
    from llama_cpp.speculative.slots import SlotSpeculation, slot_unsupported

    path = str(fixture_path("qwen35_mtp", form="echo"))
    assert slot_unsupported(toy) is None
    texts = [b"the cat sat on the mat and then", b"one two three one two three", b"Hello world", b"a"]
    with Llama(path, **KW) as llama:
        prompts = [llama.tokenize(t) for t in texts]
        ref = _serve(llama, None, [[p] for p in prompts])
    with Llama(path, **KW) as llama:
        spec = SlotSpeculation(llama.native_model(), llama.native_context(), 4, config=toy)
        assert [d.seq for d in BUILT] == [0, 1, 2, 3]  # one drafter per slot sequence, built once
        # a second round on the same drafters: their slots' histories change under them
        got, again = _serve(llama, spec, [prompts, prompts[::-1]])
        assert spec.stats.accepted_by.get(TOY, 0) > 0
        assert len(BUILT) == 4 and all(d.observed > 0 for d in BUILT)
    want = [r[0] for r in ref]
    assert got == want and again == want[::-1]
