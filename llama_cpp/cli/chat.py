"""``python -m llama_cpp chat MODEL``: chat with the model's template (interactive, or ``-m`` messages)."""

from __future__ import annotations

import argparse
import sys

from ._placement_args import add_placement_arguments, placement_kwargs
from ._spec_args import add_speculative_arguments, print_stats, speculative_config
from .info import add_model_arguments, progress_printer

HELP = "chat with a model (its GGUF chat template, or --chat-format); interactive unless -m is given"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_placement_arguments(p)
    p.add_argument("-m", "--message", action="append", default=[],
                   help="a user message to send (repeatable); without it, read turns from stdin")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--chat-format", help="a named format (chatml, llama-2, gemma, ...) instead of the GGUF template")
    p.add_argument("--ctx", "-c", type=int, default=4096)
    p.add_argument("-n", "--max-tokens", type=int, default=512)
    p.add_argument("--temp", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=None)
    add_speculative_arguments(p)


def _reply(llm, messages, args) -> str:
    parts = []
    for chunk in llm.create_chat_completion(messages, max_tokens=args.max_tokens, temperature=args.temp,
                                            seed=args.seed, stream=True):
        text = chunk["choices"][0]["delta"].get("content") or ""
        parts.append(text)
        sys.stdout.write(text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    print_stats(args, llm.last_speculative_stats)
    return "".join(parts)


def run(args: argparse.Namespace) -> int:
    from ..llama import Llama

    spec = speculative_config(args)
    cb = None if args.quiet else progress_printer()
    with Llama(args.model, n_ctx=args.ctx, n_threads=args.threads, n_threads_batch=args.threads,
               n_gpu_layers=args.n_gpu_layers, **placement_kwargs(args), chat_format=args.chat_format, verbose=False,
               progress_callback=cb, speculative=spec, isolate_load=True) as llm:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        scripted = list(args.message)
        interactive = not scripted
        if interactive and sys.stdin.isatty():
            sys.stderr.write("chat: type a message, an empty line or Ctrl-D to quit\n")
        while True:
            if scripted:
                user = scripted.pop(0)
            elif interactive:
                if sys.stdin.isatty():
                    sys.stderr.write("> ")
                    sys.stderr.flush()
                line = sys.stdin.readline()
                if not line or not line.strip():
                    break
                user = line.rstrip("\n")
            else:
                break
            messages.append({"role": "user", "content": user})
            messages.append({"role": "assistant", "content": _reply(llm, messages, args)})
    return 0
