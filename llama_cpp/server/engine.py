"""The engines that run requests for one model: continuous batching over slots, or one at a time.

:class:`SlotEngine` owns a :class:`~llama_cpp.Llama` created with ``n_seq_max = n_slots`` and a
KV cache of ``n_ctx`` tokens per slot (unified, so a slot may use any free cells). One scheduler
thread loops:

1. admit waiting requests into free slots (each gets its own sampler chain and grammar, primed
   with its prompt as ``Llama`` does);
2. build ONE ``llama_batch``: the pending token of every generating slot, then prompt chunks of
   prefilling slots within what is left of ``n_batch``;
3. decode it once, sample each slot at its own output row, turn tokens into text (UTF-8 safe,
   stop strings, logprobs: the same :class:`~llama_cpp._generation.loop.TextStream` every path uses)
   and hand chunks to the request's event loop;
4. free finished or cancelled slots at once (their sequence removed from the KV cache).

A request's greedy output is the one ``Llama.create_completion`` gives for it alone: the same
prompt tokens, sampler chain, limits and chunk rendering.

With a :class:`~llama_cpp.speculative.slots.SlotSpeculation` (n-gram types, ``draft-simple``, ``draft-mtp``
with one NextN head, upstream's prompt lookup) step 2 adds each generating slot's draft after its pending token, all rows outputs;
step 3 picks at those rows in turn while they match the draft, removes the rejected rows from the
slot's sequence and hands the kept tokens to the same per-token code, so the output is unchanged.

:class:`SerialEngine` runs one request at a time through ``Llama`` itself (the drafts fed extracted
target layers, chained NextN heads, image chat, embedding models, or ``n_parallel=0``). Both bound their waiting queue: :class:`QueueFull`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .._errors import DecodeError
from .._generation import sampling as _sampling
from .._generation.loop import Logprobs, TextStream, char_len
from ..llama import Llama
from ..llama_grammar import LlamaGrammar
from ..speculative.slots import remove_rejected, verify_rows

log = logging.getLogger("llama_cpp.server")


class QueueFull(Exception):
    """Every slot is busy and the waiting queue is full (HTTP 429)."""

    def __init__(self, retry_after: int = 1) -> None:
        super().__init__("the server is busy: every slot is generating and the queue is full; retry later")
        self.retry_after = retry_after


class ShuttingDown(Exception):
    """The engine no longer accepts requests (HTTP 503)."""


class Cancelled(Exception):
    """The request was cancelled by shutdown."""


class Job:
    """One request's channel from an engine thread to its asyncio handler.

    The engine calls :meth:`put` (any thread); the handler awaits :meth:`get`. Events are
    ``("started", None)``, ``("chunk", dict)``, ``("result", obj)``, ``("error", exc)`` and
    ``("end", None)``. :meth:`cancel` (a client went away) is seen by the engine at its next step.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.done = False
        self.interruptible = False  # a stream that interrupt_requests may end early
        self.owner: object = None  # the request this job is one choice of (its siblings never interrupt it)

    def put(self, kind: str, value: Any = None) -> None:
        try:
            self._loop.call_soon_threadsafe(self._deliver, kind, value)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled.set()

    def _deliver(self, kind: str, value: Any) -> None:
        """Runs in the job's event loop."""
        self._queue.put_nowait((kind, value))

    async def get(self, timeout: float | None = None) -> tuple[str, Any]:
        if timeout is None:
            return await self._queue.get()
        return await asyncio.wait_for(self._queue.get(), timeout)

    def cancel(self) -> None:
        self.cancelled.set()


class Outbox:
    """Events of one engine step, handed to each event loop in one call (one wake-up per step, not
    one per token and request)."""

    def __init__(self) -> None:
        self.items: list[tuple[Job, str, Any]] = []

    def put(self, job: Job, kind: str, value: Any = None) -> None:
        self.items.append((job, kind, value))

    def flush(self) -> None:
        if not self.items:
            return
        by_loop: dict[Any, list[tuple[Job, str, Any]]] = {}
        for item in self.items:
            by_loop.setdefault(item[0]._loop, []).append(item)
        self.items = []
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver_all, items)
            except RuntimeError:  # that loop is closed: nobody is listening any more
                for job, _, _ in items:
                    job.cancelled.set()


