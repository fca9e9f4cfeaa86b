"""The prompt cache the slots of one engine share (llama-server's ``server_prompt_cache``, ``--cache-ram``).

A slot keeps its last request's tokens in the KV cache; when another prompt is about to take that
sequence, its state (``llama_state_seq_get_data_ext``: the sequence's KV cells, or its recurrent state)
is copied to host memory with the tokens it holds. A new prompt then starts from whichever state shares
the longest usable prefix with it, the slot's own or a saved one, whatever slot it lands on: the saved
state is written back into the slot's sequence (``llama_state_seq_set_data_ext``) and leaves the cache,
as llama-server moves it.

Memory that cannot drop a suffix (recurrent and hybrid models: a recurrent state is one point, not a
list of cells) restores only a state whose tokens are all a prefix of the prompt, an exact checkpoint.
The states together never exceed ``limit`` bytes: the least recently used go first, and a state larger
than the limit is not stored. A state that does not restore is dropped and the prompt evaluated in full.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from .state import common_prefix

log = logging.getLogger("llama_cpp.server")

MIB = 1024 * 1024


class SavedPrompt:
    """One saved sequence state and the tokens it holds."""

    __slots__ = ("tokens", "data")

    def __init__(self, tokens: list[int], data: bytearray) -> None:
        self.tokens = tokens
        self.data = data


class PromptCache:
    """Sequence states in host memory under a size limit (``limit_mib``; -1: no limit), LRU order."""

    def __init__(self, ctx: Any, limit_mib: int, exact: bool) -> None:
        if limit_mib == 0:
            raise ValueError("a prompt cache of 0 MiB is no cache: leave it out instead")
        self.ctx = ctx
        self._C = ctx._C
        self.limit = None if limit_mib < 0 else int(limit_mib) * MIB
        self.exact = exact  # only whole saved states are usable (recurrent or hybrid memory)
        self.entries: list[SavedPrompt] = []  # oldest first
        self.size = 0  # bytes held
        self.n_tokens = 0  # tokens held (kept as counts: the metrics scrape reads them from another thread)
        self.saved = self.restored = self.restored_tokens = self.evicted = self.failed = 0

    def __len__(self) -> int:
        return len(self.entries)

    def usable(self, tokens: list[int], prompt: list[int]) -> int:
        """Prompt tokens a sequence holding ``tokens`` lets skip (the prompt's last token is always
        evaluated again, for its logits)."""
        if self.exact:
            n = len(tokens)
            return n if 0 < n < len(prompt) and common_prefix(tokens, prompt) == n else 0
        return min(common_prefix(tokens, prompt), len(prompt) - 1)

    def _covered(self, tokens: list[int]) -> bool:
        """Whether a saved state already serves every prompt ``tokens`` would."""
        for e in self.entries:
            if (e.tokens == tokens) if self.exact else (common_prefix(e.tokens, tokens) == len(tokens)):
                return True
        return False

    def save(self, seq: int, tokens: list[int]) -> bool:
        """Copy sequence ``seq`` (holding ``tokens``) to the cache; False where it is not stored (empty,
        already covered, or larger than the limit)."""
        if not tokens or self._covered(tokens):
            return False
        C, ptr = self._C, self.ctx.ptr
        size = int(C.llama_state_seq_get_size_ext(ptr, seq, 0))
        if size <= 0 or (self.limit is not None and size > self.limit):
            if size > 0:
                log.info("prompt cache: a state of %.1f MiB exceeds the limit of %.1f MiB, not stored",
                         size / MIB, self.limit / MIB)
            return False
        # states this one contains serve nothing it does not
        if not self.exact:
            for e in [e for e in self.entries if common_prefix(e.tokens, tokens) == len(e.tokens)]:
                self._drop(e)
        while self.limit is not None and self.entries and self.size + size > self.limit:
            self._drop(self.entries[0])
            self.evicted += 1
        try:
            data = bytearray(size)
        except MemoryError:
            log.warning("prompt cache: no host memory for a state of %.1f MiB", size / MIB)
            return False
        n = int(C.llama_state_seq_get_data_ext(ptr, (ctypes.c_uint8 * size).from_buffer(data), size, seq, 0))
        if n <= 0:
            return False
        if n < size:
            del data[n:]
        self.entries.append(SavedPrompt(list(tokens), data))
        self.size += len(data)
        self.n_tokens += len(tokens)
        self.saved += 1
        return True

    def best(self, prompt: list[int], at_least: int) -> SavedPrompt | None:
        """The saved state that skips the most of ``prompt``, more than ``at_least`` tokens, or None."""
        best, best_n = None, at_least
        for e in self.entries:
            n = self.usable(e.tokens, prompt)
            if n > best_n:
                best, best_n = e, n
        return best

    def restore(self, e: SavedPrompt, seq: int) -> bool:
        """Write ``e`` into sequence ``seq`` (emptied first) and take it out of the cache; a state that does
        not restore is dropped and the sequence left empty."""
        self._drop(e)
        C, ptr = self._C, self.ctx.ptr
        self.ctx.seq_rm(seq, -1, -1)
        try:
            buf = (ctypes.c_uint8 * len(e.data)).from_buffer(e.data)
            ok = int(C.llama_state_seq_set_data_ext(ptr, buf, len(e.data), seq, 0)) == len(e.data)
        except Exception:  # noqa: BLE001 - a state that does not restore is only a miss
            log.debug("prompt cache: restore raised", exc_info=True)
            ok = False
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
        self.size -= len(e.data)
        self.n_tokens -= len(e.tokens)

    def clear(self) -> None:
        self.entries.clear()
        self.size = self.n_tokens = 0

    def stats(self) -> dict[str, Any]:
        return {"states": len(self.entries), "bytes": self.size, "tokens": self.n_tokens,
                "limit_bytes": -1 if self.limit is None else self.limit, "saved": self.saved,
                "restored": self.restored, "restored_tokens": self.restored_tokens, "evicted": self.evicted,
                "failed_restores": self.failed}


__all__ = ["PromptCache", "SavedPrompt"]
