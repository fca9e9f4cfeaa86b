"""The prompt cache the slots of one engine share (llama-server's ``server_prompt_cache``, ``--cache-ram``).

A slot keeps its last request's tokens in the KV cache; when another prompt is about to take that
sequence, its state (``llama_state_seq_get_data_ext``: the sequence's KV cells, or its recurrent state)
is copied to host memory with the tokens it holds. A new prompt then starts from whichever state shares
the longest usable prefix with it, the slot's own or a saved one, whatever slot it lands on: the saved
state is written back into the slot's sequence (``llama_state_seq_set_data_ext``) and leaves the cache,
as llama-server moves it.

Memory that cannot drop a suffix (recurrent and hybrid models: a recurrent state is one point, not a
list of cells) reuses a state whose tokens are all a prefix of the prompt, or else one of its context
checkpoints: the recurrent part alone (``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``) taken a few tokens before
the end of an earlier prompt, as llama-server takes them, so that a prompt whose end the chat template
renders differently next turn still starts there. A checkpoint travels with its state.
The states together never exceed ``limit`` bytes: the least recently used go first, and a state larger
than the limit is not stored. A state that does not restore is dropped and the prompt evaluated in full.

A saved state pays only where copying it off the device and back costs less than evaluating its tokens
again. On a local device a copy is a few memory copies; with the KV cache on an RPC server llama.cpp
reads and writes it a tensor slice per call (``llama_io_write_host``: without flash attention one
synchronous round trip per V row per layer, thousands for a small model), which costs far more than
evaluating a short prompt again. :meth:`PromptCache.worth_saving` and :meth:`PromptCache.worth_restoring`
compare the copies this cache has timed with what the engine measures a prompt token adds to a step, and
the engine saves and restores only where it pays.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Hashable, Sequence
from typing import Any

from .state import common_prefix

log = logging.getLogger("llama_cpp.server")

MIB = 1024 * 1024
PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: the part of the memory that cannot roll back
# llama-server's checkpoint offset before the end of a prompt (server-context.cpp, checkpoint_offsets):
# the generation prompt the template appends is what a later turn renders differently
CHECKPOINT_OFFSET = 4
MAX_CHECKPOINTS = 8  # per sequence, the oldest dropped first
TIMED = 4  # the last copies timed each way: the fastest stands for the cost (load only slows a copy down)

# (tokens the memory had evaluated, its recurrent part then)
Checkpoint = tuple[int, bytearray]


def _get(ctx: Any, seq: int, flags: int) -> bytearray | None:
    C, ptr = ctx.bindings, ctx.ptr
    size = int(C.llama_state_seq_get_size_ext(ptr, seq, flags))
    if size <= 0:
        return None
    data = bytearray(size)
    n = int(C.llama_state_seq_get_data_ext(ptr, (ctypes.c_uint8 * size).from_buffer(data), size, seq, flags))
    if n <= 0:
        return None
    if n < size:
        del data[n:]
    return data


def _set(ctx: Any, seq: int, data: bytearray, flags: int) -> bool:
    try:
        buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
        return int(ctx.bindings.llama_state_seq_set_data_ext(ctx.ptr, buf, len(data), seq, flags)) == len(data)
    except Exception:  # noqa: BLE001 - a state that does not restore is only a miss
        log.debug("prompt cache: restore raised", exc_info=True)
        return False


def take_checkpoint(ctx: Any, seq: int, n_tokens: int, into: list[Checkpoint]) -> None:
    """Append sequence ``seq``'s recurrent part, after ``n_tokens`` tokens, to ``into`` (bounded)."""
    data = _get(ctx, seq, PARTIAL_ONLY)
    if data is None:
        return
    into[:] = [c for c in into if c[0] != n_tokens][-(MAX_CHECKPOINTS - 1):]
    into.append((n_tokens, data))


def plan(exact: bool, tokens: list[int], checkpoints: Sequence[Checkpoint],
         prompt: list[int]) -> tuple[int, Checkpoint | None]:
    """Prompt tokens a sequence holding ``tokens`` lets skip, and the checkpoint to rewind to first (None:
    the memory as it is). At least the prompt's last token is evaluated again, for its logits."""
    lcp = common_prefix(tokens, prompt)
    if not exact:
        return min(lcp, len(prompt) - 1), None
    if 0 < len(tokens) < len(prompt) and lcp == len(tokens):
        return len(tokens), None
    best = None
    for c in checkpoints:
        if 0 < c[0] <= min(lcp, len(prompt) - 1) and (best is None or c[0] > best[0]):
            best = c
    return (0, None) if best is None else (best[0], best)


