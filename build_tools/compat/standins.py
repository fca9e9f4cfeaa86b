"""Generated stand-ins for the Hugging Face models upstream's tests download.

Each repo/file upstream's fixtures ask for maps to a model of the same kind made by the project's
fixture generators: a tiny llama transformer, a tiny qwen35 hybrid (attention + recurrent
layers), a tiny BERT embedding model, and a tiny recurrent Mamba (generated here: the fixtures
package has no pure recurrent model). They are untrained: tests that need a real model's
knowledge are deselected by :mod:`.suite`.
"""

from __future__ import annotations

import hashlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..common.paths import cache_root
from ..fixtures import fixture_path
from ..fixtures import vocab as _vocab
from ..fixtures._gguf import GGUFBuilder
from ..fixtures.models import _shape_head

N_EMBD = 64
N_LAYER = 2
D_STATE = 16
D_CONV = 4
DT_RANK = 4


def tiny_mamba(path: Path, seed: int = 0) -> Path:
    """A 2-layer Mamba (recurrent, no attention), n_embd 64, d_inner 128, the fixtures' SPM vocab."""
    v = _vocab.spm_vocab()
    n_vocab, d_inner = len(v), 2 * N_EMBD
    b = GGUFBuilder("mamba", seed)
    b.string("general.name", "tiny-mamba")
    b.u32("general.file_type", 0)
    b.u32("{arch}.context_length", 4096)
    b.u32("{arch}.embedding_length", N_EMBD)
    b.u32("{arch}.block_count", N_LAYER)
    b.u32("{arch}.feed_forward_length", 0)
    b.u32("{arch}.attention.head_count", 0)
    b.u32("{arch}.ssm.conv_kernel", D_CONV)
    b.u32("{arch}.ssm.inner_size", d_inner)
    b.u32("{arch}.ssm.state_size", D_STATE)
    b.u32("{arch}.ssm.time_step_rank", DT_RANK)
    b.f32("{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    b.u32("{arch}.vocab_size", n_vocab)
    b.normal("token_embd.weight", (n_vocab, N_EMBD), 1.0)
    for il in range(N_LAYER):
        p = f"blk.{il}."
        b.near_ones(p + "attn_norm.weight", (N_EMBD,))
        b.normal(p + "ssm_in.weight", (2 * d_inner, N_EMBD), 1.0 / np.sqrt(N_EMBD))
        b.normal(p + "ssm_conv1d.weight", (d_inner, D_CONV), 1.0 / np.sqrt(D_CONV))
        b.normal(p + "ssm_conv1d.bias", (d_inner,), 0.1)
        b.normal(p + "ssm_x.weight", (DT_RANK + 2 * D_STATE, d_inner), 1.0 / np.sqrt(d_inner))
        b.normal(p + "ssm_dt.weight", (d_inner, DT_RANK), 1.0 / np.sqrt(DT_RANK))
        b.tensor(p + "ssm_dt.bias", np.full((d_inner,), -2.0, dtype=np.float32)
                 + b.rng.standard_normal(d_inner, dtype=np.float32) * np.float32(0.1))
        # A = -exp(A_log) with A_log = log(1..d_state), as Mamba initialises it
        a = -np.tile(np.arange(1, D_STATE + 1, dtype=np.float32), (d_inner, 1))
        b.tensor(p + "ssm_a", a)
        b.ones(p + "ssm_d", (d_inner,))
        b.normal(p + "ssm_out.weight", (N_EMBD, d_inner), 1.0 / np.sqrt(d_inner))
    b.near_ones("output_norm.weight", (N_EMBD,))
    head = b.rng.standard_normal((n_vocab, N_EMBD), dtype=np.float32) * np.float32(2.0 / np.sqrt(N_EMBD))
    b.tensor("output.weight", _shape_head(head, v))
    b.tokenizer(v, add_bos=True)
    return b.write(path)


def _own_generator_path(gen: Callable[..., Path], name: str) -> Path:
    """The cached file of a generator defined here, keyed by its source (regenerated when it changes)."""
    key = hashlib.sha256(inspect.getsource(inspect.getmodule(gen)).encode()).hexdigest()[:16]  # type: ignore[arg-type]
    path = cache_root() / "fixtures" / f"{name}-{key}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        gen(tmp)
        os.replace(tmp, path)  # readers never see a half-written model
    return path


@dataclass(frozen=True)
class StandIn:
    """What stands in for one upstream model: a kind (what the tests rely on) and its maker."""

    kind: str
    make: Callable[[], Path]


_KINDS: dict[str, StandIn] = {
    "transformer": StandIn("transformer", lambda: fixture_path("llama_spm")),
    "hybrid": StandIn("hybrid", lambda: fixture_path("qwen35_mtp", form="random")),
    "recurrent": StandIn("recurrent", lambda: _own_generator_path(tiny_mamba, "tiny_mamba")),
    "embedding": StandIn("embedding", lambda: fixture_path("embedding_model")),
}

# (repo_id, filename) upstream's fixtures download -> the kind of model standing in for it
STAND_INS: dict[tuple[str, str], str] = {
    ("lmstudio-community/Qwen3.5-0.8B-GGUF", "Qwen3.5-0.8B-Q8_0.gguf"): "hybrid",
    ("ggml-org/models", "tinyllamas/stories15M-q4_0.gguf"): "transformer",
    ("CompendiumLabs/bge-small-en-v1.5-gguf", "bge-small-en-v1.5-q4_k_m.gguf"): "embedding",
    ("QuantFactory/mamba-130m-hf-GGUF", "mamba-130m-hf.Q2_K.gguf"): "recurrent",
    ("tiiuae/Falcon-H1-Tiny-90M-Instruct-GGUF", "Falcon-H1-Tiny-90M-Instruct-Q2_K.gguf"): "hybrid",
}


def stand_in_path(repo_id: str, filename: str) -> Path:
    """The generated model standing in for ``repo_id``/``filename``."""
    try:
        kind = STAND_INS[(repo_id, filename)]
    except KeyError:
        raise KeyError(f"no stand-in for {repo_id}/{filename}: add it to build_tools/compat/standins.py "
                       f"STAND_INS (kinds: {', '.join(sorted(_KINDS))})") from None
    return _KINDS[kind].make()
