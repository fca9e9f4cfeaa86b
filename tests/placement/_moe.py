"""A tiny mixture-of-experts model for the placement tests: llama arch (llama.cpp's Mixtral form,
``{arch}.expert_count``), 4 layers of 4 experts with 2 used per token, SentencePiece vocab, f32."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from build_tools.fixtures import vocab as _vocab
from build_tools.fixtures._gguf import GGUFBuilder

N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF, N_EXPERT, N_EXPERT_USED = 64, 4, 4, 2, 64, 4, 2
EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def moe_model(path: Path, seed: int = 0, n_ctx_train: int = 65536, n_embd: int = N_EMBD, n_ff: int = N_FF,
              n_expert: int = N_EXPERT) -> Path:
    """``n_embd``/``n_ff``/``n_expert`` scale the experts (the default is about 2 MiB in all)."""
    v = _vocab.spm_vocab()
    b = GGUFBuilder("llama", seed)
    b.string("general.name", "tiny-llama-moe")
    head_dim = n_embd // N_HEAD
    for key, value in (("context_length", n_ctx_train), ("embedding_length", n_embd), ("block_count", N_LAYER),
                       ("feed_forward_length", n_ff), ("attention.head_count", N_HEAD),
                       ("attention.head_count_kv", N_HEAD_KV), ("rope.dimension_count", head_dim),
                       ("vocab_size", len(v)), ("expert_count", n_expert), ("expert_used_count", N_EXPERT_USED)):
        b.u32("{arch}." + key, value)
    b.f32("{arch}.rope.freq_base", 10000.0)
    b.f32("{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    b.u32("general.file_type", 0)
    b.normal("token_embd.weight", (len(v), n_embd), 1.0)
    s = 1.0 / np.sqrt(n_embd)
    for il in range(N_LAYER):
        p = f"blk.{il}."
        b.near_ones(p + "attn_norm.weight", (n_embd,))
        b.normal(p + "attn_q.weight", (N_HEAD * head_dim, n_embd), 2.0 * s)
        b.normal(p + "attn_k.weight", (N_HEAD_KV * head_dim, n_embd), 2.0 * s)
        b.normal(p + "attn_v.weight", (N_HEAD_KV * head_dim, n_embd), s)
        b.normal(p + "attn_output.weight", (n_embd, N_HEAD * head_dim), s)
        b.near_ones(p + "ffn_norm.weight", (n_embd,))
        b.normal(p + "ffn_gate_inp.weight", (n_expert, n_embd), 4.0 * s)  # decisive routing
        b.normal(p + "ffn_gate_exps.weight", (n_expert, n_ff, n_embd), s)
        b.normal(p + "ffn_up_exps.weight", (n_expert, n_ff, n_embd), s)
        b.normal(p + "ffn_down_exps.weight", (n_expert, n_embd, n_ff), 1.0 / np.sqrt(n_ff))
    b.near_ones("output_norm.weight", (n_embd,))
    out = b.rng.standard_normal((len(v), n_embd), dtype=np.float32) * np.float32(2.0 * s)
    out[v.non_text_ids(), :] = 0.0  # plain text only: greedy output never stops early on a control token
    b.tensor("output.weight", out)
    b.tokenizer(v, add_bos=True)
    return b.write(path)
