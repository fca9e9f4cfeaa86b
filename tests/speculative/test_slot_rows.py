"""What the server's slots rely on to give each slot's feature drafter its own target rows: in a batch
of several sequences, the layer inputs llama.cpp returns for entry ``i`` are entry ``i``'s
(:meth:`llama_cpp.speculative.features.TargetLayers.rows` with ``first``), also on the hybrid
``qwen35_mtp`` target, whose micro-batches take the same number of tokens from each sequence (a
sequence with more tokens than the others is decoded partly after them)."""

from __future__ import annotations

import numpy as np

from build_tools.fixtures import fixture_path

SPANS = [(0, [5, 9, 12, 7, 30]), (1, [11]), (2, [40, 41, 42])]


def _layer_rows(path: str, shared: bool) -> list[np.ndarray]:
    """The inputs of layers 0 and 1 for each span's tokens: all spans in one batch, or each alone."""
    from llama_cpp._core.context import LlamaBatch, LlamaContext
    from llama_cpp._core.model import LlamaModel
    from llama_cpp.speculative.features import TargetLayers

    with LlamaModel(path) as model:
        ctx = LlamaContext(model, n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=4, kv_unified=True,
                           n_threads=1, n_threads_batch=1)
        tl = TargetLayers(model.bindings, ctx, [0, 1], model.n_embd())
        batch = LlamaBatch(64, 0, 1)
        try:
            out = []
            if not shared:
                for seq, toks in SPANS:
                    batch.clear()
                    batch.add_sequence(np.asarray(toks, dtype=np.int32), seq, 0, logits=False)
                    ctx.decode(batch)
                    out.append(tl.rows(len(toks)))
                return out
            firsts = [batch.add_sequence(np.asarray(toks, dtype=np.int32), seq, 0, logits=False)[0]
                      for seq, toks in SPANS]
            ctx.decode(batch)
            return [tl.rows(len(toks), f) for f, (_, toks) in zip(firsts, SPANS)]
        finally:
            tl.close()
            batch.close()
            ctx.close()


def test_rows_of_a_shared_batch_are_each_sequences_own():
    path = str(fixture_path("qwen35_mtp", form="echo"))
    for a, b in zip(_layer_rows(path, False), _layer_rows(path, True)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
