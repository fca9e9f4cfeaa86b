"""``GenerationSequence``: a ``Llama``'s one generation sequence (sequence 0 of its context).

It is the state the completion, token-stream and snapshot code works on, kept in one typed object
(``Llama.sequence``) instead of attributes of the facade: the tokens the context's memory holds, whether
the context's last logits are those of the last token, how many logits rows the last decode kept, the
speculative decoder generation runs through, and the sampling seed. Its methods keep the memory and
that record in step: evaluating, rewinding and re-evaluating for logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._compat.state import longest_token_prefix
from .._core.context import LlamaBatch, LlamaContext
from .._core.model import LlamaModel
from .._errors import ContextOverflowError
from ..speculative.decoder import SpeculativeDecoder
from . import sampling as _sampling
from .loop import TokenStep


class GenerationSequence:
    """Sequence 0 of a ``Llama``'s context and the record of what it holds.

    ``tokens`` are the tokens in memory (``Llama.input_ids``); ``fresh`` says the context's last logits
    are those of ``tokens[-1]``; ``n_outputs`` is the number of logits rows the last decode kept
    (``Llama.scores``); ``spec`` is the speculative decoder generation runs through (None: plain
    decoding); ``seed`` is the object's sampling seed. ``ctx``, ``batch`` and ``step`` are None for a
    ``vocab_only`` model (nothing to evaluate). Callers check the ``Llama`` is open first.
    """

    def __init__(self, model: LlamaModel, ctx: LlamaContext | None, *, seed: int) -> None:
        self.model = model
        self.ctx = ctx
        self.batch: LlamaBatch | None = LlamaBatch(ctx.n_batch(), 0, 1) if ctx is not None else None
        self.step: TokenStep | None = TokenStep(ctx) if ctx is not None else None
        self.tokens: list[int] = []
        self.fresh = False
        self.n_outputs = 0
        self.spec: SpeculativeDecoder | None = None
        self.seed = int(seed)
        # memory that cannot drop one position (recurrent, hybrid) is rebuilt to re-evaluate a token
        self.rebuilds_memory = model.is_recurrent() or model.is_hybrid()

    def close(self) -> None:
        """Free the batches and the speculative decoder (idempotent)."""
        for obj in (self.batch, self.step, self.spec):
            if obj is not None:
                obj.close()
        self.batch = self.step = self.spec = None
        self.ctx = None

    def replace_spec(self, spec: SpeculativeDecoder | None) -> None:
        """Run generation through ``spec`` (closing the decoder it replaces)."""
        old, self.spec = self.spec, spec
        if old is not None and old is not spec:
            old.close()

    def next_seed(self, seed: int | None, convention: str) -> int:
        """The seed of one sampling call: an explicit seed becomes the object's seed (-1: random);
        otherwise the object's seed advances as the sampling ``convention`` says (so repeated calls
        differ, and a saved state's seed replays them)."""
        if seed is not None:
            self.seed = int(seed)
        else:
            self.seed = _sampling.next_seed(self.seed, convention)
        return self.seed

    def _context(self) -> LlamaContext:
        ctx = self.ctx
        assert ctx is not None, "the Llama checks it has a context before evaluating"
        return ctx

    def check_prompt(self, tokens: Sequence[int]) -> None:
        """Refuse an empty prompt, an out-of-vocabulary id, or one that leaves no room to generate."""
        n_ctx = self._context().n_ctx()
        if not tokens:
            raise ValueError("the prompt is empty (and the model adds no BOS token): give at least one token")
        self.model.check_tokens(tokens, "prompt token")
        if len(tokens) >= n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(tokens)} tokens; the context holds n_ctx={n_ctx} (and needs room "
                "for at least one generated token): shorten the prompt or create Llama(n_ctx=...) larger")

    def decode(self, tokens: Sequence[int], start_pos: int, all_logits: bool) -> None:
        """Evaluate ``tokens`` at ``start_pos`` in ``n_batch`` chunks (the last token's logits, or every
        token's with ``all_logits``); the caller records them in ``tokens``."""
        ctx, batch = self._context(), self.batch
        assert batch is not None
        if self.spec is not None:
            self.spec.invalidate()  # the decoder's own contexts do not see these tokens
        n_batch = ctx.n_batch()
        n = len(tokens)
        self.fresh = False
        for i in range(0, n, n_batch):
            chunk = tokens[i:i + n_batch]
            batch.clear()
            last = i + n_batch >= n
            batch.add_sequence(np.asarray(chunk, dtype=np.int32), 0, start_pos + i,
                               logits=True if all_logits else ("last" if last else False))
            ctx.decode(batch)
            self.n_outputs = len(chunk) if all_logits else 1

    def extend(self, tokens: Sequence[int], all_logits: bool) -> None:
        """Evaluate ``tokens`` after those in memory (``Llama.eval``)."""
        ctx = self._context()
        self.model.check_tokens(tokens)
        if len(self.tokens) + len(tokens) > ctx.n_ctx():
            raise ContextOverflowError(f"{len(self.tokens)} + {len(tokens)} tokens exceed n_ctx={ctx.n_ctx()}")
        if tokens:
            self.decode(tokens, len(self.tokens), all_logits)
            self.tokens.extend(tokens)
            self.fresh = True

    def refresh_logits(self, all_logits: bool) -> None:
        """Make the last token's logits current again (after a restore or a truncation): evaluate it
        once more, or, where the memory cannot drop one position (recurrent), all of them."""
        if self.fresh or not self.tokens:
            return
        ctx = self._context()
        last = len(self.tokens) - 1
        if ctx.seq_rm(0, last, -1):
            self.decode(self.tokens[last:], last, False)
        else:
            ctx.memory_clear(True)
            self.decode(self.tokens, 0, all_logits)
        self.fresh = True

    def prepare(self, tokens: Sequence[int], reuse_prefix: bool, all_logits: bool) -> int:
        """Make the memory hold exactly ``tokens`` with the logits of the last one; returns how many
        of them were kept from memory.

        The longest prefix already in memory is kept; when the memory holds exactly ``tokens`` with
        their logits, nothing is evaluated. Memory that cannot drop a suffix (recurrent) is rebuilt.
        """
        ctx = self._context()
        # a decode cut short (Ctrl-C, an exception) leaves memory and the record of it apart: trust
        # neither beyond where they agree
        held = ctx.seq_pos_max(0) + 1
        if held != len(self.tokens):
            del self.tokens[max(held, 0):]
            self.fresh = False
        n_past = 0
        if reuse_prefix and self.tokens:
            n_past = longest_token_prefix(self.tokens, tokens)
            if n_past == len(tokens) == len(self.tokens) and self.fresh:
                return n_past
            n_past = min(n_past, len(tokens) - 1)  # the last prompt token is evaluated for its logits
        if n_past < len(self.tokens) or held > n_past:
            if n_past == 0 or not ctx.seq_rm(0, n_past, -1):
                ctx.memory_clear(True)
                n_past = 0
            del self.tokens[n_past:]
        rest = list(tokens[n_past:])
        self.decode(rest, n_past, all_logits)
        self.tokens.extend(rest)
        self.fresh = True
        return n_past

    def rewind(self, n: int, all_logits: bool) -> None:
        """Keep only the first ``n`` tokens (``Llama.n_tokens = n``)."""
        if not 0 <= n <= len(self.tokens):
            raise ValueError(f"n_tokens must be in [0, {len(self.tokens)}] (the tokens evaluated), got {n}")
        if n == len(self.tokens):
            return
        ctx = self._context()
        self.fresh = False
        if self.spec is not None:
            self.spec.invalidate()
        if n == 0 or not ctx.seq_rm(0, n, -1):
            ctx.memory_clear(True)  # memory that cannot drop a suffix: evaluated again when needed
            kept, self.tokens = self.tokens[:n], []
            if kept:
                self.decode(kept, 0, all_logits)
                self.tokens = kept
                self.fresh = True
            return
        del self.tokens[n:]

    def clear(self) -> None:
        """Forget the tokens and clear the memory (and the decoder's)."""
        self.tokens.clear()
        self.fresh = False
        if self.ctx is not None:
            self.ctx.memory_clear(True)
        if self.spec is not None:
            self.spec.reset()

    def logits_rows(self) -> np.ndarray:
        """The logits rows the context holds for ``tokens`` (``Llama.scores``): none unless ``fresh``."""
        ctx = self.ctx
        if not (self.fresh and self.tokens and ctx is not None):
            return np.zeros((0, self.model.n_vocab), dtype=np.single)
        k = max(1, self.n_outputs)
        return np.stack([np.array(ctx.logits_ith(i), dtype=np.single) for i in range(-k, 0)])


__all__ = ["GenerationSequence"]
