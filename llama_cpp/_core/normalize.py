"""Row normalisation of embeddings, llama.cpp's ``--embd-normalize`` convention (``common_embd_normalize``):

====  ==========================================================
 -1   none
  0   max-abs, scaled to the int16 range (values in [-32760, 32760])
  1   L1 (taxicab)
  2   L2 (euclidean, the default)
 p>2  p-norm
====  ==========================================================

Norms are computed in float64 after scaling by the largest magnitude, so tiny and huge vectors
normalise without underflow or overflow; an all-zero row stays zero.
"""

from __future__ import annotations

import numpy as np


def normalize_embeddings(x: np.ndarray, mode: int = 2) -> np.ndarray:
    """Normalise each row of ``x`` with llama.cpp's convention (see the module docstring)."""
    a = np.asarray(x)
    if a.dtype.kind != "f":
        raise TypeError(f"embeddings must be floating point, got {a.dtype}")
    mode = int(mode)
    if mode < -1:
        raise ValueError(f"normalize must be -1 (none), 0 (max-abs), 1 (L1), 2 (L2) or p > 2, got {mode}")
    if mode == -1:
        return a.astype(np.float32, copy=True)
    d = a.astype(np.float64)
    scale = np.max(np.abs(d), axis=-1, keepdims=True)
    if mode == 0:
        norm = scale / 32760.0
    else:
        safe = np.where(scale > 0, scale, 1.0)
        y = np.abs(d / safe)
        if mode == 1:
            norm = scale * np.sum(y, axis=-1, keepdims=True)
        elif mode == 2:
            norm = scale * np.sqrt(np.sum(y * y, axis=-1, keepdims=True))
        else:
            norm = scale * np.power(np.sum(np.power(y, mode), axis=-1, keepdims=True), 1.0 / mode)
    inv = np.where(norm > 0, 1.0 / np.where(norm > 0, norm, 1.0), 0.0)
    return (d * inv).astype(np.float32)


__all__ = ["normalize_embeddings"]
