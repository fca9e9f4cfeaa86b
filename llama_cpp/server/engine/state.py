"""One slot's state while it serves a request (sequence, samplers, text, KV tokens, drafts)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..._generation.loop import Logprobs, TextStream
from .jobs import GenRequest, Job


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.nonzero(np.asarray(a[:n]) != np.asarray(b[:n]))[0]
    return int(diff[0]) if diff.size else n


class Slot:
    __slots__ = ("seq", "job", "req", "chain", "grammar", "special", "pick", "text", "lp", "pending", "n_fed", "pos",
                 "next_tok", "produced", "n_gen", "t_start", "t_first", "kv", "n_cached", "chars", "spec",
                 "replay", "end", "stop_len", "ckpt_at", "ckpts")

    def __init__(self, seq: int, job: Job, req: GenRequest) -> None:
        self.seq = seq
        self.job = job
        self.req = req
        self.chain: Any = None
        self.grammar: Any = None
        self.special: frozenset[int] = frozenset()  # control tokens detokenized as text (the grammar's)
        self.pick: Any = None
        self.text = TextStream(req.stop)
        self.lp: Logprobs | None = None
        self.pending: list[tuple[int, np.ndarray | None, int]] = []
        self.n_fed = 0  # prompt tokens already in the KV cache
        self.pos = 0  # position of the next token to decode
        self.next_tok: int | None = None  # sampled, not decoded yet
        self.produced = 0
        self.n_gen = 0
        self.t_start = time.perf_counter()
        self.t_first = 0.0
        self.kv: list[int] = []  # the tokens this sequence holds in the KV cache, in order
        self.n_cached = 0  # prompt tokens reused from the previous request on this sequence
        self.chars = 0  # characters of prompt + text before the next token (logprob offsets)
        self.spec: Any = None  # the request's drafters (a speculating engine)
        # tokens before next_tok that a checkpoint rollback took out of the memory: decoded again next step
        self.replay: list[int] = []
        # where prefill stops: a speculating slot leaves the prompt's last token pending, so that its
        # first step verifies a draft made right after the prompt (as the serial decoders do)
        self.end = len(req.prompt_tokens)
        # the longest stop string in bytes: that many bytes before each push find which stop hit
        self.stop_len = max((len(x.encode("utf-8")) for x in req.stop if x), default=0)
        # recurrent memory: where prefill pauses for a context checkpoint (-1: none), and the
        # checkpoints of this sequence's tokens, (n_tokens, recurrent state)
        self.ckpt_at = -1
        self.ckpts: list[Any] = []

    @property
    def prefilling(self) -> bool:
        return self.n_fed < self.end


def stop_word(stops: list[bytes], window: bytes, at: int) -> str | None:
    """Which stop string starts at offset ``at`` of ``window`` (the bytes around a push that hit one)."""
    rest = window[max(at, 0):]
    for s in stops:
        if rest.startswith(s):
            return s.decode("utf-8", errors="replace")
    return None


__all__ = ["Slot", "common_prefix", "stop_word"]
