"""The sampler chain (:class:`LlamaSampler`) and token candidate arrays.
"""

from __future__ import annotations

import ctypes
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import (
    GrammarError,
    LlamaError,
    TokenizationError,
)
from .._native import log_routing as _logging
from .._safety import checks as _checks
from .context import LlamaContext
from .model import LlamaModel
from .normalize import normalize_embeddings
from .ownership import Owned, native_lib

# --------------------------------------------------------------------------------------------
# sampler chain
# --------------------------------------------------------------------------------------------

class LlamaSampler(Owned):
    """A ``llama_sampler_chain``; samplers added to it are owned (and freed) by the chain."""

    _kind = "sampler chain"

    def __init__(self, no_perf: bool = True) -> None:
        self._ref = None
        C = native_lib()
        params = C.llama_sampler_chain_default_params()
        params.no_perf = bool(no_perf)
        ptr = C.llama_sampler_chain_init(params)
        if not ptr:
            raise LlamaError("llama_sampler_chain_init failed")
        self._own(ptr, C.llama_sampler_free)
        self.bindings = C
        self.names: list[str] = []

    def _add(self, name: str, smpl: Any) -> LlamaSampler:
        if not smpl:
            raise LlamaError(f"llama.cpp refused to create the {name} sampler")
        self.bindings.llama_sampler_chain_add(self._ptr(), smpl)
        self.names.append(name)
        return self

    def add_greedy(self) -> LlamaSampler:
        return self._add("greedy", self.bindings.llama_sampler_init_greedy())

    def add_dist(self, seed: int) -> LlamaSampler:
        return self._add("dist", self.bindings.llama_sampler_init_dist(int(seed) & 0xFFFFFFFF))

    def add_top_k(self, k: int) -> LlamaSampler:
        return self._add("top_k", self.bindings.llama_sampler_init_top_k(int(k)))

    def add_top_p(self, p: float, min_keep: int = 1) -> LlamaSampler:
        return self._add("top_p", self.bindings.llama_sampler_init_top_p(float(p), int(min_keep)))

    def add_min_p(self, p: float, min_keep: int = 1) -> LlamaSampler:
        return self._add("min_p", self.bindings.llama_sampler_init_min_p(float(p), int(min_keep)))

    def add_typical(self, p: float, min_keep: int = 1) -> LlamaSampler:
        return self._add("typical", self.bindings.llama_sampler_init_typical(float(p), int(min_keep)))

    def add_temp(self, t: float) -> LlamaSampler:
        return self._add("temp", self.bindings.llama_sampler_init_temp(float(t)))

    def add_temp_ext(self, t: float, delta: float, exponent: float) -> LlamaSampler:
        return self._add("temp_ext", self.bindings.llama_sampler_init_temp_ext(float(t), float(delta), float(exponent)))

    def add_mirostat(self, n_vocab: int, seed: int, tau: float, eta: float, m: int = 100) -> LlamaSampler:
        return self._add("mirostat", self.bindings.llama_sampler_init_mirostat(
            int(n_vocab), int(seed) & 0xFFFFFFFF, float(tau), float(eta), int(m)))

    def add_mirostat_v2(self, seed: int, tau: float, eta: float) -> LlamaSampler:
        return self._add("mirostat_v2", self.bindings.llama_sampler_init_mirostat_v2(
            int(seed) & 0xFFFFFFFF, float(tau), float(eta)))

    def add_penalties(self, n_vocab: int, last_n: int, repeat: float, freq: float,
                      present: float) -> LlamaSampler:
        if repeat <= 0:
            raise ValueError(f"repeat_penalty must be > 0 (1.0 disables it), got {repeat}")
        return self._add("penalties", self.bindings.llama_sampler_init_penalties(
            int(n_vocab), int(last_n), float(repeat), float(freq), float(present)))

    def add_logit_bias(self, n_vocab: int, bias: dict[int, float]) -> LlamaSampler:
        C = self.bindings
        items = list(bias.items())
        for i, (tok, _) in enumerate(items):
            if not 0 <= int(tok) < n_vocab:
                raise TokenizationError(f"logit_bias token id {tok} (entry {i}) is outside the vocabulary [0, {n_vocab})")
        arr = (C.llama_logit_bias * len(items))()
        for i, (tok, b) in enumerate(items):
            arr[i].token = int(tok)
            arr[i].bias = float(b)
        return self._add("logit_bias", C.llama_sampler_init_logit_bias(int(n_vocab), len(items), arr))

    def add_xtc(self, p: float, t: float, min_keep: int, seed: int) -> LlamaSampler:
        return self._add("xtc", self.bindings.llama_sampler_init_xtc(
            _checks.finite("p", p), _checks.finite("t", t), int(min_keep), int(seed) & 0xFFFFFFFF))

    def add_top_n_sigma(self, n: float) -> LlamaSampler:
        return self._add("top_n_sigma", self.bindings.llama_sampler_init_top_n_sigma(_checks.finite("n", n)))

    def add_softmax(self) -> LlamaSampler:
        """Nothing to add: llama.cpp's dist sampler works from logits (llama-cpp-python deprecated this too)."""

        warnings.warn("add_softmax is deprecated and does nothing: the dist sampler samples from logits",
                      DeprecationWarning, stacklevel=2)
        return self

    def add_dry(self, model: LlamaModel, dry_multiplier: float, dry_base: float, dry_allowed_length: int,
                dry_penalty_last_n: int, seq_breakers: Sequence[str]) -> LlamaSampler:
        """The DRY repetition sampler; ``seq_breakers`` are strings that end a repeated sequence."""
        breakers = [b.encode("utf-8") if isinstance(b, str) else b for b in seq_breakers]
        for i, b in enumerate(breakers):
            if not isinstance(b, bytes) or not b or b"\0" in b:
                raise ValueError(f"seq_breakers[{i}] must be a non-empty string without NUL, got {seq_breakers[i]!r}")
        arr = (ctypes.c_char_p * max(len(breakers), 1))(*breakers)
        last_n = _checks.in_range("dry_penalty_last_n", dry_penalty_last_n, -1, 2 ** 31 - 1)
        return self._add("dry", self.bindings.llama_sampler_init_dry(
            model.vocab, _checks.finite("dry_multiplier", dry_multiplier), _checks.finite("dry_base", dry_base),
            _checks.in_range("dry_allowed_length", dry_allowed_length, 0, 2 ** 31 - 1), last_n,
            arr, len(breakers)))

    def add_infill(self, model: LlamaModel) -> LlamaSampler:
        return self._add("infill", self.bindings.llama_sampler_init_infill(model.vocab))

    def clone(self) -> LlamaSampler:
        """An independent copy of the chain and its samplers' state (``llama_sampler_clone``)."""
        ptr = self.bindings.llama_sampler_clone(self._ptr())
        if not ptr:
            raise LlamaError("llama_sampler_clone failed")
        twin = LlamaSampler.__new__(LlamaSampler)
        twin._ref = None
        twin._own(ptr, self.bindings.llama_sampler_free)
        twin.bindings = self.bindings
        twin.names = list(self.names)
        return twin

    def get_seed(self) -> int:
        """The seed of the chain's seeded sampler (``LLAMA_DEFAULT_SEED`` when it has none)."""
        return int(self.bindings.llama_sampler_get_seed(self._ptr()))

    def add_grammar(self, model: LlamaModel, grammar: Any, root: str = "root") -> LlamaSampler:
        """A GBNF grammar sampler; ``grammar`` is GBNF text or a :class:`~llama_cpp.LlamaGrammar`
        (llama-cpp-python's form, whose own root rule is used)."""

        if not isinstance(grammar, str):
            text, start = getattr(grammar, "grammar", None), getattr(grammar, "root", None)
            if not isinstance(text, str) or not isinstance(start, str):
                raise TypeError(f"grammar must be GBNF text or a LlamaGrammar, not {type(grammar).__name__}")
            grammar, root = text, start
        with _logging.router().capture_problems() as problems:
            smpl = self.bindings.llama_sampler_init_grammar(model.vocab, grammar.encode("utf-8"), root.encode("utf-8"))
        if not smpl:  # a GrammarError (a ValueError): the caller's grammar, a 400 in the server
            reason = "; ".join(problems[-3:]) or "its log names the failing rule"
            raise GrammarError(f"llama.cpp could not parse the GBNF grammar: {reason}")
        return self._add("grammar", smpl)

    def sample(self, ctx: LlamaContext, idx: int = -1) -> int:
        return int(self.bindings.llama_sampler_sample(self._ptr(), ctx.ptr, int(idx)))

    def accept(self, token: int) -> None:
        self.bindings.llama_sampler_accept(self._ptr(), int(token))

    def apply(self, cur_p: Any) -> None:
        self.bindings.llama_sampler_apply(self._ptr(), cur_p)

    def reset(self) -> None:
        self.bindings.llama_sampler_reset(self._ptr())

    def __len__(self) -> int:
        return int(self.bindings.llama_sampler_chain_n(self._ptr()))


