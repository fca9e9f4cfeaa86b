"""The engines that run requests for one model: continuous batching over slots, or one at a time.

:class:`SlotEngine` (``slots.py``, whose docstring walks through one scheduler step) batches
every slot's tokens into one decode per step; a request's greedy output is the one
``Llama.create_completion`` gives for it alone.

:class:`EmbeddingEngine` (``embeddings.py``) packs the inputs of concurrent embedding and reranking
requests into shared decodes. :class:`SerialEngine` runs one request at a time through ``Llama`` itself
(a projector model that speculates, a speculative type the table's rows refuse in slots, or
``n_parallel=0``). All bound their waiting queue: :class:`QueueFull`.

The package by responsibility: :mod:`.jobs` (a request's channel and errors), :mod:`.state` (a
slot's state), :mod:`.slots` (the scheduler and its batch step), :mod:`.media` (image and audio
chunks in a slot), :mod:`.speculation` (drafts and their verify in the slots), :mod:`.prompt_cache`
(saved prompt states the slots share), :mod:`.embeddings` (batched embeddings), :mod:`.serial` (one at
a time), :mod:`.lifecycle` (shutdown).
"""

from .embeddings import EmbeddingEngine, EmbedRequest
from .jobs import Cancelled, GenRequest, Job, Outbox, QueueFull, ShuttingDown, completion_chunk
from .serial import SerialEngine, collect_stats_stream
from .slots import SlotEngine

__all__ = ["Cancelled", "EmbedRequest", "EmbeddingEngine", "GenRequest", "Job", "Outbox", "QueueFull", "SerialEngine",
           "ShuttingDown", "SlotEngine", "collect_stats_stream", "completion_chunk"]
