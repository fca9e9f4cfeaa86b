"""Multimodal implementation behind :mod:`llama_cpp.mtmd_chat`: prompt evaluation (``decode``),
speculation over media prompts (``speculation``) and upstream's vision chat handlers
(``vision_handlers``, above ``mtmd_chat``)."""