def _deliver_all(items: list[tuple[Job, str, Any]]) -> None:
    for job, kind, value in items:
        job._deliver(kind, value)


@dataclasses.dataclass
class GenRequest:
    """One completion for the slot engine: the prompt as tokens and everything sampling needs."""

    prompt_tokens: list[int]
    max_tokens: int
    sampling: dict[str, Any]  # keyword arguments of Llama._make_sampler
    grammar: LlamaGrammar | None = None
    stop: list[str] = dataclasses.field(default_factory=list)
    logprobs: int | None = None
    echo: bool = False
    completion_id: str = ""
    created: int = 0
    model_name: str = ""
    prompt_chars: int | None = None  # the text prompt's length: logprob offsets start after it


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.nonzero(np.asarray(a[:n]) != np.asarray(b[:n]))[0]
    return int(diff[0]) if diff.size else n


def completion_chunk(req: GenRequest, data: bytes, reason: str | None, lps: Any) -> dict[str, Any]:
    """A ``text_completion`` chunk, shaped as :func:`llama_cpp._generation.loop.completion_chunks` makes them."""
    return {"id": req.completion_id, "object": "text_completion", "created": req.created, "model": req.model_name,
            "choices": [{"text": data.decode("utf-8", errors="ignore"), "index": 0, "logprobs": lps,
                         "finish_reason": reason}]}


class _Slot:
    __slots__ = ("seq", "job", "req", "chain", "grammar", "pick", "text", "lp", "pending", "n_fed", "pos",
                 "next_tok", "produced", "n_gen", "t_start", "t_first", "kv", "n_cached", "chars", "spec",
                 "replay", "end")

    def __init__(self, seq: int, job: Job, req: GenRequest) -> None:
        self.seq = seq
        self.job = job
        self.req = req
        self.chain: Any = None
        self.grammar: Any = None
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

    @property
    def prefilling(self) -> bool:
        return self.n_fed < self.end


class _Lifecycle:
    """Shutdown shared by both engines (their ``_cv``, ``_accepting``, ``_waiting``, ``_stop``,
    ``_thread`` and ``busy``); each says how to cancel what runs and what to free."""

    _cv: threading.Condition
    _accepting: bool
    _waiting: collections.deque[Any]
    _stop: bool
    _thread: threading.Thread

    @property
    def busy(self) -> int:
        raise NotImplementedError

    def _cancel_running(self) -> None:
        raise NotImplementedError

    def _free(self) -> None:
        raise NotImplementedError

    def drain(self, timeout: float) -> None:
        """Stop accepting, let running and queued requests finish for ``timeout`` s, cancel the rest."""
        with self._cv:
            self._accepting = False
        deadline = time.monotonic() + timeout
        while self.busy and time.monotonic() < deadline:
            time.sleep(0.02)
        with self._cv:
            for job, _ in self._waiting:
                job.put("error", Cancelled("the server shut down before this request started"))
            self._waiting.clear()
            self._cancel_running()
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=30)

    def close(self) -> None:
        if self._thread.is_alive():
            self.drain(0)
        if self._thread.is_alive():
            # still inside a decode after the join timeout: freeing the context now would pull it
            # out from under llama_decode; leaking it until exit is the safe choice
            log.error("the engine thread did not stop; its context is left allocated")
            return
        self._free()