def rewind(ctx: Any, seq: int, ckpt: Checkpoint) -> bool:
    """Put sequence ``seq`` back to checkpoint ``ckpt`` (its recurrent part, then the cells after it
    dropped); False, and the sequence emptied, where it does not restore."""
    if _set(ctx, seq, ckpt[1], PARTIAL_ONLY) and ctx.seq_rm(seq, ckpt[0], -1):
        return True
    log.warning("a context checkpoint at %d tokens did not restore into sequence %d; evaluating the prompt "
                "instead", ckpt[0], seq)
    ctx.seq_rm(seq, -1, -1)
    return False


class SavedPrompt:
    """One saved sequence state, the tokens it holds, its context checkpoints and the key it was computed
    under (a LoRA adapter set's scales: a state serves only prompts run under the same key)."""

    __slots__ = ("tokens", "data", "checkpoints", "size", "key")

    def __init__(self, tokens: list[int], data: bytearray, checkpoints: list[Checkpoint],
                 key: Hashable = ()) -> None:
        self.tokens = tokens
        self.data = data
        self.checkpoints = checkpoints
        self.key = key
        self.size = len(data) + sum(len(c[1]) for c in checkpoints)


class PromptCache:
    """Sequence states in host memory under a size limit (``limit_mib``; -1: no limit), LRU order."""

    def __init__(self, ctx: Any, limit_mib: int, exact: bool) -> None:
        if limit_mib == 0:
            raise ValueError("a prompt cache of 0 MiB is no cache: leave it out instead")
        self.ctx = ctx
        self.bindings = ctx.bindings
        self.limit = None if limit_mib < 0 else int(limit_mib) * MIB
        self.exact = exact  # only whole saved states are usable (recurrent or hybrid memory)
        self.entries: list[SavedPrompt] = []  # oldest first
        self.size = 0  # bytes held
        self.n_tokens = 0  # tokens held (kept as counts: the metrics scrape reads them from another thread)
        self.saved = self.restored = self.restored_tokens = self.evicted = self.failed = 0
        self.skipped = 0  # states not saved because evaluating their tokens again costs less
        self.save_s: list[float] = []  # seconds of the last saves' copies off the device
        self.restore_s: list[float] = []  # and of the last restores' copies back

    def __len__(self) -> int:
        return len(self.entries)

    def usable(self, tokens: list[int], prompt: list[int], checkpoints: Sequence[Checkpoint] = ()) -> int:
        """Prompt tokens a sequence holding ``tokens`` (and ``checkpoints``) lets skip."""
        return plan(self.exact, tokens, checkpoints, prompt)[0]

    def copy_cost(self) -> float | None:
        """Seconds a save and its restore are expected to take (None until two saves were timed)."""
        if len(self.save_s) < 2:
            return None
        out = min(self.save_s)
        return out + (min(self.restore_s) if self.restore_s else out)

    def worth_saving(self, n_tokens: int, token_s: float | None) -> bool:
        """Whether saving a state of ``n_tokens`` tokens pays, each prompt token adding ``token_s`` seconds to
        a step (None: not measured yet): its copies must cost less than evaluating the tokens again.
        Counts a state not saved in ``skipped``."""
        cost = self.copy_cost()
        if cost is None or token_s is None or cost < n_tokens * token_s:
            return True
        if self.skipped == 0:
            log.info("prompt cache: a state's copies take %.1f ms, more than evaluating its %d tokens again "
                     "(%.3f ms each): states that short are not saved", 1e3 * cost, n_tokens, 1e3 * token_s)
        self.skipped += 1
        return False

    def worth_restoring(self, n_tokens: int, token_s: float | None) -> bool:
        """Whether restoring a state that skips ``n_tokens`` prompt tokens costs less than evaluating them (the
        restores timed so far; None or nothing timed yet: restored)."""
        if not self.restore_s or token_s is None:
            return True
        return min(self.restore_s) < n_tokens * token_s

    def _covered(self, tokens: list[int], key: Hashable) -> bool:
        """Whether a saved state under ``key`` already serves every prompt ``tokens`` would."""
        for e in self.entries:
            if e.key == key and ((e.tokens == tokens) if self.exact
                                 else (common_prefix(e.tokens, tokens) == len(tokens))):
                return True
        return False

    def save(self, seq: int, tokens: list[int], checkpoints: Sequence[Checkpoint] = (),
             pin: SavedPrompt | None = None, key: Hashable = ()) -> bool:
        """Copy sequence ``seq`` (holding ``tokens``, with ``checkpoints``, computed under ``key``) to the
        cache; False where it is not stored (empty, already covered, or no room without evicting ``pin``,
        the state about to be restored, or larger than the limit)."""
        if not tokens or self._covered(tokens, key):
            return False
        ckpts = list(checkpoints)
        size = int(self.bindings.llama_state_seq_get_size_ext(self.ctx.ptr, seq, 0)) + sum(len(c[1]) for c in ckpts)
        if size <= 0:
            return False
        if self.limit is not None and size > self.limit:
            log.info("prompt cache: a state of %.1f MiB exceeds the limit of %.1f MiB, not stored",
                     size / MIB, self.limit / MIB)
            return False
        # states this one contains serve nothing it does not
        pinned = pin.size if pin is not None and pin in self.entries else 0
        if self.limit is not None and pinned + size > self.limit:
            return False
        if not self.exact:
            for e in [e for e in self.entries
                      if e is not pin and e.key == key and common_prefix(e.tokens, tokens) == len(e.tokens)]:
                self._drop(e)
        while self.limit is not None and self.size + size > self.limit:
            self._drop(next(e for e in self.entries if e is not pin))
            self.evicted += 1
        try:
            t0 = time.perf_counter()
            data = _get(self.ctx, seq, 0)
            self.save_s = [*self.save_s[-(TIMED - 1):], time.perf_counter() - t0]
        except MemoryError:
            log.warning("prompt cache: no host memory for a state of %.1f MiB", size / MIB)
            return False
        except Exception:  # noqa: BLE001 - a state that cannot be copied is not cached; the request goes on
            log.warning("prompt cache: copying sequence %d's state failed", seq, exc_info=True)
            return False
        if data is None:
            return False
        e = SavedPrompt(list(tokens), data, ckpts, key)
        if self.limit is not None and self.size + e.size > self.limit:  # the state grew since it was sized
            return False
        self.entries.append(e)
        self.size += e.size
        self.n_tokens += len(tokens)
        self.saved += 1
        return True

    def best(self, prompt: list[int], at_least: int, key: Hashable = ()) -> SavedPrompt | None:
        """The saved state under ``key`` that skips the most of ``prompt``, more than ``at_least`` tokens,
        or None."""
        best, best_n = None, at_least
        for e in self.entries:
            if e.key != key:
                continue
            n = plan(self.exact, e.tokens, e.checkpoints, prompt)[0]
            if n > best_n:
                best, best_n = e, n
        return best

    def restore(self, e: SavedPrompt, seq: int) -> bool:
        """Write ``e`` into sequence ``seq`` (emptied first) and take it out of the cache; a state that does
        not restore is dropped and the sequence left empty."""
        self._drop(e)
        self.ctx.seq_rm(seq, -1, -1)
        t0 = time.perf_counter()
        ok = _set(self.ctx, seq, e.data, 0)
        self.restore_s = [*self.restore_s[-(TIMED - 1):], time.perf_counter() - t0]
        if not ok:
            log.warning("prompt cache: a saved state of %d tokens did not restore into sequence %d; "
                        "evaluating the prompt instead", len(e.tokens), seq)
            self.failed += 1
            self.ctx.seq_rm(seq, -1, -1)
            return False
        self.restored += 1
        return True

    def _drop(self, e: SavedPrompt) -> None:
        self.entries.remove(e)
        self.size -= e.size
        self.n_tokens -= len(e.tokens)

    def clear(self) -> None:
        self.entries.clear()
        self.size = self.n_tokens = 0

    def stats(self) -> dict[str, Any]:
        return {"states": len(self.entries), "bytes": self.size, "tokens": self.n_tokens,
                "limit_bytes": -1 if self.limit is None else self.limit, "saved": self.saved,
                "restored": self.restored, "restored_tokens": self.restored_tokens, "evicted": self.evicted,
                "failed_restores": self.failed, "skipped": self.skipped}


__all__ = ["CHECKPOINT_OFFSET", "Checkpoint", "PromptCache", "SavedPrompt", "plan", "rewind", "take_checkpoint"]
