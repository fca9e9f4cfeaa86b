"""Speculative decoding inside the server's slot engine: one draft per slot, one target decode for all.

Per step, every generating slot proposes a draft from its own history (the n-gram types, upstream's
prompt lookup, ``draft-simple`` over ONE draft context holding one sequence per slot: each drafted
position is one draft decode for all drafting slots; or the slot's per-sequence drafter). The slot
engine then decodes every slot's ``[pending, d_0..d_{k-1}]`` rows
in its one ``llama_decode`` (all rows outputs), picks at each row with the slot's own sampler and
grammar until the first pick that differs from the draft (*sample and match*: the output is the
plain slot's, greedy or seeded) and removes the rejected rows from that slot's sequence
(``llama_memory_seq_rm``).

A recurrent or hybrid target cannot drop the last positions of a recurrent state (its context has no
``n_rs_seq`` snapshots here): a drafting slot's recurrent state is saved before the decode
(``llama_state_seq_*`` with ``PARTIAL_ONLY``, per sequence) and restored when a draft token is
rejected; its kept tokens are then decoded again in front of its rows in the next step's batch, so
the rollback costs no decode of its own.

``draft-eagle3``, ``draft-mtp``, ``draft-dflash`` and ``draft-dspark`` (the table's ``PER_SEQUENCE``
rows) keep a drafter per slot sequence, with its own draft context, built once and kept between that
slot's requests: after each target decode it is told the tokens of its sequence and their first entry
in the batch, so it reads its own rows (layer features; ``draft-mtp``'s NextN hidden states, paired
with the next token as llama.cpp's MTP input; llama.cpp hands per-token outputs out in batch order,
also where a recurrent or hybrid target's micro-batches took the tokens in another order). A drafter
that raises ends only its own request (:class:`DrafterFailed`).

What cannot run here (see :func:`slot_unsupported`) is what the table's rows say (``not_in_slots``;
``slot_check`` for a model file; a row without a constructor for the slots): such models stay on the
serial engine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._errors import DecodeError, SpeculativeError
from ..llama_cpp import LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
from .batch import SeqCheckpoint
from .config import INHERITED_PARAMS
from .decoder import verify_draft
from .drafters import with_prompt_lookup
from .engine import close_drafters, propose, share_threadpools
from .ngram import PromptLookup
from .registry import BATCHED, PER_SEQUENCE, PER_SLOT, DrafterArgs, rows_of
from .slot_drafts import BatchedDraftModel
from .stats import SpeculativeStats

log = logging.getLogger("llama_cpp.speculative")

_TOP_K = 10  # llama.cpp's top-k draft sampler (draft_p_min compares the top token's share of these)


def slot_unsupported(config: Any, model_path: Any = None) -> str | None:
    """Why ``config`` (a :class:`~llama_cpp.speculative.SpecConfig`) cannot speculate in slots; None if it can:
    its rows' ``not_in_slots``, then (given ``model_path``, the served file) their ``slot_check``."""
    rows = rows_of(config)
    refused = [r for r in rows if r.not_in_slots]
    if refused:
        return f"{', '.join(r.name for r in refused)} {refused[0].not_in_slots}"
    unbuilt = [r.name for r in rows if (r.batched if r.slots == BATCHED else r.build) is None]
    if unbuilt:
        return f"{', '.join(unbuilt)}: its table row has no constructor for the slots: served one request at a time"
    if model_path is not None:
        for r in rows:
            why = r.slot_check(model_path) if r.slot_check is not None else None
            if why is not None:
                return why
    return None


class SlotDrafts:
    """One request's drafters (its own n-gram tables, its slot's per-sequence drafters, in priority
    order), those of them that read the target's rows, and counters."""

    __slots__ = ("drafters", "observers", "stats")

    def __init__(self, drafters: list[Any]) -> None:
        self.drafters = drafters
        self.observers = [d for d in drafters if d.observes]
        self.stats = SpeculativeStats()


