// The C API of llama-cpp-ext.h over llama.cpp's common/chat.h. JSON in, JSON out; every exception is
// caught here and returned as {"error": ...}.

#include "llama-cpp-ext.h"

#include "chat.h"
#include "common.h"
#include "log.h"
#include "peg-parser.h"
#include "reasoning-budget.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

using ojson = nlohmann::ordered_json;

struct llama_cpp_ext_chat_templates {
    common_chat_templates_ptr ptr;
};

struct llama_cpp_ext_chat_parser {
    common_chat_parser_params params;
};

// llama-server's task_result_state for one streamed answer: the output so far, the last message, the
// tool call ids fixed when each call first appears, and which calls' names were sent.
struct llama_cpp_ext_chat_stream {
    common_chat_parser_params params;
    std::string               text;
    common_chat_msg           msg;
    std::vector<std::string>  ids;  // the format's own id of each call, "" where it gave none
    std::vector<bool>         sent_names;
};

namespace {

char * dup_string(const std::string & s) {
    char * out = static_cast<char *>(std::malloc(s.size() + 1));
    if (out != nullptr) {
        std::memcpy(out, s.data(), s.size());
        out[s.size()] = '\0';
    }
    return out;
}

char * error_json(const char * kind, const std::string & message) {
    ojson err = {{"error", message}, {"kind", kind}};
    return dup_string(err.dump(-1, ' ', false, ojson::error_handler_t::replace));
}

char * to_c(const ojson & j) {
    return dup_string(j.dump(-1, ' ', false, ojson::error_handler_t::replace));
}

// Run `fn` (returning ojson), turning every exception into an error document.
template <typename F> char * guarded(F && fn) {
    try {
        return to_c(fn());
    } catch (const ojson::exception & e) {
        return error_json("json", e.what());
    } catch (const std::invalid_argument & e) {
        return error_json("invalid_argument", e.what());
    } catch (const std::exception & e) {
        return error_json("runtime_error", e.what());
    } catch (...) {
        return error_json("exception", "unknown C++ exception");
    }
}

// common's own logger writes to stderr from a thread of its own: silence it (errors come back as
// exceptions, which the binding raises).
void quiet_common_log() {
    static std::once_flag once;
    std::call_once(once, [] { common_log_set_verbosity_thold(-1); });
}

ojson parse_object(const char * text, const char * what) {
    if (text == nullptr || *text == '\0') {
        return ojson::object();
    }
    ojson j = ojson::parse(text);
    if (!j.is_object()) {
        throw std::invalid_argument(std::string(what) + " must be a JSON object");
    }
    return j;
}

template <typename T> T get_or(const ojson & j, const char * key, const T & dflt) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
        return dflt;
    }
    return it->get<T>();
}

common_json to_common(const ojson & j) { return common_json::parse(j.dump()); }

ojson from_common(const common_json & j) { return ojson::parse(j.dump()); }

const char * trigger_type_name(common_grammar_trigger_type t) {
    switch (t) {
        case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN:        return "token";
        case COMMON_GRAMMAR_TRIGGER_TYPE_WORD:         return "word";
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN:      return "pattern";
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: return "pattern_full";
    }
    return "unknown";
}

ojson msg_to_json(const common_chat_msg & msg) {
    ojson calls = ojson::array();
    for (const auto & tc : msg.tool_calls) {
        calls.push_back({{"name", tc.name}, {"arguments", tc.arguments}, {"id", tc.id}});
    }
    return {
        {"role", msg.role.empty() ? std::string("assistant") : msg.role},
        {"content", msg.content},
        {"reasoning_content", msg.reasoning_content},
        {"tool_calls", calls},
    };
}

common_chat_msg msg_from_json(const ojson & j) {
    if (!j.is_object()) {
        throw std::invalid_argument("a message must be a JSON object");
    }
    common_chat_msg msg;
    msg.role              = get_or<std::string>(j, "role", "assistant");
    msg.content           = get_or<std::string>(j, "content", "");
    msg.reasoning_content = get_or<std::string>(j, "reasoning_content", "");
    auto it               = j.find("tool_calls");
    if (it != j.end() && it->is_array()) {
        for (const auto & tc : *it) {
            msg.tool_calls.push_back({get_or<std::string>(tc, "name", ""), get_or<std::string>(tc, "arguments", ""),
                                      get_or<std::string>(tc, "id", "")});
        }
    }
    return msg;
}

