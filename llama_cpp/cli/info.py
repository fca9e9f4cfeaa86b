"""``python -m llama_cpp info MODEL``: metadata, sizes and chat template of a GGUF model."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

HELP = "show a model's metadata, sizes and whether it has a chat template"


class _ProgressPrinter:
    """A load-progress callback that draws a percentage on stderr (only when stderr is a terminal
    would it be redrawn in place; otherwise it prints a line at 0% and at 100%). An object, not a
    closure, so that it pickles: a model split over RPC servers loads in a worker process."""

    def __init__(self, label: str) -> None:
        self.label, self.last, self.tty = label, -1, sys.stderr.isatty()

    def __call__(self, progress: float) -> bool:
        pct = int(progress * 100)
        if self.tty:
            if pct != self.last:
                sys.stderr.write(f"\r{self.label}: {pct:3d}%")
                if pct >= 100:
                    sys.stderr.write("\n")
                sys.stderr.flush()
        elif (self.last < 0) or (pct >= 100 > self.last):
            sys.stderr.write(f"{self.label}: {pct}%\n")
            sys.stderr.flush()
        self.last = pct
        return True


def progress_printer(label: str = "loading model") -> Callable[[float], bool]:
    """A load-progress callback printing a percentage on stderr (see :class:`_ProgressPrinter`)."""
    return _ProgressPrinter(label)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path of a .gguf file")
    p.add_argument("--threads", "-t", type=int, default=None, help="CPU threads (default: half the cores)")
    p.add_argument("--n-gpu-layers", "-ngl", type=int, default=0, help="layers to offload to a GPU")
    p.add_argument("--quiet", "-q", action="store_true", help="no load progress on stderr")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--full", action="store_true", help="do not shorten long metadata values")


def _short(value: str, full: bool) -> str:
    return value if full or len(value) <= 120 else value[:117] + "..."


def run(args: argparse.Namespace) -> int:
    from .._core.model import LlamaModel

    cb = None if args.quiet else progress_printer()
    with LlamaModel(args.model, n_gpu_layers=args.n_gpu_layers, progress_callback=cb) as m:
        md = m.metadata
        template = m.chat_template()
        info: dict[str, Any] = {
            "path": str(m.path),
            "architecture": md.get("general.architecture"),
            "name": md.get("general.name"),
            "description": m.desc(),
            "file_size": m.path.stat().st_size,
            "tensor_bytes": m.size(),
            "n_params": m.n_params(),
            "n_ctx_train": m.n_ctx_train(),
            "n_embd": m.n_embd(),
            "n_embd_out": m.n_embd_out(),
            "n_layer": m.n_layer(),
            "n_layer_nextn": m.n_layer_nextn(),
            "n_head": m.n_head(),
            "n_vocab": m.n_vocab,
            "pooling_type": m.pooling_from_metadata(),
            "has_encoder": m.has_encoder(),
            "chat_template": template is not None,
            "metadata": md,
        }
    if args.json:
        json.dump(info, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    for key, value in info.items():
        if key == "metadata":
            continue
        print(f"{key:14s} {value}")
    print(f"metadata ({len(md)} scalar keys):")
    for key in sorted(md):
        print(f"  {key} = {_short(md[key], args.full)}")
    return 0
