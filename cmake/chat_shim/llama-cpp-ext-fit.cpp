// The C API of llama-cpp-ext-fit.h over llama.cpp's common/fit.h (common_fit_params, the function
// behind `llama-fit-params` and `--fit`).

#include "llama-cpp-ext-fit.h"

#include "fit.h"
#include "ggml-backend.h"
#include "llama.h"
#include "log.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

using ojson = nlohmann::ordered_json;

namespace {

char * dup_c(const std::string & s) {
    char * out = static_cast<char *>(std::malloc(s.size() + 1));
    if (out != nullptr) {
        std::memcpy(out, s.data(), s.size());
        out[s.size()] = '\0';
    }
    return out;
}

char * fit_error(const char * kind, const std::string & message) {
    return dup_c(ojson({{"error", message}, {"kind", kind}}).dump(-1, ' ', false, ojson::error_handler_t::replace));
}

ggml_backend_buffer_type_t buft_by_name(const std::string & name) {
    // the names llama.cpp's -ot accepts: each device's default buffer type (common/arg.cpp)
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(ggml_backend_dev_get(i));
        if (buft != nullptr && name == ggml_backend_buft_name(buft)) {
            return buft;
        }
    }
    throw std::invalid_argument("unknown buffer type: " + name);
}

// fit.cpp writes its progress through common's logger, from a thread of its own onto stderr
void quiet_common_logger() {
    static std::once_flag once;
    std::call_once(once, [] { common_log_set_verbosity_thold(-1); });
}

// common_fit_params changes the process-wide llama.cpp logger while it runs
std::mutex fit_mutex;

