"""How a chat answer is sampled and detokenized, as llama-server does it for a template's output.

:class:`ChatConstraint` is what the native chat path passes as ``grammar=`` to
``Llama.create_completion`` (the :class:`~llama_cpp._generation.sampling.OutputConstraint` protocol):

* :meth:`ChatConstraint.sampler` makes the answer's sampler in llama.cpp's common library
  (:func:`~llama_cpp._chat.native_chat.chat_sampler`): the template's grammar, *lazy* for
  ``tool_choice="auto"`` (free text is unconstrained until the format's call marker, a word, regex
  or token trigger, appears; from there the call follows the tools' schemas), strict for
  ``"required"``, a named tool or a ``response_format``; and the reasoning budget, which closes the
  thinking block after the given number of tokens;
* :attr:`ChatConstraint.special_tokens` are the template's preserved tokens (harmony's
  ``<|channel|>``, Qwen's ``<tool_call>``, ...): they are detokenized as their text so the parser
  sees them, while other control tokens stay hidden.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from .._core.model import LlamaModel
from .._core.ownership import Owned, native_lib
from .native_chat import ChatPrompt, chat_sampler, chat_sampler_state

log = logging.getLogger("llama_cpp.chat")


class NativeChatSampler(Owned):
    """A ``llama_sampler *`` from :func:`~llama_cpp._chat.native_chat.chat_sampler`, used where a
    grammar sampler is (``apply`` to the candidates before the chain, ``accept`` every token)."""

    _kind = "chat sampler"

    def __init__(self, ptr: int) -> None:
        self._ref = None
        C = native_lib()
        self.bindings = C
        self.address = int(ptr)
        self._own(ctypes.cast(ctypes.c_void_p(self.address), C.llama_sampler_p), C.llama_sampler_free)

    def apply(self, cur_p: Any) -> None:
        self.bindings.llama_sampler_apply(self._ptr(), cur_p)

    def accept(self, token: int) -> None:
        self.bindings.llama_sampler_accept(self._ptr(), int(token))

    def reset(self) -> None:
        self.bindings.llama_sampler_reset(self._ptr())

    def state(self) -> dict[str, str]:
        """``{"grammar": "none"|"active"|"failed", "reason", "reasoning": "none"|"idle"|"counting"|...}``."""
        self._ptr()
        return chat_sampler_state(self.address)

    def close(self) -> None:
        if not self.closed and self.state().get("grammar") == "failed":
            log.warning("the chat format's grammar was dropped during generation (%s): the output was generated "
                        "unconstrained from there", self.state().get("reason"))
        super().close()


class ChatConstraint:
    """The ``grammar=`` of a chat answer to ``prompt`` (see the module docstring).

    ``reasoning_budget``: tokens of thinking before the end tag is forced (-1 unlimited, 0 ends the
    thinking block as soon as it opens), with ``reasoning_budget_message`` before the tag.
    ``user_grammar``: ``prompt.grammar`` is the caller's GBNF (not advanced past the generation prompt).
    """

    def __init__(self, model: LlamaModel, prompt: ChatPrompt, *, reasoning_budget: int = -1,
                 reasoning_budget_message: str = "", user_grammar: bool = False) -> None:
        self.prompt = prompt
        self.params = prompt.sampler_params(reasoning_budget=reasoning_budget,
                                            reasoning_budget_message=reasoning_budget_message,
                                            user_grammar=user_grammar)
        made = chat_sampler(model, self.params)  # checks the grammar and triggers now, before generating
        self.special_tokens: frozenset[int] = made.preserved_token_ids
        self.has_grammar, self.has_reasoning_budget = made.has_grammar, made.has_reasoning_budget
        self._first: NativeChatSampler | None = NativeChatSampler(made.ptr) if made.ptr else None
        self.last_sampler: NativeChatSampler | None = None

    def sampler(self, model: LlamaModel) -> NativeChatSampler | None:
        """A fresh sampler for one generation (None when there is nothing to constrain)."""
        smpl, self._first = self._first, None
        if smpl is None and (self.has_grammar or self.has_reasoning_budget):
            made = chat_sampler(model, self.params)
            smpl = NativeChatSampler(made.ptr) if made.ptr else None
        self.last_sampler = smpl
        return smpl

    def close(self) -> None:
        if self._first is not None:
            self._first.close()
            self._first = None

    def __getstate__(self) -> dict[str, Any]:
        # to a model in a worker process: its samplers are made there, from the parameters (sampler())
        return {**self.__dict__, "_first": None, "last_sampler": None}


__all__ = ["ChatConstraint", "NativeChatSampler"]
