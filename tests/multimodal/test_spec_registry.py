"""A speculative type added through the table alone (:func:`llama_cpp.speculative.registry.register`,
one row and a drafter class written here): ``SpecConfig`` accepts its name and it runs through
``Llama``, the media decoder (multimodal chat) and a server slot, with plain decoding's tokens.

The target is ``qwen35_mtp(form="echo")``, whose next token depends only on the current one: the
toy drafter (the token that followed each token last time, chained) is then right once the cycle
has been seen.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence

import pytest

from llama_cpp.speculative import SpecConfig, registry
from llama_cpp.speculative.drafter import Drafter, DrafterBase

TOY = "toy-bigram"
KW = {"n_ctx": 512, "n_batch": 128, "n_ubatch": 128, "n_threads": 1, "n_threads_batch": 1, "verbose": False}
PROMPT = "one two three one two three one two"
GREEDY = {"temperature": 0.0, "top_k": 40, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
          "frequency_penalty": 0.0, "presence_penalty": 0.0, "penalty_last_n": None, "mirostat_mode": 0,
          "mirostat_tau": 5.0, "mirostat_eta": 0.1, "seed": None, "logit_bias": None}


class BigramDrafter(DrafterBase):
    """Drafts the chain of "the token that followed this one last time" from the pending token."""

    kind = TOY

    def __init__(self, n_max: int) -> None:
        self.n_max = n_max

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def draft(self, prompt: list[int], id_last: int) -> list[int]:
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
        pass


@pytest.fixture
def toy():
    registry.register(registry.TypeSpec(registry.CustomType(TOY), lambda a: BigramDrafter(a.config.draft_n_max)))
    try:
        yield SpecConfig(TOY, draft_n_max=4)
    finally:
        registry.unregister(TOY)
    assert registry.find(TOY) is None


def test_the_row_is_a_type(toy):
    assert isinstance(BigramDrafter(2), Drafter)
    assert [t.value for t in toy.types] == [TOY] and toy.n_max == 4 and not toy.needs_nextn


def test_llama_runs_the_toy_type(toy, qwen35_echo):
    from llama_cpp.llama import Llama

    with Llama(str(qwen35_echo), **KW) as plain, Llama(str(qwen35_echo), speculative=toy, **KW) as spec:
        ref = plain.create_completion(PROMPT, max_tokens=120, temperature=0)
        got = spec.create_completion(PROMPT, max_tokens=120, temperature=0)
        assert got["choices"][0]["text"] == ref["choices"][0]["text"]
        st = spec.last_speculative_stats
        assert st.accepted_by.get(TOY, 0) > 0 and st.generated == got["usage"]["completion_tokens"]


def test_the_media_decoder_runs_the_toy_type(toy, qwen35_echo, mmproj_vision, png_path):
    from llama_cpp.mtmd_chat import MultimodalChat

    url = "data:image/png;base64," + base64.b64encode(png_path.read_bytes()).decode()
    msgs = [{"role": "user", "content": [{"type": "text", "text": PROMPT},
                                         {"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "one two three"}]}]
    ctx = {"n_ctx": 512, "n_batch": 64, "n_threads": 1}
    with MultimodalChat(qwen35_echo, mmproj_vision, **ctx) as chat:
        ref = list(chat.generate_tokens(msgs, max_tokens=120, temperature=0))
    with MultimodalChat(qwen35_echo, mmproj_vision, speculative=toy, **ctx) as chat:
        got = list(chat.generate_tokens(msgs, max_tokens=120, temperature=0))
        st = chat.last_speculative_stats
    assert got == ref
    assert st.accepted_by.get(TOY, 0) > 0


def _serve(llama, spec, prompt: list[int]) -> str:
    from llama_cpp.server.engine import GenRequest, Job, SlotEngine

    from ..engine_jobs import job_text

    async def run() -> str:
        engine = SlotEngine(llama, 2, 256, 4, spec=spec)
        try:
            job = Job()
            engine.submit(job, GenRequest(prompt_tokens=prompt, max_tokens=120, sampling=GREEDY))
            return await job_text(job)
        finally:
            engine.close()

    return asyncio.run(run())


def test_a_server_slot_runs_the_toy_type(toy, qwen35_echo):
    from llama_cpp.llama import Llama
    from llama_cpp.speculative.slots import SlotSpeculation, slot_unsupported

    assert slot_unsupported(toy) is None
    kw = {**KW, "n_seq_max": 2, "kv_unified": True}
    with Llama(str(qwen35_echo), **kw) as llama:
        prompt = llama.tokenize(PROMPT.encode())
        ref = _serve(llama, None, prompt)
    with Llama(str(qwen35_echo), **kw) as llama:
        spec = SlotSpeculation(llama.model, llama.ctx, 2, config=toy)
        got = _serve(llama, spec, list(prompt))
        assert spec.stats.accepted_by.get(TOY, 0) > 0
    assert got == ref and got
