"""Tiny models that carry a real chat template, and a logits processor that makes them say a given text.

The model is the fixtures' llama-arch model with a GPT-2 byte-level vocabulary (any text is
spelled), to which the template's preserved tokens are added as control tokens, as a real model's
vocabulary has them (``<tool_call>``, ``<|channel|>``, ``[TOOL_CALLS]``...): llama.cpp then samples,
detokenizes and triggers on them as one token each. The template itself is the GGUF's
``tokenizer.chat_template``, so ``Llama`` finds it as it finds a real model's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from build_tools.fixtures import vocab as _vocab
from build_tools.fixtures._gguf import GGUFBuilder
from build_tools.fixtures.models import _llama_body

#: the vocabulary's BOS and EOS (an end-of-generation token, which ends the forced text). llama.cpp's chat
#: layer reads a template with the model's own: the automatic parser of a template that writes
#: ``eos_token`` after each assistant turn (Mistral's) learns the turn's end from it, so it is the common
#: "</s>" rather than the fixture vocabulary's "<|im_end|>"
BOS, EOS = "<s>", "</s>"

# harmony's <|end|> ends a message, not the generation, when the vocabulary also has these (llama-vocab.cpp)
_COMPANIONS = {"<|end|>": ("<|return|>", "<|call|>")}


def model_with_template(path: Path, template: str, control: Sequence[str]) -> Path:
    """A tiny GGUF at ``path`` whose chat template is ``template`` and whose vocabulary adds ``control``
    (the template's preserved tokens) as control tokens."""
    v = _vocab.bpe_vocab()
    v.special = {"bos": v.add(BOS, 0.0, _vocab.CONTROL), "eos": v.add(EOS, 0.0, _vocab.CONTROL)}
    for piece in control:
        v.add(piece, 0.0, _vocab.CONTROL)
        for extra in _COMPANIONS.get(piece, ()):
            v.add(extra, 0.0, _vocab.CONTROL)
    b = GGUFBuilder("llama", 0)
    b.string("general.name", "tiny-" + path.stem)
    _llama_body(b, v, n_layer=1)
    b.tokenizer(v, pre="gpt-2", add_bos=False, chat_template=template)
    return b.write(path)


class Force:
    """A logits processor (upstream's ``(input_ids, scores) -> scores``) that leaves one token possible at
    each step: the tokens of ``text`` in turn, then EOS. A grammar that refuses one of them makes the
    sampler raise ``GrammarError``: the text must be what the constraint allows."""

    def __init__(self, llama: object, text: str) -> None:
        toks = llama.tokenize(text.encode("utf-8"), add_bos=False, special=True) if text else []  # type: ignore[attr-defined]
        self.tokens = [*toks, llama.token_eos()]  # type: ignore[attr-defined]
        self.start: int | None = None

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if self.start is None:
            self.start = len(input_ids)
        i = min(len(input_ids) - self.start, len(self.tokens) - 1)
        out = np.full_like(scores, -np.inf)
        out[self.tokens[i]] = 0.0
        return out


class Nudge:
    """Force ``prefix``, then leave the model free except for a large bonus on ``token``: where a grammar
    constrains the output the bonus cannot win, elsewhere it always does."""

    def __init__(self, llama: object, prefix: str, token: int) -> None:
        self.prefix = Force(llama, prefix).tokens[:-1]
        self.token = token
        self.start: int | None = None

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if self.start is None:
            self.start = len(input_ids)
        i = len(input_ids) - self.start
        if i < len(self.prefix):
            out = np.full_like(scores, -np.inf)
            out[self.prefix[i]] = 0.0
            return out
        out = scores.copy()
        out[self.token] += 1000.0
        return out


def assemble_stream(chunks: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """Streamed chat chunks assembled as the openai client does (strings of one tool-call index
    concatenate, ids are taken as sent): the message's content, reasoning and calls, and the finish reason."""
    msg: dict[str, Any] = {"content": "", "reasoning_content": "", "tool_calls": []}
    finish = ""
    for c in chunks:
        choice = c["choices"][0]
        d = choice["delta"]
        msg["content"] += d.get("content") or ""
        msg["reasoning_content"] += d.get("reasoning_content") or ""
        for tc in d.get("tool_calls") or ():
            while len(msg["tool_calls"]) <= tc["index"]:
                msg["tool_calls"].append({"id": "", "function": {"name": "", "arguments": ""}})
            call = msg["tool_calls"][tc["index"]]
            call["id"] = tc.get("id") or call["id"]
            call["function"]["name"] += (tc.get("function") or {}).get("name") or ""
            call["function"]["arguments"] += (tc.get("function") or {}).get("arguments") or ""
        finish = choice["finish_reason"] or finish
    return msg, finish

