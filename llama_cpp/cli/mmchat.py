"""Chat with a multimodal model: text plus images/audio through its mmproj projector (optionally speculating)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ._spec_args import add_speculative_arguments, print_stats, speculative_config

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path, help="text model GGUF")
    p.add_argument("--mmproj", type=Path, required=True, help="multimodal projector GGUF (mmproj)")
    p.add_argument("-p", "--prompt", help="one user message; without it, read messages interactively from stdin")
    p.add_argument("--image", action="append", default=[], type=Path, help="image file (repeatable)")
    p.add_argument("--audio", action="append", default=[], type=Path, help="audio file: wav, mp3, flac (repeatable)")
    p.add_argument("--system", help="system message")
    p.add_argument("-n", "--max-tokens", type=int, default=256, help="tokens to generate per answer (default 256)")
    p.add_argument("--temp", type=float, default=0.2, help="temperature; 0 is greedy (default 0.2)")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("-c", "--ctx-size", type=int, default=4096, help="context size (default 4096)")
    p.add_argument("-b", "--batch-size", type=int, default=512, help="logical batch size (default 512)")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="layers to offload to the GPU")
    p.add_argument("--no-mmproj-offload", action="store_true", help="run the projector on the CPU")
    p.add_argument("--chat-template", type=Path, help="a Jinja chat template file overriding the model's")
    p.add_argument("--chat-format", help="a named chat format (chatml, llama-3, gemma, ...)")
    p.add_argument("--mtp", type=int, default=0, metavar="N",
                   help="MTP speculative decoding with up to N drafted tokens per step (model needs NextN layers); "
                        "short for --spec-type draft-mtp --spec-draft-n-max N")
    p.add_argument("--json", action="store_true", help="print the response object as JSON instead of streaming text")
    add_speculative_arguments(p)


def _user_message(text: str, images: list[Path], audio: list[Path]) -> dict:
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": str(p.resolve())}} for p in images]
    for a in audio:
        import base64

        data = a.read_bytes()
        parts.append({"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode("ascii"),
                                                             "format": a.suffix.lstrip(".").lower() or "wav"}})
    parts.append({"type": "text", "text": text})
    return {"role": "user", "content": parts}


def run(args: argparse.Namespace) -> int:
    from ..mtmd_chat import MultimodalChat

    for a in args.image:  # named on the command line: saying it is missing leaks nothing
        if not a.is_file():
            raise FileNotFoundError(f"image file not found: {a}")
    for a in args.audio:
        if not a.is_file():
            raise FileNotFoundError(f"audio file not found: {a}")
    spec = speculative_config(args, mtp=args.mtp)
    template = args.chat_template.read_text(encoding="utf-8") if args.chat_template else None
    from .._safety.isolated_load import verify_model_file
    verify_model_file(args.model)  # a file from others is tried in a child first
    chat = MultimodalChat(args.model, args.mmproj, n_ctx=args.ctx_size, n_batch=args.batch_size,
                          n_threads=args.threads, n_gpu_layers=args.n_gpu_layers,
                          use_gpu=not args.no_mmproj_offload, chat_template=template,
                          chat_format=args.chat_format, speculative=spec,
                          media_dirs=sorted({str(p.resolve().parent) for p in args.image}))  # named by the user
    sampling = dict(max_tokens=args.max_tokens, temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                    min_p=args.min_p, seed=args.seed)
    history: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    with chat:
        def answer(msg: dict) -> str:
            history.append(msg)
            if args.json:
                res = chat.create_chat_completion(history, **sampling)
                print(json.dumps(res, indent=2, ensure_ascii=False))
                text = res["choices"][0]["message"]["content"]
            else:
                pieces = []
                for ch in chat.create_chat_completion(history, stream=True, **sampling):
                    piece = ch["choices"][0]["delta"].get("content")
                    if piece:
                        pieces.append(piece)
                        sys.stdout.write(piece)
                        sys.stdout.flush()
                sys.stdout.write("\n")
                text = "".join(pieces)
            history.append({"role": "assistant", "content": text})
            print_stats(args, chat.last_speculative_stats)
            return text

        if args.prompt is not None:
            answer(_user_message(args.prompt, args.image, args.audio))
            return 0
        pending_images, pending_audio = list(args.image), list(args.audio)
        print("multimodal chat: '/image PATH' or '/audio PATH' attaches media to the next message; "
              "an empty line or EOF quits", file=sys.stderr)
        for line in sys.stdin:
            line = line.rstrip("\n")
            if not line.strip():
                break
            if line.startswith("/image "):
                pending_images.append(Path(line[7:].strip()))
                continue
            if line.startswith("/audio "):
                pending_audio.append(Path(line[7:].strip()))
                continue
            answer(_user_message(line, pending_images, pending_audio))
            pending_images, pending_audio = [], []
    return 0