class SlotEngine(_Lifecycle):
    """Continuous batching of up to ``n_slots`` requests on one context (see the module docstring)."""

    serial = False

    def __init__(self, llama: Llama, n_slots: int, n_ctx_slot: int, max_queue: int,
                 cache_prompt: bool = True, spec: Any = None) -> None:
        self.llama = llama
        self.model = llama._need_model()
        self.ctx = llama._need_ctx()
        if llama._need_ctx().n_seq_max() < n_slots:
            raise ValueError(f"the context holds {llama._need_ctx().n_seq_max()} sequences, fewer than {n_slots} slots")
        self.n_slots = n_slots
        self.n_ctx_slot = n_ctx_slot
        self.max_queue = max_queue
        self.n_batch = self.ctx.n_batch()
        from .._core.context import LlamaBatch

        self._batch = LlamaBatch(self.n_batch, 0, 1)
        # one struct over the batch's buffers, decoded with a raw llama_decode each step: the tokens
        # come from the samplers and from prompts checked against the vocabulary before they queue
        self._struct = self._batch.validated_view(self.ctx, 0, 0)
        self._decode = self.model._C.llama_decode
        self._cv = threading.Condition()
        self._waiting: collections.deque[tuple[Job, GenRequest]] = collections.deque()
        self._active: list[_Slot] = []
        self._free_seqs = list(range(n_slots - 1, -1, -1))
        self.cache_prompt = cache_prompt
        # what each free sequence still holds in the KV cache (its last request's tokens)
        self.cached: list[list[int]] = [[] for _ in range(n_slots)]
        self._accepting = True
        self._stop = False
        self.steps = 0
        self.tokens_generated = 0
        self._out = Outbox()
        self._is_eog: dict[int, bool] = {}
        self._pieces: dict[int, bytes] = {}
        # a SlotSpeculation (llama_cpp.speculative.slots): each step verifies every slot's draft (owned here)
        self.spec = spec
        self._h: Any = None  # the NextN rows of the last target decode (an MTP-drafting engine)
        self._thread = threading.Thread(target=self._run, name="llama-slots", daemon=True)
        self._thread.start()

    @property
    def capacity(self) -> int:
        """Generations that can be running or waiting at once."""
        return self.n_slots + self.max_queue

    # -- the request side ---------------------------------------------------------------------
    def submit(self, job: Job, req: GenRequest) -> None:
        """Queue ``req``; raises :class:`QueueFull` at once when no slot and no queue place is free."""
        with self._cv:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down")
            if len(self._active) + len(self._waiting) >= self.n_slots + self.max_queue:
                self._purge()
                if len(self._active) + len(self._waiting) >= self.n_slots + self.max_queue:
                    raise QueueFull(retry_after=1)
            self._waiting.append((job, req))
            self._cv.notify()

    def submit_many(self, items: list[tuple[Job, GenRequest]]) -> None:
        """Queue several requests all or nothing (the choices of one HTTP request)."""
        with self._cv:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down")
            if len(self._active) + len(self._waiting) + len(items) > self.n_slots + self.max_queue:
                self._purge()
                if len(self._active) + len(self._waiting) + len(items) > self.n_slots + self.max_queue:
                    raise QueueFull(retry_after=1)
            self._waiting.extend(items)
            self._cv.notify()

    def _purge(self) -> None:
        """Drop queued requests whose clients already left (caller holds the lock)."""
        self._waiting = collections.deque(w for w in self._waiting if not w[0].cancelled.is_set())

    def wake(self) -> None:
        with self._cv:
            self._cv.notify()

    @property
    def busy(self) -> int:
        with self._cv:
            return len(self._active) + len(self._waiting)

    def stats(self) -> dict[str, Any]:
        with self._cv:
            out: dict[str, Any] = {"engine": "slots", "slots": self.n_slots, "active": len(self._active),
                                   "waiting": len(self._waiting), "n_ctx_slot": self.n_ctx_slot}
            if self.spec is not None:
                st = self.spec.stats
                out["speculative"] = {"types": list(self.spec.types), "steps": st.steps, "generated": st.generated,
                                      "drafted": st.drafted, "accepted": st.accepted,
                                      "acceptance_rate": st.acceptance_rate, "drafted_by": dict(st.drafted_by),
                                      "accepted_by": dict(st.accepted_by)}
            return out

    def _cancel_running(self) -> None:
        for s in self._active:
            s.job.cancel()

    def _free(self) -> None:
        self._struct = None
        self._batch.close()
        if self.spec is not None:
            self.spec.close()
        self.llama.close()

    # -- the scheduler thread -----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._waiting and not self._active:
                    self._cv.wait()
                if self._stop:
                    for s in list(self._active):
                        self._finish_cancelled(s)
                    self._out.flush()
                    return
                admitted = []
                while self._waiting and self._free_seqs:
                    job, req = self._waiting.popleft()
                    if job.cancelled.is_set():
                        continue
                    admitted.append(_Slot(self._take_seq(req.prompt_tokens), job, req))
            try:
                for s in admitted:
                    self._start(s)
                for s in [s for s in self._active if s.job.cancelled.is_set()]:
                    self._finish_cancelled(s)
                if self._active:
                    self._step()
            except Exception as exc:  # a failed decode ends every running request, never the scheduler
                log.exception("decode step failed")
                for s in list(self._active):
                    self._out.put(s.job, "error", exc)
                    try:
                        self._release(s)
                    except Exception:  # noqa: BLE001 - the memory is cleared below anyway
                        with self._cv:
                            if s in self._active:
                                self._active.remove(s)
                self.ctx.memory_clear(True)
                self.cached = [[] for _ in range(self.n_slots)]
            self._out.flush()

    def _take_seq(self, prompt: list[int]) -> int:
        """The free sequence whose cached tokens share the longest prefix with ``prompt``, the lowest id among
        equals (caller holds the lock): busy sequences stay numbered from 0 up, which recurrent memory
        decodes in one micro-batch (see :meth:`_step`)."""
        free = self._free_seqs
        best, best_key = len(free) - 1, (-1, 0)
        for k, seq in enumerate(free):
            key = (_common_prefix(self.cached[seq], prompt) if self.cache_prompt else 0, -seq)
            if key > best_key:
                best, best_key = k, key
        return free.pop(best)

    def _start(self, s: _Slot) -> None:
        req = s.req
        try:
            s.chain = self.llama._make_sampler(**req.sampling)
            s.grammar = _sampling.grammar_sampler(self.model, req.grammar)
            _sampling.prime_penalties(s.chain, req.prompt_tokens, self.llama.last_n_tokens_size,
                                      self.llama.sampling_convention)
            want_lp = req.logprobs is not None and req.logprobs >= 0
            s.pick = _sampling.token_picker(self.model, s.chain, s.grammar, want_lp)
            if self.spec is not None:
                s.spec = self.spec.start(req.prompt_tokens[:-1])  # the last token stays pending (_pend_last)
            s.lp = Logprobs(self.model, req.logprobs)
            if req.echo or (want_lp and req.prompt_chars is None):
                head = self.model.detokenize(req.prompt_tokens)
                s.chars = char_len(head)
                if req.echo:
                    s.text = TextStream(req.stop, head)
            else:
                s.chars = req.prompt_chars or 0
            self._reuse_prefix(s)
            if s.spec is not None:
                s.end -= 1
                if s.n_fed == s.end:  # everything before the last token is cached already
                    self._pend_last(s)
        except Exception as exc:
            self._out.put(s.job, "error", exc)
            self._release(s, active=False)
            return
        with self._cv:
            self._active.append(s)
        self._out.put(s.job, "started")

    def _reuse_prefix(self, s: _Slot) -> None:
        """Keep the part of the sequence's KV that the new prompt starts with (at least its last token is
        evaluated again, for its logits); memory that cannot drop a suffix (recurrent) starts over."""
        prompt = s.req.prompt_tokens
        cached = self.cached[s.seq]
        keep = min(_common_prefix(cached, prompt), len(prompt) - 1) if self.cache_prompt else 0
        mtp = self.spec.mtp if self.spec is not None else None
        if mtp is not None:  # the MTP head needs h_{keep-1}: where it is not kept, that token is decoded again
            keep = mtp.reuse(s.seq, keep)
        if keep < len(cached):
            if keep == 0 or not self.ctx.seq_rm(s.seq, keep, -1):
                self.ctx.seq_rm(s.seq, -1, -1)
                keep = 0
        if mtp is not None:
            mtp.restart(s.seq, keep)
        self.cached[s.seq] = []
        s.n_fed = keep
        s.kv = list(prompt)
        s.n_cached = keep

    def _pend_last(self, s: _Slot) -> None:
        """The prompt but its last token is in the memory: that token is the slot's pending one."""
        prompt = s.req.prompt_tokens
        s.kv = list(prompt[:-1])
        s.pos = s.end
        s.next_tok = prompt[-1]

    def _step(self) -> None:
        batch = self._batch
        batch.clear()
        tok_arr, pos_arr, seq_arr, nseq_arr, logit_arr = (batch.token_arr, batch.pos, batch.seq_ids,
                                                          batch.n_seq_id, batch.logits)
        outputs: list[tuple[_Slot, int]] = []
        # speculating slots: (slot, row of its pending token, its draft, the drafter, that token's position)
        verifies: list[tuple[_Slot, int, list[int], Any, int]] = []
        drafts = self._drafts() if self.spec is not None else {}
        ckpts = self.spec.checkpoints if self.spec is not None else None
        mtp = self.spec.mtp if self.spec is not None else None
        # rows whose NextN hidden states the MTP head pairs with their tokens: (seq, position, tokens, first row)
        mtp_rows: list[tuple[int, int, list[int], int]] = []
        n = 0
        # rows in sequence order: recurrent memory puts only consecutive sequence ids (0, 1, 2, ...) into one
        # micro-batch (llama.cpp's sequential split_equal), so any other order decodes a slot at a time
        for s in sorted(self._active, key=lambda s: s.seq):
            if s.next_tok is not None:
                if s.replay:
                    r = len(s.replay)
                    rows = slice(n, n + r)
                    tok_arr[rows] = s.replay
                    pos_arr[rows] = np.arange(s.pos - r, s.pos)
                    seq_arr[rows, 0] = s.seq
                    nseq_arr[rows] = 1
                    logit_arr[rows] = 0
                    n += r
                tok_arr[n] = s.next_tok
                pos_arr[n] = s.pos
                seq_arr[n, 0] = s.seq
                nseq_arr[n] = 1
                logit_arr[n] = 1
                draft, src = drafts.get(s.seq, (None, None))
                if draft:
                    if ckpts is not None:  # the recurrent state before this step's rows (replay included)
                        ckpts[s.seq].save()
                    k = len(draft)
                    rows = slice(n + 1, n + 1 + k)
                    tok_arr[rows] = draft
                    pos_arr[rows] = np.arange(s.pos + 1, s.pos + 1 + k)
                    seq_arr[rows, 0] = s.seq
                    nseq_arr[rows] = 1
                    logit_arr[rows] = 1
                    verifies.append((s, n, draft, src, s.pos - len(s.replay)))
                    n += k
                else:
                    outputs.append((s, n))
                    if mtp is not None:
                        mtp_rows.append((s.seq, s.pos, [s.next_tok], n))
                s.replay = []
                s.kv.append(s.next_tok)
                s.pos += 1
                s.next_tok = None
                n += 1
        batch.n_tokens = n
        budget = self.n_batch - n
        for s in self._active:
            if budget <= 0:
                break
            if s.prefilling:
                prompt = s.req.prompt_tokens
                chunk = prompt[s.n_fed:min(s.n_fed + budget, s.end)]
                last = s.n_fed + len(chunk) == s.end
                first, k = batch.add_sequence(np.asarray(chunk, dtype=np.int32), s.seq, s.n_fed,
                                              logits="last" if last and s.spec is None else False)
                if mtp is not None:
                    mtp_rows.append((s.seq, s.n_fed, chunk, first))
                s.n_fed += k
                budget -= k
                if last and s.spec is not None:
                    self._pend_last(s)  # decoded next step, with a draft
                elif last:
                    s.pos = len(prompt)
                    outputs.append((s, first + k - 1))
        if batch.n_tokens == 0:
            return
        self._struct.n_tokens = batch.n_tokens
        rc = int(self._decode(self.ctx.ptr, self._struct))
        if rc != 0:
            raise DecodeError(f"llama_decode returned {rc} for a batch of {batch.n_tokens} tokens "
                              f"({len(self._active)} requests)")
        self.steps += 1
        if mtp is not None:
            self._h = mtp.target_rows(batch.n_tokens)
            for seq, p0, toks, first in mtp_rows:
                mtp.commit_rows(seq, p0, toks, self._h[first:first + len(toks)])
        for s, first, draft, src, pos0 in verifies:
            try:
                self._verify(s, first, draft, src, pos0)
            except Exception as exc:  # this request's sampler, grammar or hook: it alone ends
                log.warning("request in slot %d failed: %s", s.seq, exc)
                self._out.put(s.job, "error", exc)
                if s in self._active:
                    self._release(s)
        for s, i in outputs:
            try:
                if s.spec is not None:
                    self.spec.accepted(s.spec, None, 0, 0, 1)  # a step without a draft
                tok, row = s.pick(self.ctx, i)
                self._accept(s, tok, None if row is None else np.array(row))
            except Exception as exc:  # this request's sampler, grammar or hook: it alone ends
                log.warning("request in slot %d failed: %s", s.seq, exc)
                self._out.put(s.job, "error", exc)
                if s in self._active:
                    self._release(s)

    def _drafts(self) -> dict[int, tuple[list[int], Any]]:
        """Each generating slot's draft for this step (by sequence), within the context and the batch."""
        # a slot replaying rolled-back tokens drafts again once they are in the memory (a checkpoint is taken
        # before a step's rows, so drafting now would grow the replay with every rejection)
        gen = [s for s in self._active if s.next_tok is not None and s.spec is not None and not s.replay]
        if not gen:
            return {}
        n_rows = sum(1 + len(s.replay) for s in self._active if s.next_tok is not None)
        share = (self.n_batch - n_rows) // len(gen)
        items = []
        for s in gen:
            # the last draft row stays inside the slot's context and within max_tokens, as plain decoding stops
            k_max = min(self.spec.n_max, share, self.n_ctx_slot - 1 - s.pos, s.req.max_tokens - s.produced - 1)
            items.append((s.spec, s.seq, s.kv, s.next_tok, max(0, k_max)))
        return {s.seq: d for s, d in zip(gen, self.spec.propose(items))}

    def _verify(self, s: _Slot, first: int, draft: list[int], src: Any, start: int) -> None:
        """Slot ``s``'s verify rows (from position ``start``: its replayed tokens, its pending token, its
        draft): pick at each draft row until the draft is left, roll the rejected rows back, then hand
        the tokens to :meth:`_accept` one by one, as plain steps would."""
        pos0 = s.pos - 1  # the pending token's position
        toks, rows, n_acc = verify_rows(s.pick, self.ctx, first, draft, self._eog)
        n_keep = len(toks)  # the pending token and the accepted drafts: rows pos0..pos0+n_keep-1 hold
        mtp = self.spec.mtp
        if mtp is not None:  # kept rows' NextN states, read before a checkpoint restore
            mtp.commit_rows(s.seq, pos0, [s.kv[pos0], *toks[:n_keep - 1]], self._h[first:first + n_keep])
        replay: list[int] = []
        rollback = None
        if n_keep < len(draft) + 1:
            ckpts = self.spec.checkpoints
            if ckpts is None:
                remove_rejected(self.ctx, s.seq, pos0 + n_keep)
                rollback = "partial"
            else:
                # back to the state before this step's rows; the kept ones are decoded again next step
                ckpts[s.seq].restore()
                remove_rejected(self.ctx, s.seq, start)
                replay = s.kv[start:] + toks[:n_keep - 1]
                rollback = "checkpoint"
        self.spec.accepted(s.spec, src, len(draft), n_acc, n_keep, rollback, len(replay))
        for j, tok in enumerate(toks):
            if j:
                s.kv.append(toks[j - 1])  # the accepted draft token at this row is in the memory
                s.pos += 1
                s.next_tok = None
            self._accept(s, tok, rows[j])
            if s.job.done:
                break
        held = start if replay else pos0 + n_keep  # positions the memory holds now
        if not s.job.done:
            s.replay = replay
        elif s.pos < held and not self.ctx.closed:
            # finished before its last accepted rows: they must not outlive the request in the cache
            if not self.ctx.seq_rm(s.seq, s.pos, -1):
                self.ctx.seq_rm(s.seq, -1, -1)
                self.cached[s.seq] = []
        elif s.pos > held:
            self.cached[s.seq] = self.cached[s.seq][:held]

    def _eog(self, tok: int) -> bool:
        eog = self._is_eog.get(tok)
        if eog is None:
            eog = self._is_eog[tok] = bool(self.model.is_eog(tok))
        return eog

    def _accept(self, s: _Slot, tok: int, row: np.ndarray | None) -> None:
        """One sampled token of slot ``s``: text, chunks, and whether the slot goes on."""
        req = s.req
        s.produced += 1
        self.tokens_generated += 1
        if s.produced == 1:
            s.t_first = time.perf_counter()
        # per-token lookups from Python dicts: each native call would hand the GIL to the event loop
        eog = self._is_eog.get(tok)
        if eog is None:
            eog = self._is_eog[tok] = bool(self.model.is_eog(tok))
        if eog:
            self._finish(s, "stop")
            return
        s.n_gen += 1
        piece = self._pieces.get(tok)
        if piece is None:
            piece = self._pieces[tok] = self.model.token_to_piece(tok)
        if s.lp.enabled:
            s.pending.append((tok, row, s.chars))
            s.chars += char_len(piece)
        out = s.text.push(piece)
        if s.text.stopped:
            self._finish(s, "stop")
            return
        if out:
            self._out.put(s.job, "chunk", completion_chunk(req, out, None, s.lp.block(s.pending)))
            s.pending = []
        if s.produced >= req.max_tokens or s.pos >= self.n_ctx_slot:
            self._finish(s, "length")
            return
        s.next_tok = tok

    def _finish(self, s: _Slot, reason: str) -> None:
        req = s.req
        final = completion_chunk(req, s.text.rest(), reason, s.lp.block(s.pending))
        n_prompt = len(req.prompt_tokens)
        final["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": s.n_gen,
                          "total_tokens": n_prompt + s.n_gen}
        now = time.perf_counter()
        gen_s = now - s.t_first if s.t_first else 0.0
        final["timings"] = {"prompt_ms": 1000 * ((s.t_first or now) - s.t_start), "predicted_ms": 1000 * gen_s,
                            "predicted_n": s.n_gen, "slot": s.seq}
        final["usage"]["prompt_tokens_cached"] = s.n_cached
        if s.spec is not None:
            final["usage"]["speculative"] = s.spec.stats.as_dict()
        self._out.put(s.job, "chunk", final)
        self._out.put(s.job, "end")
        self._release(s, keep_cache=True)

    def _finish_cancelled(self, s: _Slot) -> None:
        self._out.put(s.job, "error", Cancelled("the request was cancelled"))
        self._release(s)

    def _release(self, s: _Slot, active: bool = True, keep_cache: bool = False) -> None:
        """Free the slot now and close its samplers. A finished request's tokens stay in the KV cache
        for a later prompt that starts with them (``cache_prompt``); a cancelled or failed one's
        sequence is removed at once."""
        if keep_cache and self.cache_prompt:
            self.cached[s.seq] = s.kv[:s.pos]
        else:
            self.cached[s.seq] = []
            try:
                self.ctx.seq_rm(s.seq, -1, -1)
            except Exception:  # the context is gone (shutdown): nothing left to free
                log.debug("seq_rm failed for slot %d", s.seq, exc_info=True)
        for smp in (s.chain, s.grammar):
            if smp is not None:
                smp.close()
        s.chain = s.grammar = s.pick = None
        s.job.done = True
        with self._cv:
            if active and s in self._active:
                self._active.remove(s)
            self._free_seqs.append(s.seq)


