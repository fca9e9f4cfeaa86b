"""Upstream's per-token Python hooks: ``logits_processor(input_ids, scores) -> scores`` and
``stopping_criteria(input_ids, logits) -> bool``, with NumPy arrays as upstream passes them
(``input_ids`` an ``np.intc`` array, ``scores``/``logits`` an ``np.single`` row of ``n_vocab``).

:class:`TokenHooks` holds one generation's hooks and its token history; the sampler
(:func:`llama_cpp._generation.sampling.token_picker`) runs the processors before the native chain, and
:class:`HookedSource` checks the criteria once per token. A hook that raises, returns ``None``,
an array of the wrong shape, or (a criterion) something that is not a bool, is a
:class:`~llama_cpp._errors.CallbackError` naming the hook.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .._errors import CallbackError

LogitsProcessor = Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], npt.NDArray[np.single]]
StoppingCriteria = Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], bool]


class LogitsProcessorList(list):  # type: ignore[type-arg]
    """Processors applied in order, each to the previous one's scores."""

    def __call__(self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]) -> npt.NDArray[np.single]:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


class StoppingCriteriaList(list):  # type: ignore[type-arg]
    """Stop when any criterion is true."""

    def __call__(self, input_ids: npt.NDArray[np.intc], logits: npt.NDArray[np.single]) -> bool:
        return any([bool(c(input_ids, logits)) for c in self])


class MinTokensLogitsProcessor:
    """Forbid ``token_eos`` until ``min_tokens`` tokens have been generated after the prompt."""

    def __init__(self, min_tokens: int, token_eos: int) -> None:
        self.min_tokens = int(min_tokens)
        self.token_eos = int(token_eos)
        self.prompt_tokens: int | None = None

    def __call__(self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]) -> npt.NDArray[np.single]:
        if self.prompt_tokens is None:
            self.prompt_tokens = len(input_ids)
        if len(input_ids) - self.prompt_tokens < self.min_tokens:
            scores[self.token_eos] = -np.inf
        return scores


def _callables(obj: Any, what: str) -> list[Callable[..., Any]]:
    """The hooks in ``obj``: a list of callables (as upstream's ``*List`` classes) or one callable."""
    if obj is None:
        return []
    items = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    for f in items:
        if not callable(f):
            raise TypeError(f"{what} must be a callable or a list of callables, got {type(f).__name__}")
    return items


def _name(f: Any) -> str:
    return getattr(f, "__qualname__", None) or type(f).__name__


class TokenHooks:
    """One generation's processors, criteria and token history (prompt, then accepted tokens)."""

    def __init__(self, prompt: Sequence[int], n_vocab: int, logits_processor: Any = None,
                 stopping_criteria: Any = None) -> None:
        self.processors = _callables(logits_processor, "logits_processor")
        self.criteria = _callables(stopping_criteria, "stopping_criteria")
        self.n_vocab = int(n_vocab)
        self.n_prompt = len(prompt)
        self._ids = np.zeros(max(16, 2 * len(prompt) + 64), dtype=np.intc)
        self._ids[: self.n_prompt] = np.asarray(prompt, dtype=np.intc)
        self.n = self.n_prompt

    @classmethod
    def build(cls, prompt: Sequence[int], n_vocab: int, logits_processor: Any,
              stopping_criteria: Any) -> TokenHooks | None:
        """The hooks, or None when there are none (the fully native path)."""
        if logits_processor is None and stopping_criteria is None:
            return None
        h = cls(prompt, n_vocab, logits_processor, stopping_criteria)
        return h if (h.processors or h.criteria) else None

    def history(self, n: int | None = None) -> npt.NDArray[np.intc]:
        """The first ``n`` tokens (all by default) as a read-only ``np.intc`` view."""
        v = self._ids[: self.n if n is None else n]
        v.flags.writeable = False
        return v

    def push(self, token: int) -> None:
        if self.n == len(self._ids):
            grown = np.zeros(2 * len(self._ids), dtype=np.intc)
            grown[: self.n] = self._ids
            self._ids = grown
        self._ids[self.n] = token
        self.n += 1

    def process(self, row: np.ndarray) -> npt.NDArray[np.single]:
        """The logits row after every processor (a copy: processors may change it in place)."""
        scores = np.array(row, dtype=np.single)
        ids = self.history()
        for f in self.processors:
            try:
                out = f(ids, scores)
            except Exception as exc:
                raise CallbackError(f"logits_processor {_name(f)} raised {type(exc).__name__}: {exc}") from exc
            if out is None:
                raise CallbackError(f"logits_processor {_name(f)} returned None: return the scores array "
                                    "(changed in place or a new one)")
            try:
                out = np.asarray(out, dtype=np.single)
            except (TypeError, ValueError) as exc:
                raise CallbackError(f"logits_processor {_name(f)} returned {type(out).__name__}, not an array "
                                    "of scores") from exc
            if out.shape != (self.n_vocab,):
                raise CallbackError(f"logits_processor {_name(f)} returned an array of shape {out.shape}; "
                                    f"it must keep the shape ({self.n_vocab},)")
            # -inf bans a token; NaN or +inf would make llama.cpp's sampling undefined
            if np.isnan(out).any() or np.isposinf(out).any():
                raise CallbackError(f"logits_processor {_name(f)} returned NaN or +inf scores: return finite "
                                    "scores (-inf bans a token)")
            scores = out
        return scores

    def should_stop(self, n: int, logits: np.ndarray | None) -> bool:
        """Whether a criterion is true for the first ``n`` tokens and the last token's logits."""
        ids = self.history(n)
        row = np.asarray(logits, dtype=np.single) if logits is not None else np.zeros(self.n_vocab, np.single)
        for f in self.criteria:
            try:
                r = f(ids, row)
            except Exception as exc:
                raise CallbackError(f"stopping_criteria {_name(f)} raised {type(exc).__name__}: {exc}") from exc
            if not isinstance(r, (bool, np.bool_)):
                raise CallbackError(f"stopping_criteria {_name(f)} returned {type(r).__name__}; it must return "
                                    "a bool")
            if r:
                return True
        return False


class HookedSource:
    """A token source with the history kept and the stopping criteria checked per token.

    A token for which a criterion is true ends the generation without being yielded (as upstream);
    ``stopped`` then tells the completion its finish reason is ``stop``.
    """

    def __init__(self, source: Iterable[tuple[int, Any]], hooks: TokenHooks) -> None:
        self._source = source
        self.hooks = hooks
        self.stopped = False

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        h = self.hooks
        n = h.n_prompt
        try:
            for tok, row in self._source:
                n += 1
                if h.n < n:  # the picker did not record it (no processors)
                    h.push(tok)
                if h.criteria and h.should_stop(n, row):
                    self.stopped = True
                    return
                yield tok, row
        finally:
            close = getattr(self._source, "close", None)
            if close is not None:
                close()


__all__ = ["HookedSource", "LogitsProcessor", "LogitsProcessorList", "MinTokensLogitsProcessor",
           "StoppingCriteria", "StoppingCriteriaList", "TokenHooks"]


# upstream's path for its classes (reprs, pickles); llama_cpp.llama re-exports them
for _cls in (LogitsProcessorList, StoppingCriteriaList, MinTokensLogitsProcessor):
    _cls.__module__ = "llama_cpp.llama"
