"""What a saved state was made from, and a keyed check of its bytes.

A :class:`~llama_cpp._compat.state.LlamaState` from :meth:`Llama.save_state` carries ``made_from``
(the model's fingerprint and the context settings that shape its memory) and ``digest``, an
HMAC-SHA256 over ``made_from``, the token list, the seed, the logits row and llama.cpp's memory
bytes. The key is a per-user secret in the package cache (``state-key``, mode 0600), not in any
prompt-cache folder: whoever can write a cache folder cannot forge an entry.

:func:`check_before_load` refuses a state whose digest does not match, whose settings differ
from the context's, whose memory bytes are empty, or whose token count exceeds its list;
:func:`check_after_load` refuses one whose restored memory does not hold exactly its tokens.
A state made by hand (no digest) is accepted with the other checks, as upstream allows.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import ContextError
from .paths import cache_root

log = logging.getLogger("llama_cpp")

_KEY: bytes | None = None
#: model fingerprints, per ``Llama``
_FINGERPRINTS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def model_fingerprint(llama: Any) -> str:
    """What a saved state must have been saved from: the model's description, parameter count,
    size, vocabulary and file (two models of the same shape are told apart by name); cached."""
    fp = _FINGERPRINTS.get(llama)
    if fp is None:
        m = llama.native_model()
        path = Path(llama.model_path)
        size = path.stat().st_size if path.is_file() else -1
        raw = f"{m.desc()}|{m.n_params()}|{m.size()}|{m.n_vocab}|{path.name}|{size}"
        fp = _FINGERPRINTS[llama] = hashlib.sha256(raw.encode()).hexdigest()[:32]
    return fp


def state_key() -> bytes:
    """The per-user secret (created on first use; a per-process one if the cache is unwritable)."""
    global _KEY
    if _KEY is None:
        path = cache_root() / "state-key"
        try:
            _KEY = path.read_bytes()
        except OSError:
            _KEY = b""
        if len(_KEY) < 32:
            fresh = secrets.token_bytes(32)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(fresh)
                _KEY = fresh
            except FileExistsError:
                _KEY = path.read_bytes() if path.stat().st_size >= 32 else fresh
            except OSError as exc:
                log.warning("could not keep a state key in %s (%s): saved states check only within this process",
                            path, exc)
                _KEY = fresh
    return _KEY


def made_from(llama: Any) -> dict[str, Any]:
    """The model fingerprint and context settings a state of ``llama`` depends on."""
    ctx = llama.native_context()
    params = getattr(ctx, "params", None)
    return {"model": model_fingerprint(llama), "n_ctx": int(ctx.n_ctx()),
            "n_seq_max": int(ctx.n_seq_max()) if hasattr(ctx, "n_seq_max") else 1,
            "type_k": int(getattr(params, "type_k", -1)), "type_v": int(getattr(params, "type_v", -1)),
            "embeddings": bool(getattr(params, "embeddings", False))}


def digest(state: Any, origin: dict[str, Any]) -> str:
    """HMAC-SHA256 of everything a restore uses."""
    h = hmac.new(state_key(), digestmod=hashlib.sha256)
    tokens = np.asarray(state.input_ids, dtype="<i4")[: int(state.n_tokens)]
    h.update(json.dumps(origin, sort_keys=True).encode())
    h.update(f"|{int(state.n_tokens)}|{int(state.seed)}|".encode())
    h.update(tokens.tobytes())
    scores = getattr(state, "scores", None)
    h.update(b"|" + (np.asarray(scores, dtype="<f4").tobytes() if scores is not None else b"-") + b"|")
    h.update(bytes(state.llama_state))
    return h.hexdigest()


def seal(llama: Any, state: Any) -> Any:
    """Attach ``made_from`` and ``digest`` to a state ``llama`` just saved; returns it."""
    state.made_from = made_from(llama)
    state.digest = digest(state, state.made_from)
    return state


def digest_matches(state: Any) -> bool:
    """Whether ``state.digest`` is the keyed digest of its contents and ``made_from``."""
    origin = getattr(state, "made_from", None)
    sealed = getattr(state, "digest", None)
    return isinstance(origin, dict) and sealed is not None and hmac.compare_digest(str(sealed), digest(state, origin))


def _refuse(what: str) -> ContextError:
    return ContextError(f"refusing this saved state: {what}; save it again from this model and context")


def check_before_load(llama: Any, state: Any) -> None:
    """Refuse a state that does not describe itself (see the module docstring)."""
    data = getattr(state, "llama_state", None)
    if not isinstance(data, bytes | bytearray | memoryview) or len(data) == 0:
        raise _refuse("it holds no memory bytes (an empty state would leave the context's memory as it is)")
    n = int(state.n_tokens)
    if n < 0 or n > len(np.asarray(state.input_ids)):
        raise _refuse(f"n_tokens={n} but its token list has {len(np.asarray(state.input_ids))} entries")
    sealed = getattr(state, "digest", None)
    origin = getattr(state, "made_from", None)
    if sealed is None:
        return
    if not digest_matches(state):
        raise _refuse("its bytes, tokens or settings do not match its digest (modified or corrupt)")
    if not origin:  # sealed by a prompt cache, not by a Llama: its origin is unknown
        return
    here = made_from(llama)
    diff = sorted(k for k in set(here) | set(origin) if here.get(k) != origin.get(k))
    if diff:
        raise _refuse("it was made with other settings: " + ", ".join(
            f"{k}={origin.get(k)!r} (here {here.get(k)!r})" for k in diff))


def check_after_load(ctx: Any, n_tokens: int) -> None:
    """Refuse (and clear the memory) when the restored memory does not hold positions 0..n-1."""
    try:
        lo, hi = ctx.seq_pos_min(0), ctx.seq_pos_max(0)
    except (AttributeError, ValueError):
        return
    if hi != n_tokens - 1:  # recurrent and sliding-window memory keep fewer than all positions: max only
        ctx.memory_clear(True)
        raise _refuse(f"its memory holds positions {lo}..{hi} but its token list has {n_tokens} tokens "
                      f"(the last position should be {n_tokens - 1})")
