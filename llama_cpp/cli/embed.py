"""``python -m llama_cpp embed MODEL TEXT...``: embeddings as JSON (stdout) or a NumPy ``.npy`` file."""

from __future__ import annotations

import argparse
import json
import sys

from ._placement_args import add_placement_arguments, placement_kwargs
from .info import add_model_arguments, progress_printer

HELP = ("embed texts (one per argument, or lines of stdin with '-') and print JSON or write .npy; "
        "with --mmproj, the --image/--audio files and the texts form one multimodal input")
TRAILING = "text"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_placement_arguments(p, fit=False)
    p.add_argument("text", nargs="*", help="texts to embed ('-' reads one text per line from stdin)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print a JSON list of vectors (the default)")
    out.add_argument("--npy", metavar="FILE", help="write a float32 (n_texts, n_embd_out) .npy file")
    p.add_argument("--normalize", type=int, default=2,
                   help="-1 none, 0 max-abs (int16 range), 1 L1, 2 L2 (default), p>2 p-norm")
    p.add_argument("--pooling", choices=["mean", "cls", "last", "none", "rank"], default=None,
                   help="override the model's pooling")
    p.add_argument("--batch", type=int, default=2048, help="tokens per decode")
    p.add_argument("--no-truncate", action="store_true", help="refuse inputs longer than the model's limit")
    mm = p.add_argument_group("multimodal")
    mm.add_argument("--mmproj", metavar="FILE", help="the model's multimodal projector (mmproj GGUF)")
    mm.add_argument("--image", action="append", default=[], metavar="FILE", help="an image part (repeatable)")
    mm.add_argument("--audio", action="append", default=[], metavar="FILE", help="an audio part (repeatable)")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..llama_embedding import LlamaEmbedding

    texts: list[str] = []
    for t in args.text:
        if t == "-":
            texts.extend(line.rstrip("\n") for line in sys.stdin if line.strip())
        else:
            texts.append(t)
    media = args.image or args.audio
    if media and not args.mmproj:
        print("error: --image/--audio need --mmproj <projector.gguf>", file=sys.stderr)
        return 2
    if not texts and not media:
        print("error: no texts to embed", file=sys.stderr)
        return 2
    cb = None if args.quiet else progress_printer()
    from .._safety.isolated_load import verify_model_file
    verify_model_file(args.model, {"embedding": True})  # a file from others is tried in a child first
    with LlamaEmbedding(args.model, pooling_type=args.pooling or -1, n_batch=args.batch, n_threads=args.threads,
                        n_gpu_layers=args.n_gpu_layers, **placement_kwargs(args), progress_callback=cb,
                        mmproj_path=args.mmproj) as emb:
        if args.mmproj:
            from ..mtmd import Audio, Image

            parts = [Image(p) for p in args.image] + [Audio(p) for p in args.audio] + texts
            rows = emb.embed_multimodal([parts], normalize=args.normalize, pooling=args.pooling)
        else:
            rows = emb.embed(texts, normalize=args.normalize, truncate=not args.no_truncate)
    if args.npy:
        if isinstance(rows, list):
            print("error: pooling 'none' gives one row per token; use --json", file=sys.stderr)
            return 2
        np.save(args.npy, np.asarray(rows, dtype=np.float32))
        print(f"wrote {rows.shape[0]} x {rows.shape[1]} float32 to {args.npy}", file=sys.stderr)
        return 0
    data = [np.asarray(r).tolist() for r in rows]
    json.dump(data, sys.stdout)
    sys.stdout.write("\n")
    return 0