ojson diff_to_json(const common_chat_msg_diff & d) {
    ojson j = {
        {"reasoning_content", d.reasoning_content_delta},
        {"content", d.content_delta},
        {"index", nullptr},
        {"id", d.tool_call_delta.id},
        {"name", d.tool_call_delta.name},
        {"arguments", d.tool_call_delta.arguments},
    };
    if (d.tool_call_index != std::string::npos) {
        j["index"] = d.tool_call_index;
    }
    return j;
}

// server_chat_msg_diff_to_json_oaicompat, with the id of a call whose header this is left to the caller
// (`header`: the diff carries the call's id, type and name).
ojson delta_to_oaicompat(const common_chat_msg_diff & d, bool header) {
    ojson delta = ojson::object();
    if (!d.reasoning_content_delta.empty()) {
        delta["reasoning_content"] = d.reasoning_content_delta;
    }
    if (!d.content_delta.empty()) {
        delta["content"] = d.content_delta;
    }
    if (d.tool_call_index != std::string::npos) {
        ojson call = {{"index", d.tool_call_index}};
        if (header) {
            call["id"]   = "";
            call["type"] = "function";
        }
        if (!d.tool_call_delta.name.empty() || !d.tool_call_delta.arguments.empty()) {
            ojson fn = ojson::object();
            if (!d.tool_call_delta.name.empty()) {
                fn["name"] = d.tool_call_delta.name;
            }
            if (!d.tool_call_delta.arguments.empty()) {
                fn["arguments"] = d.tool_call_delta.arguments;
            }
            call["function"] = fn;
        }
        delta["tool_calls"] = ojson::array({call});
    }
    return delta;
}

// task_result_state::update_chat_msg with filter_tool_calls (tools/server/server-task.cpp): a call's
// name is sent once complete (when its arguments start, another delta follows, or the output ends).
// The state changes only when the whole step succeeds.
ojson stream_update(llama_cpp_ext_chat_stream & s, bool is_partial) {
    common_chat_msg msg = common_chat_parse(s.text, is_partial, s.params);
    ojson           out = {{"deltas", ojson::array()}};
    if (msg.empty()) {
        return out;
    }
    auto         ids      = s.ids;
    const size_t n_before = ids.size();
    msg.set_tool_call_ids(ids, [] { return std::string(); });
    auto diffs = common_chat_msg_diff::compute_diffs(s.msg, msg);
    auto sent  = s.sent_names;
    sent.resize(msg.tool_calls.size(), false);

    std::vector<std::pair<common_chat_msg_diff, bool>> kept;  // (diff, header)
    auto                                               header = [&](size_t i) {
        common_chat_msg_diff h;
        h.tool_call_index      = i;
        h.tool_call_delta.name = msg.tool_calls[i].name;
        kept.emplace_back(std::move(h), true);
        sent[i] = true;
    };
    for (auto & d : diffs) {
        for (size_t i = 0; i < msg.tool_calls.size(); ++i) {
            if (!sent[i] && !msg.tool_calls[i].name.empty() &&
                (d.tool_call_index != i || !d.tool_call_delta.arguments.empty())) {
                header(i);
            }
        }
        if (d.tool_call_index == std::string::npos) {
            kept.emplace_back(std::move(d), false);
            continue;
        }
        const size_t i = d.tool_call_index;
        if (sent[i]) {
            if (!d.tool_call_delta.arguments.empty()) {
                d.tool_call_delta.name.clear();
                d.tool_call_delta.id.clear();
                kept.emplace_back(std::move(d), false);
            }
        } else if (!d.tool_call_delta.arguments.empty() || !is_partial) {
            d.tool_call_delta.name = msg.tool_calls[i].name;
            kept.emplace_back(std::move(d), true);
            sent[i] = true;
        }
    }
    if (!is_partial) {
        for (size_t i = 0; i < msg.tool_calls.size(); ++i) {
            if (!sent[i] && !msg.tool_calls[i].name.empty()) {
                header(i);
            }
        }
    }
    for (const auto & [d, is_header] : kept) {
        ojson delta = delta_to_oaicompat(d, is_header);
        if (!delta.empty()) {
            out["deltas"].push_back(std::move(delta));
        }
    }
    if (ids.size() > n_before) {
        out["new_ids"] = std::vector<std::string>(ids.begin() + n_before, ids.end());
    }
    s.msg        = std::move(msg);
    s.ids        = std::move(ids);
    s.sent_names = std::move(sent);
    return out;
}

