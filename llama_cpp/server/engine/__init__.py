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

The package by responsibility: :mod:`.jobs` (a request's channel and errors), :mod:`.state` (a
slot's state), :mod:`.slots` (the scheduler and its batch step), :mod:`.speculation` (drafts and
their verify in the slots), :mod:`.prompt_cache` (saved prompt states the slots share), :mod:`.serial` (one at a time), :mod:`.lifecycle` (shutdown).
"""

from .jobs import Cancelled, GenRequest, Job, Outbox, QueueFull, ShuttingDown, completion_chunk
from .serial import SerialEngine, collect_stats_stream
from .slots import SlotEngine

__all__ = ["Cancelled", "GenRequest", "Job", "Outbox", "QueueFull", "SerialEngine", "ShuttingDown", "SlotEngine",
           "collect_stats_stream", "completion_chunk"]
