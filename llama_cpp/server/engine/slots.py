"""Continuous batching over slots.

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

With a :class:`~llama_cpp.speculative.slots.SlotSpeculation` (n-gram types, ``draft-simple``,
``draft-eagle3``, ``draft-dflash``, ``draft-dspark``, ``draft-mtp`` with one or several chained NextN
heads, upstream's prompt lookup) step 2 adds each generating slot's draft after its pending token, all rows outputs;
step 3 picks at those rows in turn while they match the draft, removes the rejected rows from the
slot's sequence and hands the kept tokens to the same per-token code, so the output is unchanged.
Drafters that read the target's per-token rows (layer features, NextN rows) are told, after the
decode, each span of their slot and its first batch entry.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

import numpy as np

from ..._core.context import LlamaBatch, LlamaBatchExtNative
from ..._errors import DecodeError
from ..._generation import sampling as _sampling
from ..._generation.loop import Logprobs, TextStream, char_len
from ...llama import Llama
from .counters import Counters
from .jobs import Cancelled, GenRequest, Job, Outbox, QueueFull, ShuttingDown, completion_chunk
from .lifecycle import Lifecycle
from .media import cells, decode_span, span_at, text_until, whole_spans
from .prompt_cache import CHECKPOINT_OFFSET, Checkpoint, PromptCache, plan, rewind, take_checkpoint
from .speculation import SlotSpeculating
from .state import Slot, common_prefix, stop_word

log = logging.getLogger("llama_cpp.server")


class SlotEngine(SlotSpeculating, Lifecycle):
    """Continuous batching of up to ``n_slots`` requests on one context (see the module docstring)."""

    serial = False

    def __init__(self, llama: Llama, n_slots: int, n_ctx_slot: int, max_queue: int,
                 cache_prompt: bool = True, spec: Any = None, cache_ram: int = 0,
                 slot_prompt_similarity: float = 0.0, lora: Any = None) -> None:
        self.llama = llama
        self.model = llama.native_model()
        self.ctx = llama.native_context()
        if llama.native_context().n_seq_max() < n_slots:
            raise ValueError(f"the context holds {llama.native_context().n_seq_max()} sequences, fewer than {n_slots} slots")
        self.n_slots = n_slots
        self.n_ctx_slot = n_ctx_slot
        self.max_queue = max_queue
        self.n_batch = self.ctx.n_batch()
        self._batch = LlamaBatch(self.n_batch, 0, 1)
        # one struct over the batch's buffers, decoded with a raw llama_decode each step: the tokens
        # come from the samplers and from prompts checked against the vocabulary before they queue
        self._struct = self._batch.validated_view(self.ctx, 0, 0)
        self._decode = self.model.bindings.llama_decode
        self._cv = threading.Condition()
        self._waiting: collections.deque[tuple[Job, GenRequest]] = collections.deque()
        self._active: list[Slot] = []
        self._free_seqs = list(range(n_slots - 1, -1, -1))
        self.cache_prompt = cache_prompt
        # what each free sequence still holds in the KV cache (its last request's tokens)
        self.cached: list[list[int]] = [[] for _ in range(n_slots)]
        self._last_used = [-1] * n_slots  # when each sequence last finished a request (LRU choice)
        self._uses = 0
        self.slot_prompt_similarity = slot_prompt_similarity
        # memory that cannot drop a suffix (recurrent, hybrid) reuses only whole saved states
        self._exact = bool(self.model.is_recurrent() or self.model.is_hybrid())
        # sliding-window attention drops cells a window behind the newest (unless swa_full): a prefix is
        # usable only while the window before its end is still there
        self._n_swa = 0 if getattr(self.ctx.params, "swa_full", False) else int(
            self.model.bindings.llama_model_n_swa(self.model.ptr))
        # their context checkpoints (recurrent memory): each sequence's, for the tokens in self.cached
        self.ckpts: list[list[Checkpoint]] = [[] for _ in range(n_slots)]
        # the states of prompts the slots gave up (cache_ram MiB, -1 no limit, 0 none); a drafter whose rows a
        # saved state does not hold (an MTP head's) reuses only its own slot's prefix
        self.prompt_cache: PromptCache | None = None
        # the model's LoRA adapters (server.lora.LoraSet): a step decodes the slots of one adapter set
        self.lora = lora if lora is not None and len(lora) else None
        self.cached_lora: list[tuple[float, ...]] = [() for _ in range(n_slots)]  # the set cached[seq] was made with
        self._lora_turn = 0
        # (a saved prompt state does not record the adapter set it was computed with: none are shared then)
        if cache_prompt and cache_ram != 0 and getattr(spec, "saved_prompts", True):
            self.prompt_cache = PromptCache(self.ctx, cache_ram, self._exact)
        # the last steps with prompt tokens (their prompt tokens, their seconds): what a prompt token costs,
        # against which the prompt cache weighs copying a state off the device (PromptCache.worth_saving)
        self._prefill_steps: collections.deque[tuple[int, float]] = collections.deque(maxlen=64)
        self._n_prefill = 0  # prompt tokens in the step being decoded
        self._accepting = True
        self._stop = False
        self.steps = 0  # llama_decode calls
        self.tokens_generated = 0
        self.counters = Counters()
        self._out = Outbox()
        self._is_eog: dict[int, bool] = {}
        self._pieces: dict[int, bytes] = {}
        # a SlotSpeculation (llama_cpp.speculative.slots): each step verifies every slot's draft (owned here)
        self.spec = spec
        self._ext_batch: Any = None  # media rows' batch (made on the first media prompt)
        self._thread = threading.Thread(target=self._run, name="llama-slots", daemon=True)
        self._thread.start()

    @property
    def capacity(self) -> int:
        """Generations that can be running or waiting at once."""
        return self.n_slots + self.max_queue

    @property
    def n_decode(self) -> int:
        """``llama_decode`` calls of the slots' batches and their media (llama-server's ``n_decode_total``)."""
        return self.steps

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
            if self.prompt_cache is not None:
                out["prompt_cache"] = self.prompt_cache.stats()
            return out

    def kv_tokens(self) -> int:
        """Tokens the KV cache holds: the running requests' and those kept for reuse."""
        with self._cv:
            return sum(min(len(s.kv), s.pos or s.n_fed) for s in self._active) + sum(len(c) for c in self.cached)

    def slots(self) -> list[dict[str, Any]]:
        """Each slot as llama-server's ``/slots`` lists it."""
        with self._cv:
            active = {s.seq: s for s in self._active}
            out = []
            for seq in range(self.n_slots):
                info: dict[str, Any] = {"id": seq, "n_ctx": self.n_ctx_slot, "speculative": self.spec is not None,
                                        "is_processing": seq in active}
                s = active.get(seq)
                if s is not None:
                    info.update({"id_task": s.req.completion_id, "n_prompt_tokens": len(s.req.prompt_tokens),
                                 "n_prompt_tokens_processed": s.n_fed - s.n_cached,
                                 "n_prompt_tokens_cache": s.n_cached,
                                 "next_token": [{"has_next_token": not s.job.done,
                                                 "n_remain": s.req.max_tokens - s.produced, "n_decoded": s.n_gen}]})
                else:
                    info["n_cached_tokens"] = len(self.cached[seq])
                out.append(info)
            return out

    def _cancel_running(self) -> None:
        for s in self._active:
            s.job.cancel()

    def _free(self) -> None:
        self._struct = None
        self._batch.close()
        if self._ext_batch is not None:
            self._ext_batch.close()
        if self.spec is not None:
            self.spec.close()
        if self.lora is not None:
            self.lora.close()
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
                    admitted.append(Slot(self._take_seq(req.prompt_tokens), job, req))
            try:
                for s in admitted:
                    self._start(s)
                for s in [s for s in self._active if s.job.cancelled.is_set()]:
                    self._finish_cancelled(s)
                if self._active:
                    t0 = time.perf_counter()
                    self._n_prefill = 0
                    self._step()
                    if self._n_prefill:
                        self._prefill_steps.append((self._n_prefill, time.perf_counter() - t0))
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
                self.ckpts = [[] for _ in range(self.n_slots)]
            self._out.flush()

    def _take_seq(self, prompt: list[int]) -> int:
        """The free sequence for ``prompt`` (caller holds the lock), as llama-server picks a slot: the one
        whose cached tokens cover the largest fraction of the prompt, above ``slot_prompt_similarity``
        (0: not by similarity); else the least recently used one (unused ones first), the lowest id among
        equals: busy sequences stay numbered from 0 up, which recurrent memory decodes in one
        micro-batch (see :meth:`_step`)."""
        free = self._free_seqs
        k_best = None
        if self.cache_prompt and self.slot_prompt_similarity > 0.0 and prompt:
            best_key: tuple[float, int] = (self.slot_prompt_similarity, 0)
            for k, seq in enumerate(free):
                if self.cached[seq]:
                    key = (common_prefix(self.cached[seq], prompt) / len(prompt), -seq)
                    if key > best_key:
                        k_best, best_key = k, key
        if k_best is None:
            k_best = min(range(len(free)), key=lambda k: (self._last_used[free[k]] if self.cache_prompt else 0,
                                                           free[k]))
        return free.pop(k_best)

    def _start(self, s: Slot) -> None:
        req = s.req
        try:
            s.chain = self.llama.make_sampler(**req.sampling)
            s.grammar = _sampling.grammar_sampler(self.model, req.grammar)
            s.special = _sampling.special_tokens(req.grammar)  # a chat template's preserved tokens, as text
            if not req.media:  # as the multimodal chat, whose penalties see the answer only
                _sampling.prime_penalties(s.chain, req.prompt_tokens, self.llama.last_n_tokens_size,
                                          self.llama.sampling_convention)
            want_lp = req.logprobs is not None and req.logprobs >= 0
            s.pick = _sampling.token_picker(self.model, s.chain, s.grammar, want_lp)
            if self.spec is not None:
                s.spec = self.spec.start(req.prompt_tokens[:-1], s.seq)  # the last token stays pending (_pend_last)
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

    def _reuse_prefix(self, s: Slot) -> None:
        """Keep the part of the sequence's memory that the new prompt starts with, or restore the saved
        state that covers more of it (the shared :class:`PromptCache`, the slot's own state saved first).
        Memory that cannot drop a suffix (recurrent) keeps a state that is all a prefix of the prompt, or
        rewinds to a context checkpoint, or starts over."""
        prompt = s.req.prompt_tokens
        pc = self.prompt_cache
        key = s.req.lora if self.lora is not None else ()  # states serve prompts under the same adapter scales
        had = self.cached_lora[s.seq] if self.lora is not None else ()  # the scales the slot's state was made with
        token_s = self._token_s() if pc is not None else None  # what a prompt token adds to a step here
        if self.lora is not None and had != key and self.cached[s.seq]:
            if pc is not None and pc.worth_saving(len(self.cached[s.seq]), token_s):
                # kept for a later request under those scales
                try:
                    pc.save(s.seq, self.cached[s.seq], self.ckpts[s.seq], key=had)
                except Exception:  # noqa: BLE001 - only an optimisation
                    log.warning("prompt cache: saving slot %d failed", s.seq, exc_info=True)
            self.ctx.seq_rm(s.seq, -1, -1)  # computed under other adapter scales: of no use to this request
            self.cached[s.seq], self.ckpts[s.seq] = [], []
            had = key
        cached, ckpts = self.cached[s.seq], self.ckpts[s.seq]
        keep, ckpt = plan(self._exact, cached, ckpts, prompt) if self.cache_prompt else (0, None)
        if pc is not None:
            try:
                saved = pc.best(prompt, keep, key)
                if saved is not None and not pc.worth_restoring(pc.usable(saved.tokens, prompt, saved.checkpoints)
                                                                - keep, token_s):
                    saved = None  # evaluating what it skips costs less than writing it back
                if saved is not None:
                    if cached and pc.worth_saving(len(cached), token_s):
                        pc.save(s.seq, cached, ckpts, pin=saved, key=had)  # this slot's prompt, before another takes it
                    if pc.restore(saved, s.seq):
                        cached, ckpts = saved.tokens, saved.checkpoints
                        keep, ckpt = plan(self._exact, cached, ckpts, prompt)
                        pc.restored_tokens += keep
                    else:
                        cached, ckpts, keep, ckpt = [], [], 0, None
                elif cached and keep < len(cached) / 2 and pc.worth_saving(len(cached), token_s):
                    pc.save(s.seq, cached, ckpts, key=had)  # most of it is about to go: kept for a later prompt
            except Exception:  # the cache is only an optimisation: the prompt is evaluated in full instead
                log.warning("prompt cache failed for slot %d; evaluating the prompt", s.seq, exc_info=True)
                self.ctx.seq_rm(s.seq, -1, -1)
                cached, ckpts, keep, ckpt = [], [], 0, None
        if ckpt is not None and not rewind(self.ctx, s.seq, ckpt):
            cached, keep = [], 0
        if s.req.media:
            keep = whole_spans(s.req.media, keep)
        if keep < len(cached):
            if keep == 0 or not self.ctx.seq_rm(s.seq, keep, -1):
                self.ctx.seq_rm(s.seq, -1, -1)
                keep = 0
        if keep > 0 and self._n_swa > 0 and self.ctx.seq_pos_min(s.seq) > max(0, keep - self._n_swa):
            self.ctx.seq_rm(s.seq, -1, -1)  # the window before the kept prefix is gone: evaluate it all
            keep = 0
        self.cached[s.seq], self.ckpts[s.seq] = [], []
        s.n_fed = keep
        s.kv = list(prompt)
        s.n_cached = keep
        if self._exact and self.cache_prompt:
            s.ckpts = [c for c in ckpts if c[0] <= keep]
            at = len(prompt) - CHECKPOINT_OFFSET
            if at > keep and all(c[0] != at for c in s.ckpts):
                s.ckpt_at = at

    def _token_s(self) -> float | None:
        """Seconds each prompt token adds to a step here (None before any step with prompt tokens): the slope
        of step time over prompt tokens, at most their mean cost. A restored state saves its tokens, not the
        step the rest of the prompt takes anyway (over RPC a step's cost is mostly network latency)."""
        steps = self._prefill_steps
        if not steps:
            return None
        n = np.array([x[0] for x in steps], dtype=np.float64)
        t = np.array([x[1] for x in steps], dtype=np.float64)
        mean = float(t.sum() / n.sum())
        if len(steps) < 4 or float(np.ptp(n)) == 0.0:
            return mean
        slope = float(np.polyfit(n, t, 1)[0])
        return min(max(slope, 0.0), mean)

    def _lora_group(self) -> list[Slot]:
        """The slots this step decodes: all of them, or with LoRA adapters those of one adapter set,
        the sets taking turns (adapters are per context, as llama-server batches only equal sets)."""
        if self.lora is None:
            return self._active
        keys = list(dict.fromkeys(s.req.lora for s in sorted(self._active, key=lambda s: s.seq)))
        key = keys[self._lora_turn % len(keys)]
        self._lora_turn += 1
        self.lora.apply(self.ctx, key)
        return [s for s in self._active if s.req.lora == key]

    def _step(self) -> None:
        active = self._lora_group()
        batch = self._batch
        batch.clear()
        tok_arr, pos_arr, seq_arr, nseq_arr, logit_arr = (batch.token_arr, batch.pos, batch.seq_ids,
                                                          batch.n_seq_id, batch.logits)
        outputs: list[tuple[Slot, int]] = []
        # speculating slots: (slot, row of its pending token, its draft, the drafter, that token's position)
        verifies: list[tuple[Slot, int, list[int], Any, int]] = []
        drafts = self._drafts(active) if self.spec is not None else {}
        ckpts = self.spec.checkpoints if self.spec is not None else None
        # every decoded span of a slot whose drafters read the target's rows: (slot, position, tokens, first row)
        seen: list[tuple[Slot, int, list[int], int]] | None = [] if self.spec is not None and self.spec.observes else None
        if any(s.req.media and s.prefilling for s in active):  # media at a slot's next position: decoded first
            for s in list(active):
                if s.req.media and s.prefilling:
                    self._prefill_media(s)
            active = [s for s in active if s in self._active]
        n = 0
        # rows in sequence order: recurrent memory puts only consecutive sequence ids (0, 1, 2, ...) into one
        # micro-batch (llama.cpp's sequential split_equal), so any other order decodes a slot at a time
        for s in sorted(active, key=lambda s: s.seq):
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
                    if seen is not None:
                        seen.append((s, s.pos - len(s.replay), [*s.replay, s.next_tok, *draft], n - len(s.replay)))
                    n += k
                else:
                    outputs.append((s, n))
                    if seen is not None:
                        seen.append((s, s.pos - len(s.replay), [*s.replay, s.next_tok], n - len(s.replay)))
                s.replay = []
                s.kv.append(s.next_tok)
                s.pos += 1
                s.next_tok = None
                n += 1
        batch.n_tokens = n
        budget = self.n_batch - n
        for s in active:
            if budget <= 0:
                break
            if s.prefilling:
                prompt = s.req.prompt_tokens
                stop = min(s.n_fed + budget, s.end)
                if s.req.media:
                    stop = text_until(s.req.media, s.n_fed, stop)
                    if stop == s.n_fed:  # its media failed to decode this step
                        continue
                if s.n_fed < s.ckpt_at < stop:  # pause there for a context checkpoint (after this decode)
                    stop = s.ckpt_at
                chunk = prompt[s.n_fed:stop]
                last = s.n_fed + len(chunk) == s.end
                first, k = batch.add_sequence(np.asarray(chunk, dtype=np.int32), s.seq, s.n_fed,
                                              logits="last" if last and s.spec is None else False)
                if seen is not None and s.spec is not None:
                    seen.append((s, s.n_fed, chunk, first))
                s.n_fed += k
                budget -= k
                self._n_prefill += k
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
        for s in active:
            if s.ckpt_at > 0 and s.n_fed == s.ckpt_at:
                take_checkpoint(self.ctx, s.seq, s.n_fed, s.ckpts)
                s.ckpt_at = -1
        for s, p0, toks, first in seen or ():
            try:
                self.spec.observe(s.spec, toks, p0, first)
            except Exception as exc:  # this request's drafter: it alone ends
                log.warning("request in slot %d failed: %s", s.seq, exc)
                self._out.put(s.job, "error", exc)
                if s in self._active:
                    self._release(s)
        for s, first, draft, src, pos0 in verifies:
            if s.job.done or s not in self._active:  # its drafter failed above
                continue
            try:
                self._verify(s, first, draft, src, pos0)
            except Exception as exc:  # this request's sampler, grammar or hook: it alone ends
                log.warning("request in slot %d failed: %s", s.seq, exc)
                self._out.put(s.job, "error", exc)
                if s in self._active:
                    self._release(s)
        for s, i in outputs:
            if s.job.done or s not in self._active:
                continue
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

    def _prefill_media(self, s: Slot) -> None:
        """Decode the media chunks that start at slot ``s``'s next position into its sequence (a decode of
        their own, at the scales of its LoRA group); a failure ends this request alone."""
        try:
            while s.prefilling and (span := span_at(s.req.media, s.n_fed)) is not None:
                if self._ext_batch is None:
                    self._ext_batch = LlamaBatchExtNative(self.ctx)
                self.steps += decode_span(self.ctx, self._ext_batch, s.seq, span)
                s.n_fed = span.end
        except Exception as exc:  # noqa: BLE001 - this request's media: it alone ends
            log.warning("media of the request in slot %d failed: %s", s.seq, exc)
            self._out.put(s.job, "error", exc)
            if s in self._active:
                self._release(s)

    def _eog(self, tok: int) -> bool:
        eog = self._is_eog.get(tok)
        if eog is None:
            eog = self._is_eog[tok] = bool(self.model.is_eog(tok))
        return eog

    def _accept(self, s: Slot, tok: int, row: np.ndarray | None) -> None:
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
        if tok in s.special:  # the chat parser reads these (harmony's <|channel|>, Qwen's <tool_call>...)
            piece = self.model.token_to_piece(tok, special=True)
        else:
            piece = self._pieces.get(tok)
            if piece is None:
                piece = self._pieces[tok] = self.model.token_to_piece(tok)
        if s.lp.enabled:
            s.pending.append((tok, row, s.chars))
            s.chars += char_len(piece)
        before = len(s.text.text)
        window = bytes(s.text.text[before - min(s.stop_len, before):]) if s.stop_len else b""
        out = s.text.push(piece)
        if s.text.stopped:
            at = len(s.text.text) - (before - len(window))  # the cut, within window + piece
            self._finish(s, "stop", stop_word(s.text.stops, window + piece, at))
            return
        if out:
            self._out.put(s.job, "chunk", completion_chunk(req, out, None, s.lp.block(s.pending)))
            s.pending = []
        if s.produced >= req.max_tokens or s.pos >= self.n_ctx_slot:
            self._finish(s, "length")
            return
        s.next_tok = tok

    def _finish(self, s: Slot, reason: str, stop: str | None = None) -> None:
        req = s.req
        final = completion_chunk(req, s.text.rest(), reason, s.lp.block(s.pending))
        if stop is not None:  # which stop string ended it (Anthropic's stop_sequence)
            final["choices"][0]["stop_sequence"] = stop
        n_prompt = cells(req.prompt_tokens, req.media) if req.media else len(req.prompt_tokens)
        final["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": s.n_gen,
                          "total_tokens": n_prompt + s.n_gen,
                          "prompt_tokens_details": {"cached_tokens": s.n_cached}}
        now = time.perf_counter()
        gen_s = now - s.t_first if s.t_first else 0.0
        self.counters.add(n_prompt, s.n_cached, (s.t_first or now) - s.t_start, s.n_gen, gen_s)
        final["timings"] = {"prompt_ms": 1000 * ((s.t_first or now) - s.t_start), "predicted_ms": 1000 * gen_s,
                            "predicted_n": s.n_gen, "slot": s.seq}
        final["usage"]["prompt_tokens_cached"] = s.n_cached
        if s.spec is not None:
            final["usage"]["speculative"] = s.spec.stats.as_dict()
        self._out.put(s.job, "chunk", final)
        self._out.put(s.job, "end")
        self._release(s, keep_cache=True)

    def _finish_cancelled(self, s: Slot) -> None:
        self._out.put(s.job, "error", Cancelled("the request was cancelled"))
        self._release(s)

    def _release(self, s: Slot, active: bool = True, keep_cache: bool = False) -> None:
        """Free the slot now and close its samplers. A finished request's tokens stay in the KV cache
        for a later prompt that starts with them (``cache_prompt``); a cancelled or failed one's
        sequence is removed at once."""
        if keep_cache and self.cache_prompt:
            self.cached[s.seq] = s.kv[:s.pos]
            self.cached_lora[s.seq] = s.req.lora
            self.ckpts[s.seq] = [c for c in s.ckpts if c[0] <= s.pos]
        else:
            self.cached[s.seq], self.ckpts[s.seq] = [], []
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
            self._uses += 1
            self._last_used[s.seq] = self._uses
            self._free_seqs.append(s.seq)


__all__ = ["SlotEngine"]
