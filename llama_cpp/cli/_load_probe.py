"""The child side of :mod:`llama_cpp._safety.isolated_load`: ``python -m llama_cpp.cli._load_probe
PATH PARAMS_JSON`` loads the model, tokenizes :data:`PROBES` (special tokens parsed), detokenizes
them and decodes; it prints ``CHILD_OK`` (and any clean error) when nothing killed it."""

from __future__ import annotations

import json
import sys
from typing import Any

from .._safety.isolated_load import CHILD_OK

#: texts the child tokenizes (special tokens parsed) and decodes
PROBES = ("hi", "Hello, world! 123", " \n\t  x", "\u00e9\u4e2d\U0001f600", "<s></s><|im_start|>user",
          "".join(map(chr, range(1, 128))), "\u2580\u2581x\u2582 \u0416\u20ac\u3042\uac00\u00ff\u0301")


def _child(path: str, params: dict[str, Any]) -> int:
    """The probe: load, tokenize the probes (special tokens parsed), detokenize, decode."""
    from .._errors import LlamaError
    from ..llama import Llama

    embedding = bool(params.get("embedding"))
    try:
        llm = Llama(path, n_ctx=128, n_batch=128, n_ubatch=128, n_threads=2, n_threads_batch=2, verbose=False,
                    kv_overrides=params.get("kv_overrides") or None, load_mtp=bool(params.get("load_mtp")),
                    embedding=embedding, vocab_only=bool(params.get("vocab_only")), isolate_load=False)
    except LlamaError as exc:  # a clean refusal: the in-process load raises it again
        print(CHILD_OK, f"clean error at load: {type(exc).__name__}: {exc}"[:500], flush=True)
        return 0
    stage = "tokenize"
    try:
        tokens: list[int] = []
        for text in PROBES:
            toks = llm.tokenize(text.encode(), add_bos=True, special=True)
            llm.detokenize(toks)
            tokens = tokens or toks
        stage = "detokenize"
        for start in range(0, llm.n_vocab(), 4096):  # every token's text, special ones included
            llm.detokenize(list(range(start, min(start + 4096, llm.n_vocab()))), special=True)
        stage = "decode"
        if params.get("vocab_only"):
            pass
        elif embedding:
            llm.embed("hi")
        else:
            llm.eval(tokens[:16] or [llm.token_bos()])
            llm.create_completion(tokens[:16], max_tokens=2, temperature=0.0)
    except LlamaError as exc:
        print(CHILD_OK, f"clean error at {stage}: {type(exc).__name__}: {exc}"[:500], flush=True)
        return 0
    print(CHILD_OK, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}))
