/* llama-cpp-python's C API over llama.cpp's common/fit.h: fitting model and context parameters to the
 * devices' free memory (what `llama-fit-params` and `--fit` do). JSON in, JSON out, with the
 * conventions of llama-cpp-ext.h (results freed with llama_cpp_ext_free_string, failures returned as
 * {"error", "kind"}, no C++ exception crosses the boundary).
 */
#pragma once

#include "llama-cpp-ext.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fit the parameters of the model at "model_path" to free device memory with common_fit_params().
 * params: {"model_path": str,
 *          model:   "n_gpu_layers" (absent: llama.cpp's default, which the fit may change), "split_mode",
 *                   "main_gpu", "devices": [registered device names or ggml_backend_dev_t handles as
 *                   integers] (absent: every registered device), "tensor_split": [floats],
 *                   "tensor_buft_overrides": [[pattern, buffer type name or handle], ...],
 *          context: "n_ctx" (0: fitted), "n_ctx_min", "n_seq_max", "kv_unified", "n_batch", "n_ubatch",
 *                   "flash_attn_type", "type_k", "type_v", "offload_kqv", "swa_full",
 *          "margins": [bytes per device] (one value: every device; absent: 1 GiB, llama.cpp's default),
 *          "verbose": bool (llama.cpp's log of the fit at debug level instead of errors only)}
 * Result: {"status": "success"|"failure"|"error", "n_ctx", "n_gpu_layers", "tensor_split": [...] (trailing
 *          zeros trimmed, empty for one device), "tensor_buft_overrides": [[pattern, buffer type], ...]}. */
LLAMA_CPP_EXT_API char * llama_cpp_ext_fit_params(const char * params_json);

#ifdef __cplusplus
}
#endif
