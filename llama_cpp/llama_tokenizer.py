"""Tokenizers ``Llama`` can use (``Llama(tokenizer=...)``), as in llama-cpp-python.

:class:`LlamaTokenizer` is the model's own vocabulary (the default); :class:`LlamaHFTokenizer`
wraps a Hugging Face ``transformers`` tokenizer (an optional dependency). Detokenizing keeps the
leading space of the first piece unless the tokens start the text after BOS, so pieces
detokenized one at a time (``detokenize([tok], prev_tokens=...)`` or ``detokenize([tok])``)
join into the same text as the whole sequence.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Sequence
from typing import Any, Protocol

from ._core.model import LlamaModel


class BaseLlamaTokenizer(abc.ABC):
    """What ``Llama`` needs from a tokenizer: bytes to token ids and back."""

    @abc.abstractmethod
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        """Token ids of UTF-8 ``text``; ``add_bos`` adds the model's BOS, ``special`` parses
        control-token text."""
        raise NotImplementedError

    @abc.abstractmethod
    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        """UTF-8 bytes of ``tokens``; ``prev_tokens`` are the tokens before them (for spacing)."""
        raise NotImplementedError


class ModelHolder(Protocol):
    """What a ``Llama`` is to a tokenizer: the holder of a loaded model (this layer sits below
    :mod:`llama_cpp.llama` and does not import it)."""

    def native_model(self) -> LlamaModel: ...


class LlamaTokenizer(BaseLlamaTokenizer):
    """The model's own llama.cpp vocabulary: of a ``Llama`` (its ``native_model()``) or of a
    :class:`~llama_cpp._core.model.LlamaModel`."""

    def __init__(self, llama: ModelHolder | LlamaModel) -> None:
        if isinstance(llama, LlamaModel):
            self._model = llama
        elif callable(getattr(llama, "native_model", None)):
            self._model = llama.native_model()
        else:
            raise TypeError(f"LlamaTokenizer takes a Llama or a LlamaModel, not {type(llama).__name__}")

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return self._model.tokenize(text, add_special=add_bos, parse_special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        m = self._model
        toks = [int(t) for t in tokens]
        if not toks:
            return b""
        if prev_tokens:
            prev = [int(t) for t in prev_tokens]
            whole = m.detokenize(prev + toks, special=special)
            head = m.detokenize(prev, special=special)
            if whole.startswith(head):
                return whole[len(head):]
            return b"".join(m.token_to_piece(t, special) for t in toks)
        out = m.detokenize(toks, special=special)
        if toks[0] != m.token_bos() and m.adds_space_prefix():
            # llama.cpp drops the first piece's leading space (the tokenizer's added prefix); without
            # BOS these tokens need not start the text, so the space is kept, as upstream does
            raw = m.token_to_piece(toks[0], special)
            stripped = m.token_to_piece(toks[0], special, lstrip=1)
            if raw != stripped and out.startswith(stripped):
                out = raw + out[len(stripped):]
        return out

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos=add_bos, special=special)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")

    @classmethod
    def from_ggml_file(cls, path: str | os.PathLike[str]) -> LlamaTokenizer:
        """The vocabulary of a GGUF file, loaded without its weights."""
        return cls(LlamaModel(path, vocab_only=True))


class LlamaHFTokenizer(BaseLlamaTokenizer):
    """A Hugging Face ``transformers`` tokenizer (``pip install transformers``)."""

    def __init__(self, hf_tokenizer: Any) -> None:
        self.hf_tokenizer = hf_tokenizer

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return list(self.hf_tokenizer.encode(text.decode("utf-8", errors="ignore"), add_special_tokens=special))

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        skip = not special
        toks = [int(t) for t in tokens]
        if prev_tokens is not None:
            prev = [int(t) for t in prev_tokens]
            text = self.hf_tokenizer.decode(prev + toks, skip_special_tokens=skip).encode("utf-8", errors="ignore")
            head = self.hf_tokenizer.decode(prev, skip_special_tokens=skip).encode("utf-8", errors="ignore")
            return text[len(head):]
        return self.hf_tokenizer.decode(toks, skip_special_tokens=skip).encode("utf-8", errors="ignore")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str) -> LlamaHFTokenizer:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ImportError("LlamaHFTokenizer.from_pretrained needs the transformers package: "
                              "pip install transformers") from None
        return cls(AutoTokenizer.from_pretrained(pretrained_model_name_or_path=pretrained_model_name_or_path))


__all__ = ["BaseLlamaTokenizer", "LlamaHFTokenizer", "LlamaTokenizer"]
