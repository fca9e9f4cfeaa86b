"""Where a model's weights go: devices, tensor buffer overrides (MoE offload), RPC servers, and fitting
the parameters to free memory.

- :mod:`.devices`: the devices and buffer types ggml has, by name.
- :mod:`.placement`: ``devices=`` / ``cpu_moe`` / ``n_cpu_moe`` / ``override_tensor`` checked and
  resolved to ``llama_model_params`` fields, as llama.cpp's ``-dev``/``-cmoe``/``-ncmoe``/``-ot`` do.
- :mod:`.rpc`: llama.cpp's RPC backend: remote devices (``rpc_servers=``), probed before llama.cpp
  connects, and ggml's own RPC server.
- :mod:`.fit`: llama.cpp's ``common_fit_params`` (``--fit``, ``llama-fit-params``) through libllama-cpp-ext.
"""