class SlotSpeculation:
    """The drafting side of speculation in the slot engine (one per served model).

    ``config`` is the model's :class:`~llama_cpp.speculative.SpecConfig` (or None with only
    upstream's ``prompt_lookup`` callable). :meth:`start` gives a request its drafters,
    :meth:`propose` drafts for every generating slot of a step, :meth:`accepted` reports a verify.
    """

    def __init__(self, model: Any, target_ctx: Any, n_slots: int, config: Any = None,
                 prompt_lookup: Any = None) -> None:

        if config is None and prompt_lookup is None:
            raise SpeculativeError("SlotSpeculation needs a SpecConfig or a prompt_lookup draft callable")
        given = config
        if prompt_lookup is not None:  # upstream's object drafts as the prompt-lookup row, first (as in Llama)
            config = with_prompt_lookup(config, prompt_lookup)
        # the types reported: the configured ones (the object's row alone when none are)
        self.types: list[str] = [t.value for t in (given if given is not None else config).types]
        reason = slot_unsupported(config)
        if reason is not None:
            raise SpeculativeError(reason)
        self.config = config
        self.model = model
        self.n_vocab = int(model.n_vocab)
        self.prompt_lookup = prompt_lookup
        self.rows = rows = rows_of(config)  # read once: the per-sequence drafters and requests follow them
        # what each row's drafters share, loaded once (ngram-cache's files) or filled by the first
        # drafter built (a per-sequence row's draft model)
        self._shared = {row.name: row.share(config) if row.share is not None else {} for row in rows}
        # the per-sequence rows' drafters (draft-eagle3, draft-mtp, draft-dflash, draft-dspark), slot by slot
        self.seq_drafters: list[list[Any]] = [[] for _ in range(n_slots)]
        # the BATCHED rows' objects, in priority order (each drafts for every slot at once)
        self.batched: list[Any] = []
        seq_rows = [r for r in rows if r.slots == PER_SEQUENCE]
        if seq_rows:
            tp = target_ctx.params
            inherited = {n: getattr(tp, n) for n in INHERITED_PARAMS if hasattr(tp, n)}
            inherited["n_ctx"] = max(1, target_ctx.n_ctx() // n_slots)  # a slot's share, as its positions are
            try:
                for seq in range(n_slots):
                    for row in seq_rows:
                        args = DrafterArgs(model, config, target_ctx, ctx_params=inherited, seq=seq,
                                           shared=self._shared[row.name])
                        self.seq_drafters[seq].append(row.build(args))
                        ctx = getattr(self.seq_drafters[seq][-1], "ctx", None)
                        if ctx is not None:  # its draft context runs on the target's threadpools
                            share_threadpools(target_ctx, ctx)
            except BaseException:
                self.close()
                raise
        try:
            for row in rows:
                if row.slots == BATCHED and row.batched is not None:
                    self.batched.append(row.batched(DrafterArgs(model, config, target_ctx), n_slots))
        except BaseException:
            self.close()
            raise
        # whether a saved prompt state restored into a slot serves its drafters (the engine's prompt cache)
        self.saved_prompts = all(getattr(d, "uses_saved_prompts", True) for ds in self.seq_drafters for d in ds)
        self.n_max = config.n_max
        self.stats = SpeculativeStats()  # every request's, since start
        # recurrent state rolls back through one checkpoint per sequence
        self.checkpoints: list[SeqCheckpoint] | None = None
        if model.is_recurrent() or model.is_hybrid():
            self.checkpoints = [SeqCheckpoint(target_ctx, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
                                for seq in range(n_slots)]

    def close(self) -> None:
        for ds in self.seq_drafters:
            close_drafters(ds)
            ds.clear()
        for b in self.batched:
            b.close()
        self.batched = []

    @property
    def observes(self) -> bool:
        """Whether a slot's drafters read the target's per-token rows (see :meth:`observe`)."""
        return any(d.observes for ds in self.seq_drafters for d in ds)

    def observe(self, sd: SlotDrafts, tokens: Sequence[int], pos0: int, first: int) -> None:
        """The target decoded ``tokens`` of ``sd``'s slot at ``pos0..``, batch entries ``first..``
        (:class:`DrafterFailed` names a drafter that raises: the engine ends that request)."""
        for d in sd.observers:
            _call(d, d.observe, tokens, pos0, first)

    def _slot_drafters(self, seq: int) -> list[Any]:
        """One request's drafters: every per-slot row (built now) and per-sequence row (``seq``'s, kept),
        in the table's order."""
        cfg = self.config
        out: list[Any] = []
        kept = iter(self.seq_drafters[seq])
        for row in self.rows:
            if row.slots == PER_SEQUENCE:
                out.append(next(kept))
            elif row.slots == PER_SLOT and row.build is not None:
                out.append(row.build(DrafterArgs(self.model, cfg, prompt_lookup=self.prompt_lookup,
                                                 shared=self._shared[row.name])))
        return out

    def start(self, prompt: Sequence[int], seq: int = 0) -> SlotDrafts:
        """A new request's drafters on sequence ``seq``, told its prompt (:class:`DrafterFailed` names one
        that raises)."""
        sd = SlotDrafts(self._slot_drafters(seq))
        for d in sd.drafters:
            _call(d, d.begin, prompt)
        return sd

    def propose(self, items: list[tuple[SlotDrafts, int, list[int], int, int]]
                ) -> list[tuple[list[int], Any] | DrafterFailed]:
        """``(draft, source)`` for each ``(drafts, seq, history, id_last, k_max)``: the first drafter (in
        llama.cpp's priority order) with a non-empty draft; the batched objects last, each for all the
        slots still without a draft at once. A drafter that raises fails only the requests it drafts
        for: their entry is a :class:`DrafterFailed` naming it (the engine ends those requests with
        it), and the other slots draft on."""
        out: list[tuple[list[int], Any] | DrafterFailed] = []
        for sd, _seq, kv, id_last, k_max in items:
            out.append(self._first_draft(sd.drafters, kv, id_last, k_max) if k_max > 0 else ([], None))
        for b in self.batched:
            need = [i for i, it in enumerate(items) if _undrafted(out[i]) and it[4] > 0]
            if not need:
                break
            try:
                drafts = b.draft([(items[i][1], items[i][2], items[i][3], items[i][4]) for i in need])
            except Exception as exc:  # the batched object drafted for these slots: they alone end
                failed = DrafterFailed(_kind_of(b), exc)
                for i in need:
                    out[i] = failed
                continue
            for i, d in zip(need, drafts):
                if d:
                    out[i] = (d, b)
        return out

    def _first_draft(self, drafters: Sequence[Any], kv: list[int], id_last: int,
                     k_max: int) -> tuple[list[int], Any] | DrafterFailed:
        """:func:`~llama_cpp.speculative.engine.propose` over one request's drafters, a drafter's exception
        returned as a :class:`DrafterFailed` naming it."""
        for d in drafters:
            try:
                draft, src = _call(d, propose, (d,), kv, id_last, k_max, self.n_vocab)
            except DrafterFailed as failed:
                return failed
            if draft:
                return draft, src
        return [], None

    def accepted(self, sd: SlotDrafts, src: Any, n_drafted: int, n_accepted: int, n_out: int,
                 rollback: str | None = None, replayed: int = 0) -> None:
        """One verify of slot drafts ``sd``: ``n_accepted`` of ``n_drafted`` kept, ``n_out`` tokens emitted;
        ``rollback`` is ``"partial"`` (rows removed) or ``"checkpoint"`` (``replayed`` tokens to decode again)."""
        if src is not None and src not in self.batched:
            _call(src, src.accept, n_accepted)
        kind = getattr(src, "kind", None)
        for st in (sd.stats, self.stats):
            st.steps += 1
            st.generated += n_out
            st.count_draft(n_drafted, n_accepted, kind)
            if self.checkpoints is not None and n_drafted:
                st.checkpoints += 1
            if rollback == "partial":
                st.rollbacks_partial += 1
            elif rollback == "checkpoint":
                st.rollbacks_checkpoint += 1
                st.replayed_tokens += replayed


class DrafterFailed(SpeculativeError):
    """A slot's drafter raised (in ``begin``, ``draft``, ``accept`` or ``observe``): the request(s) it
    drafts for end with this error; the other slots go on."""

    def __init__(self, kind: str, exc: BaseException) -> None:
        super().__init__(f"the {kind} drafter failed: {type(exc).__name__}: {exc}")
        self.kind = kind
        self.__cause__ = exc


def _kind_of(drafter: Any) -> str:
    return str(getattr(drafter, "kind", type(drafter).__name__))


def _call(drafter: Any, method: Callable[..., Any], *args: Any) -> Any:
    """``method(*args)`` of ``drafter``, its exception raised as a :class:`DrafterFailed` naming it."""
    try:
        return method(*args)
    except Exception as exc:
        raise DrafterFailed(_kind_of(drafter), exc) from exc


def _undrafted(entry: tuple[list[int], Any] | DrafterFailed) -> bool:
    return not isinstance(entry, DrafterFailed) and not entry[0]


def verify_rows(pick: Callable[[Any, int], tuple[int, Any]], ctx: Any, first: int, draft: Sequence[int],
                is_eog: Callable[[int], bool]) -> tuple[list[int], list[Any], int]:
    """Pick at rows ``first..first+len(draft)`` until the first pick that is not the draft's (or an
    accepted end of generation): the tokens, copies of their rows (None where not asked) and how many
    drafted tokens they accept."""
    rows: list[Any] = []

    def sample(j: int) -> int:
        tok, row = pick(ctx, first + j)
        rows.append(None if row is None else np.array(row))
        return tok

    toks, n_acc = verify_draft(sample, draft, is_eog)
    return toks, rows, n_acc


def remove_rejected(ctx: Any, seq: int, pos: int) -> None:
    """Drop positions ``pos..`` of ``seq`` (rejected draft rows) from the target memory."""
    if not ctx.seq_rm(seq, pos, -1):
        raise DecodeError(f"the target memory refused to remove the rejected draft rows of sequence {seq} from "
                          f"position {pos}")


__all__ = ["BatchedDraftModel", "DrafterFailed", "PromptLookup", "SlotDrafts", "SlotSpeculation", "remove_rejected",
           "slot_unsupported", "verify_rows"]
