"""Prompt caches for ``Llama.set_cache``, as in llama-cpp-python.

A cache maps token sequences to :class:`~llama_cpp._compat.state.LlamaState` snapshots; a lookup
returns the entry sharing the longest prefix with the prompt (``KeyError`` when none shares a
token). ``Llama.create_completion`` restores a hit only when it shares more with the prompt than
the context already holds, and stores the state after each completion.

:class:`LlamaRAMCache` keeps entries in memory (least recently used evicted past
``capacity_bytes``). :class:`LlamaDiskCache` keeps one file per entry in ``cache_dir``, written to
a temporary file and renamed into place, so a reader never sees a partial entry; entries are
uncompressed NumPy ``.npz`` archives read without pickle, only from regular files, and carry
what they were made from and a keyed digest (:mod:`llama_cpp._safety.state_integrity`): an entry
that is not a regular file, is compressed, lacks a digest or does not match it is skipped.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ._compat.state import LlamaState, longest_token_prefix
from ._errors import CacheError
from ._safety import cache_files as _cache_files
from ._safety import state_integrity as _state_integrity

log = logging.getLogger("llama_cpp")

DEFAULT_CAPACITY = 2 << 30


class BaseLlamaCache(abc.ABC):
    """A token-prefix keyed store of context states."""

    def __init__(self, capacity_bytes: int = DEFAULT_CAPACITY) -> None:
        if int(capacity_bytes) < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = int(capacity_bytes)

    @property
    @abc.abstractmethod
    def cache_size(self) -> int:
        """Bytes of state held."""

    @abc.abstractmethod
    def _keys(self) -> list[tuple[int, ...]]:
        """Every stored key."""

    def _find_longest_prefix_key(self, key: tuple[int, ...]) -> tuple[int, ...] | None:
        best, best_len = None, 0
        for k in self._keys():
            n = longest_token_prefix(k, key)
            if n > best_len:
                best, best_len = k, n
        return best

    @abc.abstractmethod
    def __getitem__(self, key: Sequence[int]) -> LlamaState: ...

    def __contains__(self, key: Sequence[int]) -> bool:
        return self._find_longest_prefix_key(tuple(int(t) for t in key)) is not None

    @abc.abstractmethod
    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None: ...


class LlamaRAMCache(BaseLlamaCache):
    """States in memory, least recently used dropped past ``capacity_bytes``."""

    def __init__(self, capacity_bytes: int = DEFAULT_CAPACITY) -> None:
        super().__init__(capacity_bytes)
        self.cache_state: OrderedDict[tuple[int, ...], LlamaState] = OrderedDict()

    @property
    def cache_size(self) -> int:
        return sum(s.llama_state_size for s in self.cache_state.values())

    def _keys(self) -> list[tuple[int, ...]]:
        return list(self.cache_state)

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        k = self._find_longest_prefix_key(tuple(int(t) for t in key))
        if k is None:
            raise KeyError("no cached state shares a prefix with these tokens")
        self.cache_state.move_to_end(k)
        return self.cache_state[k]

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        k = tuple(int(t) for t in key)
        self.cache_state.pop(k, None)
        self.cache_state[k] = value
        while self.cache_state and self.cache_size > self.capacity_bytes:
            self.cache_state.popitem(last=False)

    def __len__(self) -> int:
        return len(self.cache_state)


#: llama-cpp-python's older name for the RAM cache
LlamaCache = LlamaRAMCache


class LlamaDiskCache(BaseLlamaCache):
    """States as files in ``cache_dir`` (one ``.npz`` per entry), least recently used dropped past
    ``capacity_bytes`` (never the entry just written). The directory must be writable (checked
    here, :class:`CacheError`)."""

    SUFFIX = ".llamastate.npz"

    def __init__(self, cache_dir: str | os.PathLike[str] = ".cache/llama_cache",
                 capacity_bytes: int = DEFAULT_CAPACITY) -> None:
        super().__init__(capacity_bytes)
        self.cache_dir = Path(cache_dir)
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=self.cache_dir, prefix=".probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise CacheError(f"LlamaDiskCache cannot write to {self.cache_dir}: {exc.strerror or exc}; "
                             "choose a writable cache_dir") from exc
        self._index: dict[tuple[int, ...], Path] | None = None
        self._key_memo: dict[Path, tuple[tuple[int, int], tuple[int, ...]]] = {}

    def _path(self, key: tuple[int, ...]) -> Path:
        digest = hashlib.sha256(np.asarray(key, dtype="<i4").tobytes()).hexdigest()[:32]
        return self.cache_dir / f"{digest}{self.SUFFIX}"

    def _entries(self) -> list[Path]:
        # regular files only: a FIFO named like an entry would block the reader forever
        return sorted(p for p in self.cache_dir.glob(f"*{self.SUFFIX}") if _cache_files.entry_path_ok(p))

    def _read_key(self, path: Path) -> tuple[int, ...] | None:
        try:
            st = path.stat()
            memo = self._key_memo.get(path)
            if memo is not None and memo[0] == (st.st_mtime_ns, st.st_size):
                return memo[1]
            key = tuple(int(t) for t in _cache_files.read_npz(path, only=("key",))["key"])
            self._key_memo[path] = ((st.st_mtime_ns, st.st_size), key)
            return key
        except (OSError, ValueError, KeyError) as exc:  # vanished, or junk (EntryError is a ValueError)
            log.debug("skipping unreadable cache entry %s: %s", path, exc)
            return None

    def _keys(self) -> list[tuple[int, ...]]:
        index = {}
        for p in self._entries():
            k = self._read_key(p)
            if k is not None:
                index[k] = p
        self._index = index
        return list(index)

    @property
    def cache_size(self) -> int:
        total = 0
        for p in self._entries():
            with contextlib.suppress(OSError):
                total += p.stat().st_size
        return total

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        k = self._find_longest_prefix_key(tuple(int(t) for t in key))
        if k is None:
            raise KeyError("no cached state shares a prefix with these tokens")
        path = (self._index or {}).get(k) or self._path(k)
        try:
            z = _cache_files.read_npz(path)
            if "digest" not in z or "made_from" not in z:
                raise ValueError("it carries no digest (written by an older version, or not by this package)")
            scores = z["scores"] if bool(z["has_scores"]) else None
            data = z["llama_state"].tobytes()
            fingerprint = str(z["fingerprint"]) if "fingerprint" in z else ""
            state = LlamaState(input_ids=z["input_ids"].astype(np.intc), scores=scores,
                               n_tokens=int(z["n_tokens"]), llama_state=data, llama_state_size=len(data),
                               seed=int(z["seed"]), fingerprint=fingerprint or None,
                               made_from=json.loads(str(z["made_from"])), digest=str(z["digest"]))
            if not _state_integrity.digest_matches(state):
                raise ValueError("its bytes, tokens or settings do not match its digest (modified or corrupt)")
            os.utime(path)  # most recently used
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("prompt cache entry %s refused: %s", path.name, exc)
            raise KeyError(f"cache entry {path.name} could not be read: {exc}") from exc
        return state

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        k = tuple(int(t) for t in key)
        path = self._path(k)
        scores = value.scores
        arrays = {
            "key": np.asarray(k, dtype=np.int32),
            "input_ids": np.asarray(value.input_ids, dtype=np.int32)[: value.n_tokens],
            "n_tokens": np.int64(value.n_tokens),
            "seed": np.int64(value.seed),
            "has_scores": np.bool_(scores is not None),
            "scores": np.asarray(scores if scores is not None else np.zeros((0,)), dtype=np.float32),
            "llama_state": np.frombuffer(bytes(value.llama_state), dtype=np.uint8),
            "fingerprint": np.asarray(value.fingerprint or ""),
        }
        # Llama.save_state seals every state; one made by hand is sealed here with an unknown origin ({})
        origin = value.made_from if value.digest is not None and value.made_from is not None else {}
        sealed = value.digest if origin else _state_integrity.digest(value, origin)
        arrays["made_from"] = np.asarray(json.dumps(origin, sort_keys=True))
        arrays["digest"] = np.asarray(sealed)
        fd, tmp = tempfile.mkstemp(dir=self.cache_dir, prefix=".tmp-", suffix=self.SUFFIX + ".part")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise CacheError(f"LlamaDiskCache could not write {path}: {exc.strerror or exc}") from exc
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._trim(keep=path)

    def _trim(self, keep: Path) -> None:
        entries = []
        for p in self._entries():
            with contextlib.suppress(OSError):
                st = p.stat()
                entries.append((st.st_mtime_ns, p, st.st_size))
        total = sum(e[2] for e in entries)
        for _, p, size in sorted(entries, key=lambda e: e[0]):
            if total <= self.capacity_bytes:
                break
            if p == keep:  # the entry just written stays, even alone over capacity
                continue
            with contextlib.suppress(OSError):
                p.unlink()
                total -= size

    def __len__(self) -> int:
        return len(self._entries())


__all__ = ["BaseLlamaCache", "LlamaCache", "LlamaDiskCache", "LlamaRAMCache"]