// {"type": "function", "function": {"name": N}}: only that tool, and a call is required.
void apply_tool_choice(const ojson & in, ojson & tools, common_chat_templates_inputs & inputs) {
    auto it = in.find("tool_choice");
    if (it == in.end() || it->is_null()) {
        return;
    }
    if (it->is_string()) {
        inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(it->get<std::string>());
        return;
    }
    if (!it->is_object()) {
        throw std::invalid_argument("tool_choice must be \"auto\", \"none\", \"required\" or a named function");
    }
    std::string name;
    if (it->contains("function") && (*it)["function"].is_object()) {
        name = get_or<std::string>((*it)["function"], "name", "");
    }
    if (name.empty()) {
        name = get_or<std::string>(*it, "name", "");
    }
    if (name.empty()) {
        throw std::invalid_argument("a named tool_choice needs function.name: " + it->dump());
    }
    ojson kept = ojson::array();
    for (const auto & tool : tools) {
        if (tool.contains("function") && tool["function"].is_object() &&
            get_or<std::string>(tool["function"], "name", "") == name) {
            kept.push_back(tool);
        }
    }
    if (kept.empty()) {
        throw std::invalid_argument("tool_choice names \"" + name + "\", which is not among the tools");
    }
    tools                   = kept;
    inputs.tool_choice      = COMMON_CHAT_TOOL_CHOICE_REQUIRED;
    inputs.parallel_tool_calls = false;
}

ojson apply_inputs(const common_chat_templates * tmpls, const ojson & in) {
    common_chat_templates_inputs inputs;
    auto caps = common_chat_templates_get_caps(tmpls);

    if (!in.contains("messages") || !in["messages"].is_array()) {
        throw std::invalid_argument("inputs.messages must be an array of messages");
    }
    inputs.messages = common_chat_msgs_parse_oaicompat(to_common(in["messages"]));

    ojson tools = in.contains("tools") && in["tools"].is_array() ? in["tools"] : ojson::array();
    inputs.parallel_tool_calls = get_or<bool>(in, "parallel_tool_calls", caps["supports_parallel_tool_calls"]);
    apply_tool_choice(in, tools, inputs);
    inputs.tools = common_chat_tools_parse_oaicompat(to_common(tools));

    if (in.contains("json_schema") && !in["json_schema"].is_null()) {
        const auto & schema = in["json_schema"];
        inputs.json_schema  = schema.is_string() ? schema.get<std::string>() : schema.dump();
    }
    inputs.grammar = get_or<std::string>(in, "grammar", "");
    if (!inputs.json_schema.empty() && !inputs.grammar.empty()) {
        throw std::invalid_argument("cannot use both json_schema and grammar");
    }
    inputs.use_jinja             = get_or<bool>(in, "use_jinja", true);
    inputs.add_generation_prompt = get_or<bool>(in, "add_generation_prompt", true);
    if (in.contains("continue_final_message") && !in["continue_final_message"].is_null()) {
        inputs.continue_final_message = common_chat_continuation_parse(to_common(in["continue_final_message"]));
    }
    if (inputs.continue_final_message != COMMON_CHAT_CONTINUATION_NONE && inputs.add_generation_prompt) {
        throw std::invalid_argument("cannot set both add_generation_prompt and continue_final_message");
    }
    inputs.reasoning_format   = common_reasoning_format_from_name(get_or<std::string>(in, "reasoning_format", "auto"));
    inputs.enable_thinking    = get_or<bool>(in, "enable_thinking", true);
    inputs.add_bos            = get_or<bool>(in, "add_bos", false);
    inputs.add_eos            = get_or<bool>(in, "add_eos", false);
    inputs.force_pure_content = get_or<bool>(in, "force_pure_content", false);
    if (in.contains("now") && in["now"].is_number()) {
        auto secs  = std::chrono::duration<double>(in["now"].get<double>());
        inputs.now = std::chrono::system_clock::time_point(
            std::chrono::duration_cast<std::chrono::system_clock::duration>(secs));
    }

    if (in.contains("chat_template_kwargs") && in["chat_template_kwargs"].is_object()) {
        for (const auto & item : in["chat_template_kwargs"].items()) {
            inputs.chat_template_kwargs[item.key()] = item.value().dump();
        }
    }
    // as llama-server: the enable_thinking kwarg overrides enable_thinking
    auto kw = inputs.chat_template_kwargs.find("enable_thinking");
    if (kw != inputs.chat_template_kwargs.end()) {
        if (kw->second == "true") {
            inputs.enable_thinking = true;
        } else if (kw->second == "false") {
            inputs.enable_thinking = false;
        } else {
            throw std::invalid_argument("chat_template_kwargs.enable_thinking must be a boolean, got " + kw->second);
        }
    }
    auto effort = get_or<std::string>(in, "reasoning_effort", "");
    if (effort == "none") {
        inputs.enable_thinking = false;
        inputs.chat_template_kwargs.erase("reasoning_effort");
    } else if (!effort.empty()) {
        inputs.chat_template_kwargs["reasoning_effort"] = ojson(effort).dump();
    }

    common_chat_params p = common_chat_templates_apply(tmpls, inputs);

    ojson triggers = ojson::array();
    for (const auto & t : p.grammar_triggers) {
        ojson tj = {{"type", trigger_type_name(t.type)}, {"value", t.value}};
        if (t.type == COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN) {
            tj["token"] = t.token;
        }
        triggers.push_back(tj);
    }
    return {
        {"prompt", p.prompt},
        {"format", static_cast<int>(p.format)},
        {"format_name", common_chat_format_name(p.format)},
        {"grammar", p.grammar},
        {"grammar_lazy", p.grammar_lazy},
        {"grammar_triggers", triggers},
        {"preserved_tokens", p.preserved_tokens},
        {"additional_stops", p.additional_stops},
        {"generation_prompt", p.generation_prompt},
        {"supports_thinking", p.supports_thinking},
        {"thinking_start_tag", p.thinking_start_tag},
        {"thinking_end_tags", p.thinking_end_tags},
        {"parser", p.parser},
        {"tools_applied", inputs.tools.size()},
        {"parallel_tool_calls", inputs.parallel_tool_calls},
        {"enable_thinking", inputs.enable_thinking},
        {"reasoning_format", common_reasoning_format_name(inputs.reasoning_format)},
    };
}