class TokenCandidates:
    """A reusable ``llama_token_data_array`` filled from a logits row (for samplers applied by hand)."""

    def __init__(self, n_vocab: int) -> None:
        C = native_lib()
        self.bindings = C
        self.n_vocab = n_vocab
        self._data = (C.llama_token_data * n_vocab)()
        dtype = np.dtype({"names": ["id", "logit", "p"], "formats": ["<i4", "<f4", "<f4"],
                          "offsets": [0, 4, 8], "itemsize": ctypes.sizeof(C.llama_token_data)})
        self.view = np.frombuffer(self._data, dtype=dtype)
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self.array = C.llama_token_data_array(
            ctypes.cast(self._data, ctypes.POINTER(C.llama_token_data)), n_vocab, -1, False)
        self.ref = ctypes.byref(self.array)

    def fill(self, logits: np.ndarray) -> None:
        v = self.view
        v["id"] = self._ids
        v["logit"] = logits
        v["p"] = 0.0
        a = self.array
        a.data = ctypes.cast(self._data, ctypes.POINTER(self.bindings.llama_token_data))
        a.size = self.n_vocab
        a.selected = -1
        a.sorted = False

    def selected_token(self) -> int:
        a = self.array
        if a.selected < 0 or a.selected >= a.size:
            raise LlamaError("the sampler chain selected no token (every candidate was filtered out)")
        return int(a.data[a.selected].id)


