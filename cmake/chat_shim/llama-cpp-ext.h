/* llama-cpp-python's C API over llama.cpp's common library (libllama-common).
 *
 * llama.cpp's chat layer (common/chat.h: Jinja template application, the PEG and automatic
 * parsers of tool calls and reasoning, partial parsing for streams, lazy grammar triggers) is C++
 * only; this library wraps it in a few C functions that take and return JSON, so a ctypes binding
 * can call it. Later groups (e.g. llama_cpp_ext_fit_* over common/fit.h) join under the same prefix.
 *
 * Every function that returns char * returns a NUL-terminated UTF-8 JSON document that the caller
 * frees with llama_cpp_ext_free_string(); on failure that document is {"error": "...", "kind": "..."}
 * (kind: "invalid_argument", "runtime_error", "json", "exception"). No C++ exception crosses this
 * boundary.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#    ifdef LLAMA_CPP_EXT_BUILD
#        define LLAMA_CPP_EXT_API __declspec(dllexport)
#    else
#        define LLAMA_CPP_EXT_API __declspec(dllimport)
#    endif
#else
#    define LLAMA_CPP_EXT_API __attribute__((visibility("default")))
#endif

#define LLAMA_CPP_EXT_API_VERSION 1

struct llama_model;
struct llama_cpp_ext_chat_templates;
struct llama_cpp_ext_chat_parser;

/* LLAMA_CPP_EXT_API_VERSION of the built library. */
LLAMA_CPP_EXT_API int llama_cpp_ext_api_version(void);

/* Free a string returned by this library (NULL is ignored). */
LLAMA_CPP_EXT_API void llama_cpp_ext_free_string(char * str);

/* Load the chat templates of `model` (may be NULL) or of the given template text.
 * params: {"chat_template": "..." (else the model's), "bos_token": "...", "eos_token": "..."}.
 * On success *out receives the handle and the result describes it:
 * {"caps": {...}, "source": "...", "tool_use_source": "..."|null, "was_explicit": bool,
 *  "supports_enable_thinking": bool}. */
LLAMA_CPP_EXT_API char * llama_cpp_ext_chat_templates_init(const struct llama_model * model, const char * params_json,
                                                           struct llama_cpp_ext_chat_templates ** out);
LLAMA_CPP_EXT_API void   llama_cpp_ext_chat_templates_free(struct llama_cpp_ext_chat_templates * tmpls);

/* Render a conversation (OpenAI-style JSON inputs: messages, tools, tool_choice, parallel_tool_calls,
 * json_schema, grammar, add_generation_prompt, continue_final_message, chat_template_kwargs,
 * enable_thinking, reasoning_format, reasoning_effort, use_jinja, add_bos, add_eos, now) into
 * {"prompt", "format", "format_name", "grammar", "grammar_lazy", "grammar_triggers", "preserved_tokens",
 *  "additional_stops", "generation_prompt", "supports_thinking", "thinking_start_tag",
 *  "thinking_end_tags", "parser"}. */
LLAMA_CPP_EXT_API char * llama_cpp_ext_chat_apply(const struct llama_cpp_ext_chat_templates * tmpls,
                                                  const char * inputs_json);

/* Parse model output (`text`, `len` bytes) into a message {"role", "content", "reasoning_content",
 * "tool_calls": [{"name", "arguments", "id"}]}. params: {"format", "parser", "generation_prompt",
 * "reasoning_format", "reasoning_in_content", "parse_tool_calls", "is_continuation", "echo"} as
 * returned by llama_cpp_ext_chat_apply. is_partial: the text is a prefix of a stream. */
LLAMA_CPP_EXT_API char * llama_cpp_ext_chat_parse(const char * params_json, const char * text, size_t len,
                                                  bool is_partial);

/* The same with the parameters loaded once (a stream parses its growing text once per token). */
LLAMA_CPP_EXT_API char * llama_cpp_ext_chat_parser_init(const char * params_json, struct llama_cpp_ext_chat_parser ** out);
LLAMA_CPP_EXT_API char * llama_cpp_ext_chat_parser_parse(const struct llama_cpp_ext_chat_parser * parser,
                                                         const char * text, size_t len, bool is_partial);
LLAMA_CPP_EXT_API void   llama_cpp_ext_chat_parser_free(struct llama_cpp_ext_chat_parser * parser);

#ifdef __cplusplus
}
#endif