common_chat_parser_params parser_params(const ojson & in) {
    common_chat_parser_params pp;
    int format = get_or<int>(in, "format", 0);
    if (format < 0 || format >= COMMON_CHAT_FORMAT_COUNT) {
        throw std::invalid_argument("unknown chat format " + std::to_string(format));
    }
    pp.format               = static_cast<common_chat_format>(format);
    pp.reasoning_format     = common_reasoning_format_from_name(get_or<std::string>(in, "reasoning_format", "auto"));
    pp.reasoning_in_content = get_or<bool>(in, "reasoning_in_content", false);
    pp.generation_prompt    = get_or<std::string>(in, "generation_prompt", "");
    pp.parse_tool_calls     = get_or<bool>(in, "parse_tool_calls", true);
    pp.is_continuation      = get_or<bool>(in, "is_continuation", false);
    pp.echo                 = get_or<bool>(in, "echo", false);
    auto parser             = get_or<std::string>(in, "parser", "");
    if (!parser.empty()) {
        pp.parser.load(parser);
    }
    return pp;
}


// ---------------------------------------------------------------------------------------------- the chat sampler
// common_sampler_init's grammar and reasoning budget (common/sampling.cpp), as one llama_sampler.

struct chat_sampler_ctx {
    llama_sampler *          grmr            = nullptr;
    llama_sampler *          rbudget         = nullptr;
    bool                     lazy            = false;
    bool                     prefill_grammar = false;
    std::vector<llama_token> prefill;  // the generation prompt's tokens: the sampler starts past them
    std::string              error;    // why the grammar was dropped

    chat_sampler_ctx() = default;
    chat_sampler_ctx(const chat_sampler_ctx &) = delete;
    chat_sampler_ctx & operator=(const chat_sampler_ctx &) = delete;

    ~chat_sampler_ctx() {
        llama_sampler_free(grmr);
        llama_sampler_free(rbudget);
    }

    // a grammar that throws is dropped: the output goes on unconstrained and is parsed as it comes
    void drop_grammar(const char * what) {
        if (error.empty()) {
            error = what;
        }
        llama_sampler_free(grmr);
        grmr = nullptr;
    }

    // common_sampler's grammar_should_apply: a lazy grammar waits outside the thinking block
    bool grammar_applies() const {
        if (grmr == nullptr) {
            return false;
        }
        if (rbudget == nullptr || !lazy) {
            return true;
        }
        const auto state = common_reasoning_budget_get_state(rbudget);
        return state == REASONING_BUDGET_IDLE || state == REASONING_BUDGET_DONE;
    }

    void accept_prefill() {
        if (grmr != nullptr && !lazy && prefill_grammar) {
            for (llama_token t : prefill) {
                llama_sampler_accept(grmr, t);
            }
        }
        if (rbudget != nullptr) {
            for (llama_token t : prefill) {
                llama_sampler_accept(rbudget, t);
            }
        }
    }
};

