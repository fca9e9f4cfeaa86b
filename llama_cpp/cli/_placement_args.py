"""The placement options of the model commands, spelled as llama.cpp's: ``-dev``, ``-ts``, ``-cmoe``,
``-ncmoe``, ``-ot``, ``--rpc``, ``--fit``, ``-fitt`` and ``-fitc``."""

from __future__ import annotations

import argparse
from typing import Any


def _split(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_placement_arguments(p: argparse.ArgumentParser, *, fit: bool = True) -> None:
    g = p.add_argument_group("placement (as llama.cpp's options)")
    g.add_argument("-dev", "--device", help="comma-separated devices to offload to ('none': no offload)")
    g.add_argument("-ts", "--tensor-split", help="fraction of the layers per device, e.g. 3,1")
    g.add_argument("-cmoe", "--cpu-moe", action="store_true", help="keep every MoE expert tensor on the CPU")
    g.add_argument("-ncmoe", "--n-cpu-moe", type=int, default=0, metavar="N",
                   help="keep the MoE experts of the first N layers on the CPU")
    g.add_argument("-ot", "--override-tensor", action="append", default=[], metavar="PATTERN=BUFT,...",
                   help="tensor buffer overrides, e.g. exps=CPU (repeatable)")
    g.add_argument("--rpc", metavar="HOST:PORT,...", help="RPC servers whose devices take layers (with -ngl)")
    if fit:
        g.add_argument("-fit", "--fit", choices=["on", "off"], default="off",
                       help="fit -ngl, expert placement and -c 0 to the devices' free memory")
        g.add_argument("-fitt", "--fit-target", metavar="MiB0,MiB1,...",
                       help="memory to leave free per device for --fit (one value: every device; default 1024)")
        g.add_argument("-fitc", "--fit-ctx", type=int, metavar="N",
                       help="the smallest context size --fit may choose (default 4096)")


def placement_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The ``Llama``/``LlamaEmbedding`` keywords of the parsed options."""
    kw: dict[str, Any] = {
        "devices": _split(args.device) if args.device else None,
        "tensor_split": [float(x) for x in _split(args.tensor_split)] if args.tensor_split else None,
        "cpu_moe": args.cpu_moe, "n_cpu_moe": args.n_cpu_moe,
        "override_tensor": [o for item in args.override_tensor for o in _split(item)] or None,
        "rpc_servers": args.rpc,
    }
    if getattr(args, "fit", "off") == "on":
        kw["fit"] = True
    for name in ("fit_target", "fit_ctx"):
        if getattr(args, name, None) is not None:
            kw[name] = getattr(args, name)
    return kw
