"""Binding generation, apart from the release stages: parse the vendored headers (``headers``),
write ``llama_cpp/{ggml,llama,mtmd}_cpp.py`` (``generate``; ``python -m build_tools.bindgen``),
and compare the bindings with a llama.cpp tree (``compare``; ``python -m build_tools bump``).
"""