const char * chat_sampler_name(const llama_sampler * /*smpl*/) { return "llama-cpp-ext-chat"; }

void chat_sampler_accept(llama_sampler * smpl, llama_token token) {
    auto *     c              = static_cast<chat_sampler_ctx *>(smpl->ctx);
    const bool accept_grammar = c->grammar_applies();  // before the budget moves on this token
    try {
        if (c->rbudget != nullptr) {
            llama_sampler_accept(c->rbudget, token);
            // the budget ended the thinking block: replay its end tag, which may trigger the grammar
            const bool done = common_reasoning_budget_get_state(c->rbudget) == REASONING_BUDGET_DONE;
            if (c->grmr != nullptr && !accept_grammar && done) {
                if (const llama_tokens * end_seq = common_reasoning_budget_get_end_match(c->rbudget)) {
                    for (llama_token t : *end_seq) {
                        llama_sampler_accept(c->grmr, t);
                    }
                }
            }
        }
        if (c->grmr != nullptr && accept_grammar) {
            // llama.cpp aborts when a grammar accepts an end-of-generation token it does not allow
            llama_token_data       one   = {token, 1.0f, 0.0f};
            llama_token_data_array array = {&one, 1, -1, false};
            llama_sampler_apply(c->grmr, &array);
            if (one.logit == -INFINITY) {
                c->drop_grammar("the generated token does not match the grammar");
                return;
            }
            llama_sampler_accept(c->grmr, token);
        }
    } catch (const std::exception & e) {
        c->drop_grammar(e.what());
    }
}

void chat_sampler_apply(llama_sampler * smpl, llama_token_data_array * cur_p) {
    auto * c = static_cast<chat_sampler_ctx *>(smpl->ctx);
    try {
        if (c->rbudget != nullptr) {
            llama_sampler_apply(c->rbudget, cur_p);
        }
        if (c->grammar_applies()) {
            llama_sampler_apply(c->grmr, cur_p);
        }
    } catch (const std::exception & e) {
        c->drop_grammar(e.what());
    }
}

void chat_sampler_reset(llama_sampler * smpl) {
    auto * c = static_cast<chat_sampler_ctx *>(smpl->ctx);
    try {
        if (c->grmr != nullptr) {
            llama_sampler_reset(c->grmr);
        }
        if (c->rbudget != nullptr) {
            llama_sampler_reset(c->rbudget);
        }
        c->accept_prefill();
    } catch (const std::exception & e) {
        c->drop_grammar(e.what());
    }
}

llama_sampler * chat_sampler_clone(const llama_sampler * smpl);

void chat_sampler_free(llama_sampler * smpl) { delete static_cast<chat_sampler_ctx *>(smpl->ctx); }

llama_sampler_i chat_sampler_iface = {
    /* .name              = */ chat_sampler_name,
    /* .accept            = */ chat_sampler_accept,
    /* .apply             = */ chat_sampler_apply,
    /* .reset             = */ chat_sampler_reset,
    /* .clone             = */ chat_sampler_clone,
    /* .free              = */ chat_sampler_free,
    /* .backend_init      = */ nullptr,
    /* .backend_accept    = */ nullptr,
    /* .backend_apply     = */ nullptr,
    /* .backend_set_input = */ nullptr,
    /* .backend_reset     = */ nullptr,
    /* .copy_state        = */ nullptr,
};

llama_sampler * chat_sampler_clone(const llama_sampler * smpl) {
    const auto * c    = static_cast<const chat_sampler_ctx *>(smpl->ctx);
    auto         copy = std::make_unique<chat_sampler_ctx>();
    copy->grmr            = c->grmr != nullptr ? llama_sampler_clone(c->grmr) : nullptr;
    copy->rbudget         = c->rbudget != nullptr ? llama_sampler_clone(c->rbudget) : nullptr;
    copy->lazy            = c->lazy;
    copy->prefill_grammar = c->prefill_grammar;
    copy->prefill         = c->prefill;
    copy->error           = c->error;
    return llama_sampler_init(&chat_sampler_iface, copy.release());
}

const char * budget_state_name(common_reasoning_budget_state s) {
    switch (s) {
        case REASONING_BUDGET_IDLE:         return "idle";
        case REASONING_BUDGET_COUNTING:     return "counting";
        case REASONING_BUDGET_FORCING:      return "forcing";
        case REASONING_BUDGET_WAITING_UTF8: return "waiting_utf8";
        case REASONING_BUDGET_DONE:         return "done";
    }
    return "unknown";
}