class LlamaTokenDataArray(TokenCandidates):
    """llama-cpp-python's name and attributes for :class:`TokenCandidates`: ``candidates`` (the
    ``llama_token_data_array``), ``candidates_data`` (its NumPy view) and ``copy_logits``."""

    def __init__(self, *, n_vocab: int) -> None:
        n = int(n_vocab)
        if n <= 0:
            raise ValueError(f"n_vocab must be positive, got {n_vocab}")
        super().__init__(n)
        self.candidates = self.array
        self.candidates_data = self.view
        self.default_candidates_data_id = self._ids

    def copy_logits(self, logits: np.ndarray) -> None:
        row = np.asarray(logits, dtype=np.float32)
        if row.shape != (self.n_vocab,):
            raise ValueError(f"logits must have shape ({self.n_vocab},), got {row.shape}")
        self.fill(row)


def normalize_embedding(embedding: Sequence[float]) -> list[float]:
    """``embedding`` scaled to unit L2 norm (an all-zero row stays zero), as a list
    (llama-cpp-python's helper, over :func:`llama_cpp._core.normalize.normalize_embeddings`)."""

    return normalize_embeddings(np.asarray(embedding, dtype=np.float64), 2).tolist()


# upstream's module path for these classes (reprs, pickles): llama_cpp._internals re-exports them
for _cls in (LlamaSampler, TokenCandidates, LlamaTokenDataArray):
    _cls.__module__ = "llama_cpp._internals"
