"""``Llama()``'s answer to keywords it does not take: upstream accepts and ignores any keyword, so
this warns naming them (obsolete ones as a DeprecationWarning), and refuses a near miss of a real
parameter as the typo it is."""

from __future__ import annotations

import difflib
import warnings
from typing import Any

#: keywords that older upstream releases (or wrappers written for them, LangChain's ``device``) pass
#: and that mean nothing here: a DeprecationWarning, which Python shows for the caller's own code
OBSOLETE_KEYWORDS = frozenset({"f16_kv", "n_parts", "low_vram", "mul_mat_q", "n_gqa", "rms_norm_eps", "device",
                               "logits_all_fallback", "embedding_only", "cache", "cache_type", "cache_size"})


def unknown_keywords(kwargs: dict[str, Any], known: dict[str, Any]) -> None:
    """Upstream accepts and ignores any keyword; so do we, with a warning naming them. A near miss of a
    real parameter (``n_ctxx``) is a typo, not an old keyword: TypeError with the right name.
    Called from ``Llama.__init__``: the warnings point at its caller."""
    old = sorted(k for k in kwargs if k in OBSOLETE_KEYWORDS)
    other = sorted(k for k in kwargs if k not in OBSOLETE_KEYWORDS)
    for name in other:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
        if close:
            raise TypeError(f"Llama() got an unexpected keyword argument {name!r}: did you mean {close[0]!r}?")
    if old:
        warnings.warn(f"Llama() ignores the obsolete keyword argument(s) {', '.join(old)}: llama.cpp no longer "
                      "has them", DeprecationWarning, stacklevel=3)
    if other:
        warnings.warn(f"Llama() ignores the unknown keyword argument(s) {', '.join(other)}", UserWarning,
                      stacklevel=3)


__all__ = ["OBSOLETE_KEYWORDS", "unknown_keywords"]