class SerialEngine(_Lifecycle):
    """One request at a time through ``Llama`` in a worker thread, behind a bounded queue.

    A work item is ``work(llama)`` returning a result object or an iterator of chunks; a
    cancelled job's iterator is closed at its next chunk. With ``interrupt`` (upstream's
    ``interrupt_requests``) a stream also ends, after its current chunk and without a final
    ``finish_reason``, as soon as another request is waiting; whole responses always finish.
    """

    serial = True

    def __init__(self, llama: Llama, max_queue: int, interrupt: bool = False) -> None:
        self.llama = llama
        self.max_queue = max_queue
        self.interrupt = interrupt
        self._cv = threading.Condition()
        self._waiting: collections.deque[tuple[Job, Callable[[Llama], Any]]] = collections.deque()
        self._running = 0
        self._current: Job | None = None
        self._accepting = True
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="llama-serial", daemon=True)
        self._thread.start()

    @property
    def capacity(self) -> int:
        """Requests that can be running or waiting at once."""
        return 1 + self.max_queue

    def submit(self, job: Job, work: Callable[[Llama], Any]) -> None:
        with self._cv:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down")
            if self._running + len(self._waiting) >= 1 + self.max_queue:
                raise QueueFull(retry_after=1)
            self._waiting.append((job, work))
            self._cv.notify()

    @property
    def busy(self) -> int:
        with self._cv:
            return self._running + len(self._waiting)

    def stats(self) -> dict[str, Any]:
        with self._cv:
            return {"engine": "serial", "slots": 1, "active": self._running, "waiting": len(self._waiting)}

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._waiting:
                    self._cv.wait()
                if self._stop:
                    return
                job, work = self._waiting.popleft()
                self._running = 1
                self._current = job
            try:
                if not job.cancelled.is_set():
                    self._execute(job, work)
            finally:
                job.done = True
                with self._cv:
                    self._running = 0
                    self._current = None

    def _execute(self, job: Job, work: Callable[[Llama], Any]) -> None:
        try:
            out = work(self.llama)
            if isinstance(out, Iterator):
                job.put("started")
                try:
                    for chunk in out:
                        if job.cancelled.is_set():
                            job.put("error", Cancelled("the request was cancelled"))
                            return
                        job.put("chunk", chunk)
                        if self.interrupt and job.interruptible and self._someone_else_waits(job):
                            break
                finally:
                    close = getattr(out, "close", None)
                    if close is not None:
                        close()
                job.put("end")
            else:
                job.put("result", out)
        except Exception as exc:
            job.put("error", exc)

    def _someone_else_waits(self, job: Job) -> bool:
        with self._cv:
            return any(not j.cancelled.is_set() and (j.owner is None or j.owner is not job.owner)
                       for j, _ in self._waiting)

    def _cancel_running(self) -> None:
        if self._current is not None:
            self._current.cancel()  # a running request sees it at its next chunk

    def _free(self) -> None:
        self.llama.close()


def collect_stats_stream(llama: Llama, chunks: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """``chunks`` with the MTP decoder's statistics added to the last one's ``usage``."""
    last = None
    for c in chunks:
        if last is not None:
            yield last
        last = c
    if last is not None:
        st = llama.last_speculative_stats
        if st is not None and "usage" in last:
            last["usage"]["speculative"] = st.as_dict()
        yield last


__all__ = ["Cancelled", "GenRequest", "Job", "QueueFull", "SerialEngine", "ShuttingDown", "SlotEngine",
           "collect_stats_stream", "completion_chunk"]
