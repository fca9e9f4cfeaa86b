"""Multimodal helpers above :mod:`llama_cpp.mtmd_chat`: upstream's vision chat handlers (Llava15ChatHandler and kin)."""
