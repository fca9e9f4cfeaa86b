"""The speculative decoding options the ``complete``, ``chat`` and ``mmchat`` commands share.

Named as llama.cpp's tools name them (``--spec-type``, ``-md``, ``--spec-draft-n-max``, ...), so a
command line written for ``llama-cli`` or ``llama-speculative-simple`` carries over.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

TYPES = ("draft-simple, draft-mtp, draft-eagle3, draft-dflash, draft-dspark, ngram-simple, ngram-map-k, "
         "ngram-map-k4v, ngram-mod, ngram-cache, prompt-lookup")


def add_speculative_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding (greedy output is unchanged; see --stats)")
    g.add_argument("--spec-type", metavar="TYPES",
                   help=f"speculative types, several joined by commas: {TYPES}")
    g.add_argument("-md", "--model-draft", type=Path, metavar="GGUF",
                   help="the draft of draft-simple (same vocabulary), draft-eagle3, draft-dflash or draft-dspark; "
                        "alone it means --spec-type draft-simple")
    g.add_argument("--spec-draft-n-max", type=int, default=None, metavar="N",
                   help="most tokens drafted per step (default 3)")
    g.add_argument("--spec-draft-n-min", type=int, default=None, metavar="N",
                   help="drafts shorter than this are dropped (default 0)")
    g.add_argument("--spec-draft-p-min", type=float, default=None, metavar="P",
                   help="stop drafting below this probability (default 0)")
    g.add_argument("--stats", action="store_true", help="print speculative decoding statistics to stderr")


def speculative_config(args: argparse.Namespace, *, mtp: int = 0) -> Any:
    """The :class:`~llama_cpp.speculative.SpecConfig` the options ask for, or None.

    ``mtp`` (``mmchat --mtp N``): draft-mtp with N tokens, unless ``--spec-type`` says otherwise."""
    from .._errors import SpeculativeError
    from ..speculative import SpecConfig

    kind, draft = args.spec_type, args.model_draft
    if kind is None and draft is None and mtp <= 0:
        for name in ("spec_draft_n_max", "spec_draft_n_min", "spec_draft_p_min"):
            if getattr(args, name) is not None:
                flag = "--" + name.replace("_", "-")
                raise SpeculativeError(f"{flag} needs --spec-type (or -md, or --mtp): it sets how a speculative type drafts")
        return None
    if draft is not None and not draft.is_file():
        raise FileNotFoundError(f"draft model not found: {draft}")
    kw: dict[str, Any] = {"spec_type": kind if kind is not None else (None if draft is not None else "draft-mtp"),
                          "draft_model_path": str(draft) if draft is not None else None}
    n_max = args.spec_draft_n_max if args.spec_draft_n_max is not None else (mtp if mtp > 0 else None)
    if n_max is not None:
        kw["draft_n_max"] = n_max
    if args.spec_draft_n_min is not None:
        kw["draft_n_min"] = args.spec_draft_n_min
    if args.spec_draft_p_min is not None:
        kw["draft_p_min"] = args.spec_draft_p_min
    return SpecConfig(**kw)


def print_stats(args: argparse.Namespace, stats: Any) -> None:
    """``--stats``: the last generation's speculative statistics on stderr."""
    if args.stats and stats is not None:
        print(str(stats), file=sys.stderr)


__all__ = ["add_speculative_arguments", "print_stats", "speculative_config"]
