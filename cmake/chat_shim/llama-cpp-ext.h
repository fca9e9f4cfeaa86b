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

#define LLAMA_CPP_EXT_API_VERSION 3

struct llama_model;
struct llama_sampler;
struct llama_cpp_ext_chat_templates;
struct llama_cpp_ext_chat_parser;
struct llama_cpp_ext_chat_stream;

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

/* common_chat_msg_diff::compute_diffs: what message `new_json` adds to `prev_json` (both as
 * llama_cpp_ext_chat_parse returns them): {"diffs": [{"reasoning_content", "content", "index" (null for
 * no tool call), "id", "name", "arguments"}]}; an error when `new_json` does not extend `prev_json`. */
LLAMA_CPP_EXT_API char * llama_cpp_ext_chat_msg_diffs(const char * prev_json, const char * new_json);

/* A streamed answer, as llama-server follows one (task_result_state::update_chat_msg with
 * filter_tool_calls): params as llama_cpp_ext_chat_parser_init's. Each feed appends `text` (`len` bytes),
 * parses the whole output (partial while is_partial) and returns only what changed:
 * {"deltas": [OpenAI delta objects], "new_ids": [...]}. A tool call's delta that introduces it (its
 * "type" and function name) has "id": "", for the caller to fill with the call's id: the format's own
 * (the call's entry in "new_ids", given once, when the call first appears), else one the caller makes.
 * A failed parse leaves the state as it was (the text stays appended). */
LLAMA_CPP_EXT_API char * llama_cpp_ext_chat_stream_init(const char * params_json,
                                                        struct llama_cpp_ext_chat_stream ** out);
LLAMA_CPP_EXT_API char * llama_cpp_ext_chat_stream_feed(struct llama_cpp_ext_chat_stream * stream, const char * text,
                                                        size_t len, bool is_partial);
/* The message parsed so far (as llama_cpp_ext_chat_parse returns it; ids as in "new_ids"). */
LLAMA_CPP_EXT_API char * llama_cpp_ext_chat_stream_message(const struct llama_cpp_ext_chat_stream * stream);
LLAMA_CPP_EXT_API void   llama_cpp_ext_chat_stream_free(struct llama_cpp_ext_chat_stream * stream);

/* The sampler that constrains a chat answer as llama-server's common_sampler does, to be applied to the
 * candidates before the sampling chain and told every generated token (llama_sampler_apply/_accept):
 * - the template's grammar: strict, advanced past the generation prompt; or lazy, unconstrained until a
 *   trigger (a word, a regex pattern searched in the output, a full-output pattern, or a token) appears,
 *   then constrained from the trigger on (llama_sampler_init_grammar_lazy_patterns);
 * - the reasoning budget (common_reasoning_budget_init): after `budget` tokens inside the thinking block
 *   the message and the first end tag are forced; with a lazy grammar the grammar waits outside the
 *   thinking block (a call mentioned while thinking does not trigger it).
 * A grammar that refuses a token (it would throw inside llama.cpp) is dropped and the generation goes on
 * unconstrained; llama_cpp_ext_chat_sampler_state reports it.
 * params: {"grammar", "grammar_lazy", "grammar_triggers": [{"type": "word"|"pattern"|"pattern_full"|"token",
 *  "value", "token"}], "preserved_tokens": [...], "generation_prompt", "prefill_grammar": bool,
 *  "reasoning_budget": int (-1 unlimited), "thinking_start_tag", "thinking_end_tags": [...],
 *  "reasoning_budget_message"}.
 * On success *out receives the sampler (NULL when there is nothing to constrain; free it with
 * llama_sampler_free or let a chain own it) and the result is {"preserved_token_ids": [...],
 * "trigger_patterns": [...], "trigger_tokens": [...], "grammar": bool, "reasoning_budget": bool}. */
LLAMA_CPP_EXT_API char * llama_cpp_ext_chat_sampler_init(const struct llama_model * model, const char * params_json,
                                                         struct llama_sampler ** out);

/* {"grammar": "none"|"active"|"failed", "reason": "why it failed", "reasoning": "none"|"idle"|"counting"|"forcing"|
 * "waiting_utf8"|"done"} for a sampler made by llama_cpp_ext_chat_sampler_init ({"error", "kind"} for any
 * other sampler). */
LLAMA_CPP_EXT_API char * llama_cpp_ext_chat_sampler_state(const struct llama_sampler * smpl);

#ifdef __cplusplus
}
#endif