std::vector<llama_token> tokenize_special(const llama_vocab * vocab, const std::string & text) {
    return common_tokenize(vocab, text, /* add_special= */ false, /* parse_special= */ true);
}

// server-schema's preserved_tokens and grammar_triggers handling, then common_sampler_init's
ojson chat_sampler_init(const llama_model * model, const ojson & in, llama_sampler ** out) {
    const llama_vocab * vocab = llama_model_get_vocab(model);

    std::vector<llama_token> preserved;
    if (in.contains("preserved_tokens") && in["preserved_tokens"].is_array()) {
        for (const auto & t : in["preserved_tokens"]) {
            auto ids = tokenize_special(vocab, t.get<std::string>());
            if (ids.size() == 1 && std::find(preserved.begin(), preserved.end(), ids[0]) == preserved.end()) {
                preserved.push_back(ids[0]);
            }
        }
    }

    std::vector<std::string> patterns;
    std::vector<llama_token> tokens;
    if (in.contains("grammar_triggers") && in["grammar_triggers"].is_array()) {
        for (const auto & t : in["grammar_triggers"]) {
            auto type  = get_or<std::string>(t, "type", "");
            auto value = get_or<std::string>(t, "value", "");
            if (type == "word") {
                auto ids = tokenize_special(vocab, value);
                if (ids.size() == 1 && std::find(preserved.begin(), preserved.end(), ids[0]) != preserved.end()) {
                    tokens.push_back(ids[0]);  // a preserved token: matched as a token, as llama-server does
                } else {
                    patterns.push_back(regex_escape(value));
                }
            } else if (type == "pattern") {
                patterns.push_back(value);
            } else if (type == "pattern_full") {
                std::string anchored = "^$";
                if (!value.empty()) {
                    anchored = (value.front() != '^' ? "^" : "") + value + (value.back() != '$' ? "$" : "");
                }
                patterns.push_back(anchored);
            } else if (type == "token") {
                int token = get_or<int>(t, "token", -1);
                if (token < 0) {
                    auto ids = tokenize_special(vocab, value);
                    if (ids.size() != 1) {
                        throw std::invalid_argument("trigger token \"" + value + "\" is not one token of this vocabulary");
                    }
                    token = ids[0];
                }
                if (token >= llama_vocab_n_tokens(vocab)) {
                    throw std::invalid_argument("trigger token " + std::to_string(token) + " is outside the vocabulary");
                }
                tokens.push_back(token);
            } else {
                throw std::invalid_argument("unknown grammar trigger type \"" + type + "\"");
            }
        }
    }

    auto c             = std::make_unique<chat_sampler_ctx>();
    c->lazy            = get_or<bool>(in, "grammar_lazy", false);
    c->prefill_grammar = get_or<bool>(in, "prefill_grammar", true);
    auto grammar       = get_or<std::string>(in, "grammar", "");
    if (!grammar.empty()) {
        if (c->lazy) {
            if (patterns.empty() && tokens.empty()) {
                throw std::invalid_argument("a lazy grammar needs triggers");
            }
            std::vector<const char *> patterns_c;
            patterns_c.reserve(patterns.size());
            for (const auto & p : patterns) {
                patterns_c.push_back(p.c_str());
            }
            c->grmr = llama_sampler_init_grammar_lazy_patterns(vocab, grammar.c_str(), "root", patterns_c.data(),
                                                               patterns_c.size(), tokens.data(), tokens.size());
        } else {
            c->grmr = llama_sampler_init_grammar(vocab, grammar.c_str(), "root");
        }
        if (c->grmr == nullptr) {
            throw std::invalid_argument("llama.cpp could not parse the chat format's grammar");
        }
    }

    auto gen_prompt = get_or<std::string>(in, "generation_prompt", "");
    if (!gen_prompt.empty()) {
        auto ids = tokenize_special(vocab, gen_prompt);
        for (size_t i = 0; i < ids.size(); i++) {
            std::string piece = common_token_to_piece(vocab, ids[i], true);
            // some tokenizers add a space before the first special token (as common_sampler_init)
            if (i == 0 && !piece.empty() && std::isspace(static_cast<unsigned char>(piece[0])) &&
                !std::isspace(static_cast<unsigned char>(gen_prompt[0]))) {
                continue;
            }
            c->prefill.push_back(ids[i]);
        }
    }

    int  budget    = get_or<int>(in, "reasoning_budget", -1);
    auto start_tag = get_or<std::string>(in, "thinking_start_tag", "");
    std::vector<llama_tokens> end_seqs;
    if (in.contains("thinking_end_tags") && in["thinking_end_tags"].is_array()) {
        for (const auto & t : in["thinking_end_tags"]) {
            auto tag = t.get<std::string>();
            if (!tag.empty()) {
                end_seqs.push_back(tokenize_special(vocab, tag));
            }
        }
    }
    if (budget < -1) {
        throw std::invalid_argument("reasoning_budget must be -1 (unlimited) or a number of tokens >= 0");
    }
    if (!start_tag.empty() && !end_seqs.empty() && (c->lazy || budget >= 0)) {
        llama_tokens forced = end_seqs.front();
        auto         msg    = get_or<std::string>(in, "reasoning_budget_message", "");
        if (!msg.empty()) {
            auto msg_ids = tokenize_special(vocab, msg);
            forced.insert(forced.begin(), msg_ids.begin(), msg_ids.end());
        }
        c->rbudget = common_reasoning_budget_init(vocab, {tokenize_special(vocab, start_tag)}, end_seqs, forced,
                                                  budget < 0 ? INT_MAX : budget);
        if (c->rbudget == nullptr) {
            throw std::runtime_error("the reasoning budget sampler could not be created");
        }
    }
    c->accept_prefill();  // throws when the grammar refuses the generation prompt: a bad template

    ojson res = {
        {"preserved_token_ids", preserved},
        {"trigger_patterns", patterns},
        {"trigger_tokens", tokens},
        {"grammar", c->grmr != nullptr},
        {"reasoning_budget", c->rbudget != nullptr},
    };
    if (c->grmr != nullptr || c->rbudget != nullptr) {
        *out = llama_sampler_init(&chat_sampler_iface, c.release());
    }
    return res;
}

}  // namespace