ojson fit(const ojson & in) {
    if (!in.contains("model_path") || !in["model_path"].is_string()) {
        throw std::invalid_argument("model_path (a string) is required");
    }
    const std::string path = in["model_path"].get<std::string>();

    llama_model_params mparams = llama_model_default_params();
    llama_context_params cparams = llama_context_default_params();
    if (in.contains("n_gpu_layers")) mparams.n_gpu_layers = in["n_gpu_layers"].get<int32_t>();
    if (in.contains("split_mode"))   mparams.split_mode   = (llama_split_mode) in["split_mode"].get<int>();
    if (in.contains("main_gpu"))     mparams.main_gpu     = in["main_gpu"].get<int32_t>();

    std::vector<ggml_backend_dev_t> devices;
    if (in.contains("devices")) {
        for (const auto & item : in["devices"]) {
            // a handle (a device outside ggml's registry, such as an RPC server's), or a registered name
            ggml_backend_dev_t dev = item.is_number_unsigned()
                ? reinterpret_cast<ggml_backend_dev_t>(static_cast<uintptr_t>(item.get<uint64_t>()))
                : ggml_backend_dev_by_name(item.get<std::string>().c_str());
            if (dev == nullptr) {
                throw std::invalid_argument("unknown device: " + item.dump());
            }
            devices.push_back(dev);
        }
        devices.push_back(nullptr);
        mparams.devices = devices.data();
    }

    const size_t nd_max = llama_max_devices();
    std::vector<float> tensor_split(nd_max, 0.0f);
    if (in.contains("tensor_split")) {
        const auto & ts = in["tensor_split"];
        if (ts.size() > nd_max) {
            throw std::invalid_argument("tensor_split has more entries than llama_max_devices()");
        }
        for (size_t i = 0; i < ts.size(); ++i) {
            tensor_split[i] = ts[i].get<float>();
        }
        mparams.tensor_split = tensor_split.data();
    }

    // one buffer that holds the caller's overrides and, past them, what the fit sets (it needs
    // llama_max_tensor_buft_overrides() entries)
    const size_t ntbo = llama_max_tensor_buft_overrides();
    std::vector<std::string> patterns;
    std::vector<llama_model_tensor_buft_override> overrides(ntbo, {nullptr, nullptr});
    if (in.contains("tensor_buft_overrides") && !in["tensor_buft_overrides"].empty()) {
        const auto & tbo = in["tensor_buft_overrides"];
        if (tbo.size() + 1 > ntbo) {
            throw std::invalid_argument("more tensor_buft_overrides than llama_max_tensor_buft_overrides()");
        }
        patterns.reserve(tbo.size());
        for (size_t i = 0; i < tbo.size(); ++i) {
            patterns.push_back(tbo[i].at(0).get<std::string>());
            const auto & buft = tbo[i].at(1);  // a handle, or the name of a registered device's buffer type
            overrides[i] = {patterns.back().c_str(), buft.is_number_unsigned()
                ? reinterpret_cast<ggml_backend_buffer_type_t>(static_cast<uintptr_t>(buft.get<uint64_t>()))
                : buft_by_name(buft.get<std::string>())};
        }
        mparams.tensor_buft_overrides = overrides.data();
    }

    if (in.contains("n_ctx"))           cparams.n_ctx           = in["n_ctx"].get<uint32_t>();
    if (in.contains("n_seq_max"))       cparams.n_seq_max       = in["n_seq_max"].get<uint32_t>();
    if (in.contains("kv_unified"))      cparams.kv_unified      = in["kv_unified"].get<bool>();
    if (in.contains("n_batch"))         cparams.n_batch         = in["n_batch"].get<uint32_t>();
    if (in.contains("n_ubatch"))        cparams.n_ubatch        = in["n_ubatch"].get<uint32_t>();
    if (in.contains("flash_attn_type")) cparams.flash_attn_type = (llama_flash_attn_type) in["flash_attn_type"].get<int>();
    if (in.contains("type_k"))          cparams.type_k          = (ggml_type) in["type_k"].get<int>();
    if (in.contains("type_v"))          cparams.type_v          = (ggml_type) in["type_v"].get<int>();
    if (in.contains("offload_kqv"))     cparams.offload_kqv     = in["offload_kqv"].get<bool>();
    if (in.contains("swa_full"))        cparams.swa_full        = in["swa_full"].get<bool>();
    const uint32_t n_ctx_min = in.contains("n_ctx_min") ? in["n_ctx_min"].get<uint32_t>() : 4096;

    std::vector<size_t> margins(nd_max, size_t(1024) * 1024 * 1024);  // common_params::fit_params_target
    if (in.contains("margins")) {
        const auto & m = in["margins"];
        if (m.size() == 1) {
            std::fill(margins.begin(), margins.end(), m[0].get<size_t>());
        } else if (m.size() > nd_max) {
            throw std::invalid_argument("more margins than llama_max_devices()");
        } else {
            for (size_t i = 0; i < m.size(); ++i) {
                margins[i] = m[i].get<size_t>();
            }
        }
    }
    const bool verbose = in.contains("verbose") && in["verbose"].get<bool>();

    quiet_common_logger();
    common_params_fit_status status;
    {
        std::lock_guard<std::mutex> lock(fit_mutex);
        status = common_fit_params(path.c_str(), &mparams, &cparams, tensor_split.data(), overrides.data(),
                                   margins.data(), n_ctx_min, nullptr,
                                   verbose ? GGML_LOG_LEVEL_DEBUG : GGML_LOG_LEVEL_ERROR);
    }

    ojson out;
    out["status"] = status == COMMON_PARAMS_FIT_STATUS_SUCCESS ? "success"
                  : status == COMMON_PARAMS_FIT_STATUS_FAILURE ? "failure" : "error";
    out["n_ctx"] = cparams.n_ctx;
    out["n_gpu_layers"] = mparams.n_gpu_layers;
    // as llama-fit-params prints them: trailing zeros dropped, nothing for a single device
    ojson ts = ojson::array();
    if (mparams.tensor_split != nullptr) {
        size_t nd = nd_max;
        while (nd > 1 && mparams.tensor_split[nd - 1] == 0.0f) {
            nd--;
        }
        if (nd > 1) {
            for (size_t i = 0; i < nd; ++i) {
                ts.push_back(mparams.tensor_split[i]);
            }
        }
    }
    out["tensor_split"] = ts;
    ojson tbo = ojson::array();
    if (mparams.tensor_buft_overrides != nullptr) {
        for (size_t i = 0; i < ntbo && mparams.tensor_buft_overrides[i].pattern != nullptr; ++i) {
            tbo.push_back({mparams.tensor_buft_overrides[i].pattern,
                           ggml_backend_buft_name(mparams.tensor_buft_overrides[i].buft)});
        }
    }
    out["tensor_buft_overrides"] = tbo;
    return out;
}

}  // namespace

char * llama_cpp_ext_fit_params(const char * params_json) {
    try {
        if (params_json == nullptr) {
            throw std::invalid_argument("params_json is NULL");
        }
        ojson in = ojson::parse(params_json);
        if (!in.is_object()) {
            throw std::invalid_argument("params must be a JSON object");
        }
        return dup_c(fit(in).dump(-1, ' ', false, ojson::error_handler_t::replace));
    } catch (const ojson::exception & e) {
        return fit_error("json", e.what());
    } catch (const std::invalid_argument & e) {
        return fit_error("invalid_argument", e.what());
    } catch (const std::exception & e) {
        return fit_error("runtime_error", e.what());
    } catch (...) {
        return fit_error("exception", "unknown C++ exception");
    }
}
