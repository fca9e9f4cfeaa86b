"""``python -m llama_cpp complete MODEL PROMPT``: a text completion, streamed to stdout."""

from __future__ import annotations

import argparse
import json
import sys

from ._placement_args import add_placement_arguments, placement_kwargs
from ._spec_args import add_speculative_arguments, print_stats, speculative_config
from .info import add_model_arguments, progress_printer

HELP = "complete a prompt (greedy with --temp 0), streaming the text to stdout"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_placement_arguments(p)
    p.add_argument("prompt", help="prompt text ('-' reads stdin)")
    p.add_argument("-n", "--max-tokens", type=int, default=128, help="tokens to generate (<= 0: until n_ctx)")
    p.add_argument("--ctx", "-c", type=int, default=2048, help="context size (0: the model's)")
    p.add_argument("--temp", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--grammar-file", help="GBNF grammar constraining the output")
    p.add_argument("--json", action="store_true", help="print the OpenAI-style response instead of text")
    add_speculative_arguments(p)


def run(args: argparse.Namespace) -> int:
    from ..llama import Llama
    from ..llama_grammar import LlamaGrammar

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    grammar = LlamaGrammar.from_file(args.grammar_file) if args.grammar_file else None
    spec = speculative_config(args)
    cb = None if args.quiet else progress_printer()
    with Llama(args.model, n_ctx=args.ctx, n_threads=args.threads, n_threads_batch=args.threads,
               n_gpu_layers=args.n_gpu_layers, **placement_kwargs(args), verbose=False, progress_callback=cb,
               speculative=spec, isolate_load=True) as llm:
        kw = {"max_tokens": args.max_tokens, "temperature": args.temp, "top_k": args.top_k, "top_p": args.top_p,
              "min_p": args.min_p, "repeat_penalty": args.repeat_penalty, "seed": args.seed,
              "stop": args.stop or None, "grammar": grammar}
        if args.json:
            json.dump(llm(prompt, **kw), sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            for chunk in llm(prompt, stream=True, **kw):
                sys.stdout.write(chunk["choices"][0]["text"])
                sys.stdout.flush()
            sys.stdout.write("\n")
        print_stats(args, llm.last_speculative_stats)
    return 0