extern "C" {

int llama_cpp_ext_api_version(void) { return LLAMA_CPP_EXT_API_VERSION; }

void llama_cpp_ext_free_string(char * str) { std::free(str); }

char * llama_cpp_ext_chat_templates_init(const struct llama_model * model, const char * params_json,
                                         struct llama_cpp_ext_chat_templates ** out) {
    if (out == nullptr) {
        return error_json("invalid_argument", "out must not be NULL");
    }
    *out = nullptr;
    quiet_common_log();
    return guarded([&]() -> ojson {
        ojson in     = parse_object(params_json, "params");
        auto  source = get_or<std::string>(in, "chat_template", "");
        if (source.empty() && model == nullptr) {
            throw std::invalid_argument("give a model or a chat_template");
        }
        auto holder = std::make_unique<llama_cpp_ext_chat_templates>();
        holder->ptr = common_chat_templates_init(model, source, get_or<std::string>(in, "bos_token", ""),
                                                 get_or<std::string>(in, "eos_token", ""));
        if (!holder->ptr) {
            throw std::runtime_error("the chat template could not be loaded");
        }
        const auto * t   = holder->ptr.get();
        ojson        res = {
            {"caps", common_chat_templates_get_caps(t)},
            {"source", common_chat_templates_source(t)},
            {"tool_use_source", nullptr},
            {"was_explicit", common_chat_templates_was_explicit(t)},
            {"supports_enable_thinking", common_chat_templates_support_enable_thinking(t)},
        };
        auto tool_use = common_chat_templates_source(t, "tool_use");
        if (!tool_use.empty()) {
            res["tool_use_source"] = tool_use;
        }
        *out = holder.release();
        return res;
    });
}

void llama_cpp_ext_chat_templates_free(struct llama_cpp_ext_chat_templates * tmpls) { delete tmpls; }

char * llama_cpp_ext_chat_apply(const struct llama_cpp_ext_chat_templates * tmpls, const char * inputs_json) {
    if (tmpls == nullptr || !tmpls->ptr) {
        return error_json("invalid_argument", "tmpls must not be NULL");
    }
    return guarded([&]() -> ojson { return apply_inputs(tmpls->ptr.get(), parse_object(inputs_json, "inputs")); });
}

char * llama_cpp_ext_chat_parser_init(const char * params_json, struct llama_cpp_ext_chat_parser ** out) {
    if (out == nullptr) {
        return error_json("invalid_argument", "out must not be NULL");
    }
    *out = nullptr;
    quiet_common_log();
    return guarded([&]() -> ojson {
        auto holder    = std::make_unique<llama_cpp_ext_chat_parser>();
        holder->params = parser_params(parse_object(params_json, "params"));
        *out           = holder.release();
        return ojson::object();
    });
}

char * llama_cpp_ext_chat_parser_parse(const struct llama_cpp_ext_chat_parser * parser, const char * text, size_t len,
                                       bool is_partial) {
    if (parser == nullptr) {
        return error_json("invalid_argument", "parser must not be NULL");
    }
    if (text == nullptr && len != 0) {
        return error_json("invalid_argument", "text must not be NULL");
    }
    return guarded([&]() -> ojson {
        std::string input(text == nullptr ? "" : std::string(text, len));
        return msg_to_json(common_chat_parse(input, is_partial, parser->params));
    });
}

void llama_cpp_ext_chat_parser_free(struct llama_cpp_ext_chat_parser * parser) { delete parser; }

char * llama_cpp_ext_chat_parse(const char * params_json, const char * text, size_t len, bool is_partial) {
    llama_cpp_ext_chat_parser * parser = nullptr;
    char *                      err    = llama_cpp_ext_chat_parser_init(params_json, &parser);
    if (parser == nullptr) {
        return err;
    }
    llama_cpp_ext_free_string(err);
    char * res = llama_cpp_ext_chat_parser_parse(parser, text, len, is_partial);
    llama_cpp_ext_chat_parser_free(parser);
    return res;
}

char * llama_cpp_ext_chat_msg_diffs(const char * prev_json, const char * new_json) {
    return guarded([&]() -> ojson {
        auto  diffs = common_chat_msg_diff::compute_diffs(msg_from_json(parse_object(prev_json, "prev")),
                                                          msg_from_json(parse_object(new_json, "new")));
        ojson out   = ojson::array();
        for (const auto & d : diffs) {
            out.push_back(diff_to_json(d));
        }
        return ojson{{"diffs", out}};
    });
}

char * llama_cpp_ext_chat_stream_init(const char * params_json, struct llama_cpp_ext_chat_stream ** out) {
    if (out == nullptr) {
        return error_json("invalid_argument", "out must not be NULL");
    }
    *out = nullptr;
    quiet_common_log();
    return guarded([&]() -> ojson {
        auto holder    = std::make_unique<llama_cpp_ext_chat_stream>();
        holder->params = parser_params(parse_object(params_json, "params"));
        *out           = holder.release();
        return ojson::object();
    });
}

char * llama_cpp_ext_chat_stream_feed(struct llama_cpp_ext_chat_stream * stream, const char * text, size_t len,
                                      bool is_partial) {
    if (stream == nullptr) {
        return error_json("invalid_argument", "stream must not be NULL");
    }
    if (text == nullptr && len != 0) {
        return error_json("invalid_argument", "text must not be NULL");
    }
    return guarded([&]() -> ojson {
        if (len != 0) {
            stream->text.append(text, len);
        }
        return stream_update(*stream, is_partial);
    });
}

char * llama_cpp_ext_chat_stream_message(const struct llama_cpp_ext_chat_stream * stream) {
    if (stream == nullptr) {
        return error_json("invalid_argument", "stream must not be NULL");
    }
    return guarded([&]() -> ojson { return msg_to_json(stream->msg); });
}

void llama_cpp_ext_chat_stream_free(struct llama_cpp_ext_chat_stream * stream) { delete stream; }

char * llama_cpp_ext_chat_sampler_init(const struct llama_model * model, const char * params_json,
                                       struct llama_sampler ** out) {
    if (out == nullptr) {
        return error_json("invalid_argument", "out must not be NULL");
    }
    *out = nullptr;
    if (model == nullptr) {
        return error_json("invalid_argument", "model must not be NULL");
    }
    quiet_common_log();
    return guarded([&]() -> ojson { return chat_sampler_init(model, parse_object(params_json, "params"), out); });
}

char * llama_cpp_ext_chat_sampler_state(const struct llama_sampler * smpl) {
    if (smpl == nullptr || smpl->iface != &chat_sampler_iface) {
        return error_json("invalid_argument", "not a sampler made by llama_cpp_ext_chat_sampler_init");
    }
    return guarded([&]() -> ojson {
        const auto * c = static_cast<const chat_sampler_ctx *>(smpl->ctx);
        return {
            {"grammar", c->grmr != nullptr ? "active" : (c->error.empty() ? "none" : "failed")},
            {"reason", c->error},
            {"reasoning", c->rbudget != nullptr ? budget_state_name(common_reasoning_budget_get_state(c->rbudget))
                                                : "none"},
        };
    });
}

}  // extern "C"
