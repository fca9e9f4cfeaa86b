"""Tool-calling chat handlers: ``chatml-function-calling`` and ``functionary`` (v0, v1, v2).

``chatml-function-calling`` describes the tools in the system turn and lets the model choose
between ``message:`` and ``functions.<name>:`` under a grammar; the arguments are then generated
under the tool's JSON-schema grammar, one call after another until the model ends its turn. The
prompt text is llama-cpp-python's (its template renders with HTML autoescaping, and so does this
one, so the model sees the same characters).

Where llama-cpp-python's behaviour is a plain defect these handlers do what it meant: after
``message:`` the reply is free text (upstream constrains it to tool names), a follow-up call is
recognised (upstream's comparison keeps the trailing colon, so a second call never happens), a
streamed automatic tool call streams its arguments (upstream raises), and ``tool_choice="none"``
with functionary answers with a message.

``functionary-v1``/``-v2`` render through the model's Hugging Face tokenizer
(``Llama(tokenizer=LlamaHFTokenizer.from_pretrained(...))``), as upstream requires.
"""

from __future__ import annotations

import json
from typing import Any

import jinja2

from .._errors import TemplateError
from .._generation import responses as R
from .._safety.template_budget import DEFAULT_LIMITS
from ..llama_grammar import JSON_GBNF, LlamaGrammar
from . import handler as H
from .base import make_strict_environment

# ---- chatml-function-calling ---------------------------------------------------------------------

CHATML_FUNCTION_CALLING_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message.role }}\n"
    "{% if message.role == 'system' %}"
    "{{ message.content }}"
    "{% if tool_calls %}"
    "\n\nYou have access to the following functions:\n"
    "{% for tool in tools %}"
    "\nfunctions.{{ tool.function.name }}:\n"
    "{{ tool.function.parameters | tojson }}"
    "\n{% endfor %}"
    "\n\nYou can respond to users messages with either a single message or one or more function calls."
    "\n\nTo respond with a message begin the message with 'message:', use the following format:"
    "\n\nmessage:"
    "\n<message>"
    "\n\nTo respond with one or more function calls begin the message with 'functions.<function_name>:', "
    "use the following format:"
    "\n\nfunctions.<function_name>:"
    '\n{ "arg1": "value1", "arg2": "value2" }'
    "\nfunctions.<function_name>:"
    '\n{ "arg1": "value1", "arg2": "value2" }'
    "{% endif %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% if message.role == 'user' %}"
    "{{ message.content }}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% if message.role == 'assistant' %}"
    "{% if message.content and message.content | length > 0 %}"
    "{% if tool_calls %}"
    "message:\n"
    "{% endif %}"
    "{{ message.content }}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% if 'tool_calls' in message %}"
    "{% for tool_call in message.tool_calls %}"
    "functions.{{ tool_call.function.name }}:\n"
    "{{ tool_call.function.arguments }}"
    "{% endfor %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_MAX_CALLS = 16
_END = "<|im_end|>"


def _chatml_template() -> Any:
    env = make_strict_environment(autoescape=True)
    return env, env.from_string(CHATML_FUNCTION_CALLING_TEMPLATE)


def render_chatml_function_calling(messages: list[Any], tools: list[Any] | None, tool_calls: bool) -> str:
    """The prompt llama-cpp-python's ``chatml-function-calling`` writes for ``messages``."""

    env, template = _chatml_template()
    try:
        return env.render_bounded(template, DEFAULT_LIMITS, messages=messages, tools=tools or [],
                                  tool_calls=True if tool_calls else None, add_generation_prompt=True)
    except jinja2.UndefinedError as exc:
        raise TemplateError(f"chatml-function-calling: a message lacks a field the format needs: {exc}") from exc


def _names_grammar(tools: list[Any], alternative: str) -> LlamaGrammar:
    names = " | ".join(json.dumps(f"functions.{t['function']['name']}:") for t in tools)
    return LlamaGrammar.from_string(f'root ::= functions | {json.dumps(alternative)}\nfunctions ::= {names}\n')


def chatml_function_calling(*, llama: Any, messages: list[Any], functions: Any = None, function_call: Any = None,
                            tools: Any = None, tool_choice: Any = None, stream: bool = False, stop: Any = None,
                            response_format: Any = None, max_tokens: int | None = None,
                            logits_processor: Any = None, grammar: Any = None, logprobs: bool | None = None,
                            top_logprobs: int | None = None, **kwargs: Any) -> Any:
    tools, tool_choice = H.tools_from_functions(functions, function_call, tools, tool_choice)
    stops = H.stop_list(stop, _END)
    sampling = H.sampling_kwargs(kwargs, hooks={"logits_processor": logits_processor})
    lp = top_logprobs if logprobs else None

    def complete(prompt: str, **kw: Any) -> Any:
        tokens = H.prompt_tokens(llama, prompt, messages, added_special=False)
        return llama.create_completion(prompt=tokens, **{**sampling, **kw})

    if not tools or tool_choice is None or tool_choice == "none":
        prompt = render_chatml_function_calling(messages, [], False)
        if response_format is not None:
            grammar = H.grammar_for_response_format(response_format) or grammar
        return R.to_chat(complete(prompt, stream=stream, stop=stops, max_tokens=max_tokens, grammar=grammar,
                                  logprobs=lp), stream)

    prompt = render_chatml_function_calling(messages, tools, True)
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        tool = H.find_tool(tools, name)
        completion = complete(prompt + f"functions.{name}:\n", stream=stream, stop=stops, max_tokens=max_tokens,
                              grammar=H.grammar_for_schema(tool["function"].get("parameters") or {}))
        return R.to_chat(completion, stream, name)
    if tool_choice not in ("auto", "required"):
        raise ValueError(f"unsupported tool_choice {tool_choice!r}: use 'none', 'auto', 'required' or "
                         "{'type': 'function', 'function': {'name': ...}}")

    alternative = "message:" if tool_choice == "auto" else None
    first = complete(prompt, temperature=0, stream=False, stop=[":"], max_tokens=None,
                     grammar=_names_grammar(tools, alternative) if alternative else LlamaGrammar.from_string(
                         "root ::= " + " | ".join(json.dumps(f"functions.{t['function']['name']}:") for t in tools)))
    text = first["choices"][0]["text"]
    if text.startswith("message"):
        return R.to_chat(complete(prompt + "message:\n", stream=stream, stop=stops, max_tokens=max_tokens,
                                  logprobs=lp), stream)

    name = text[len("functions."):].rstrip(":")
    tool = H.find_tool(tools, name)
    if stream:
        completion = complete(prompt + f"functions.{name}:\n", stream=True, stop=stops, max_tokens=max_tokens,
                              grammar=H.grammar_for_schema(tool["function"].get("parameters") or {}))
        return R.to_chat(completion, True, name)

    calls: list[tuple[str, dict[str, Any]]] = []
    while tool is not None and len(calls) < _MAX_CALLS:
        prompt += f"functions.{name}:\n"
        completion = complete(prompt, stream=False, stop=stops, max_tokens=max_tokens,
                              grammar=H.grammar_for_schema(tool["function"].get("parameters") or {}))
        calls.append((name, completion))
        prompt += completion["choices"][0]["text"] + "\n"
        follow = complete(prompt, stream=False, stop=stops + [":"], max_tokens=None,
                          grammar=_names_grammar(tools, _END))
        following = follow["choices"][0]["text"]
        tool = None
        if following.startswith("functions."):
            name = following[len("functions."):].rstrip(":")
            tool = next((t for t in tools if t["function"]["name"] == name), None)
    return _merge_calls(calls)


def _merge_calls(calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    first = calls[0][1]
    message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [
        {"id": R.call_id(name, c["id"], i), "type": "function",
         "function": {"name": name, "arguments": c["choices"][0]["text"]}}
        for i, (name, c) in enumerate(calls)]}
    if len(calls) == 1:
        message["function_call"] = {"name": calls[0][0], "arguments": first["choices"][0]["text"]}
    usage = {k: sum(c["usage"][k] for _, c in calls) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    return {"id": "chat" + first["id"], "object": "chat.completion", "created": first["created"],
            "model": first["model"],
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": message,
                         "logprobs": R.chat_logprobs(first["choices"][0]["logprobs"])}],
            "usage": usage}


# ---- functionary: tool signatures as TypeScript ---------------------------------------------------

FUNCTIONARY_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives "
                      "helpful, detailed, and polite answers to the user's questions. The assistant calls functions "
                      "with appropriate input when necessary")


def _ts_type(param: dict[str, Any], level: int) -> str:
    indent = "  " * level
    if "$ref" in param:
        return str(param["$ref"]).rsplit("/", 1)[-1]
    if param.get("type") == "array":
        return f"Array<{_ts_type(param.get('items', {}), level + 1)}>"
    if param.get("type") == "object":
        body = "".join(f"{indent}  {name}: {_ts_type(sub, level + 1)},\n"
                       for name, sub in param.get("properties", {}).items())
        return "{\n" + body + indent + "}"
    if "enum" in param:
        return " | ".join(f'"{v}"' for v in param["enum"])
    return str(param.get("type", "any"))


def typescript_namespace(functions: list[dict[str, Any]], *, indent_members: bool = True,
                         trailing_newline: bool = True, namespace: str = "functions") -> str:
    """The ``namespace functions { ... }`` block functionary models are trained on."""
    pad = "  " if indent_members else ""
    out = ["// Supported function definitions that should be called when necessary.\n",
           f"namespace {namespace} {{\n\n"]
    shared: dict[str, Any] = {}
    for f in functions:
        shared.update((f.get("parameters") or {}).get("$defs", {}))
    for name, d in shared.items():
        value = _ts_type(d, 1) if d.get("type") == "object" else (
            " | ".join(f'"{v}"' for v in d["enum"]) if "enum" in d else "")
        out.append(f"  type {name} = {value};\n")
    for f in functions:
        params = f.get("parameters") or {}
        required = params.get("required", [])
        out.append(f"{pad}// {f.get('description', '')}\n{pad}type {f['name']} = (_: {{\n")
        for pname, p in params.get("properties", {}).items():
            opt = "" if pname in required else "?"
            out.append(f"{pad}  // {p.get('description', '')}\n{pad}  {pname}{opt}: {_ts_type(p, 2)},\n"
                       if indent_members else f"// {p.get('description', '')}\n{pname}{opt}: {_ts_type(p, 2)},\n")
        out.append(f"{pad}}}) => any;\n\n")
    out.append(f"}} // namespace {namespace}" + ("\n" if trailing_newline else ""))
    return "".join(out)


def _functionary_turn(msg: dict[str, Any]) -> str:
    role, content = msg["role"], msg.get("content")
    if role == "system":
        return f"system:\n{content}\n"
    if role == "function" and "name" in msg:
        return f"function name={msg['name']}:\n{content}\n"
    if role == "tool":
        return f"function name={msg['tool_call_id']}:\n{content}\n" if content is not None else \
            f"function name={msg['tool_call_id']}\n"
    if role == "user":
        return "user:\n</s></s>\n" if content is None else f"user:\n</s>{content}</s>\n"
    if role == "assistant":
        fc = msg.get("function_call")
        if fc is not None:
            head = f"assistant:\n{content}\n" if content is not None else ""
            return f"{head}assistant to={fc['name']}:\n{fc['arguments']}</s>\n"
        if msg.get("tool_calls"):
            call = msg["tool_calls"][0]
            return f"assistant to={call['id']}:\n{call['function']['arguments']}</s>\n"
        return "assistant" if content is None else f"assistant:\n{content}\n"
    raise ValueError(f"functionary: unsupported message role {role!r}")


def _qualified(messages: list[Any]) -> list[dict[str, Any]]:
    """Copies of ``messages`` with function names in the ``functions.`` namespace (the caller's
    dicts are left as they are)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "function" and "name" in m:
            m["name"] = f"functions.{m['name']}"
        if "function_call" in m and m["function_call"] is not None:
            m["function_call"] = {**m["function_call"], "name": f"functions.{m['function_call']['name']}"}
        out.append(m)
    return out


def functionary_prompt(messages: list[Any], functions: list[dict[str, Any]] | None) -> str:
    """The prompt llama-cpp-python's ``functionary`` (v0) handler writes."""
    turns: list[dict[str, Any]] = []
    if functions:
        turns.append({"role": "system", "content": typescript_namespace(functions)})
    turns.append({"role": "system", "content": FUNCTIONARY_SYSTEM})
    turns += _qualified(messages)
    turns.append({"role": "assistant", "content": None})
    return "".join(_functionary_turn(m) for m in turns)


def _schema_of(name: str, functions: list[dict[str, Any]]) -> Any:
    for f in functions:
        if f["name"] == name:
            return f.get("parameters")
    return None


def functionary_chat_handler(*, llama: Any, messages: list[Any], functions: Any = None, function_call: Any = None,
                             tools: Any = None, tool_choice: Any = None, stream: bool = False,
                             max_tokens: int | None = None, logits_processor: Any = None, grammar: Any = None,
                             **kwargs: Any) -> Any:
    if tools is not None:
        functions = [t["function"] for t in tools if t.get("type") == "function"]
    if tool_choice is not None:
        function_call = tool_choice if isinstance(tool_choice, str) else tool_choice["function"]
    sampling = H.sampling_kwargs(kwargs, hooks={"logits_processor": logits_processor})
    prompt = functionary_prompt(messages, functions)

    def complete(text: str, **kw: Any) -> Any:
        return llama.create_completion(prompt=H.prompt_tokens(llama, text, messages, added_special=False),
                                       **{**sampling, **kw})

    if not functions or function_call == "none":
        completion = complete(prompt + ":\n", stream=stream, stop=["user:", "</s>"], max_tokens=max_tokens,
                              grammar=grammar)
        return R.to_chat(completion, stream)
    if stream:
        raise ValueError("functionary: streaming a function call is not supported; use stream=False "
                         "(llama-cpp-python does not stream it either)")
    if function_call is None or function_call == "auto":
        head = complete(prompt, stop="\n", stream=False)["choices"][0]["text"]
        name = head.split(".")[-1][:-1]
        call_prompt = prompt + head + "\n"
    elif isinstance(function_call, dict):
        name = function_call["name"]
        call_prompt = prompt + f" to=functions.{name}:\n"
    else:
        name = str(function_call)
        call_prompt = prompt + ":\n"
    schema = _schema_of(name, functions)
    g = H.grammar_for_schema(schema) if schema is not None else LlamaGrammar.from_string(JSON_GBNF)
    completion = complete(call_prompt, stop=["user:", "</s>"], stream=False, grammar=g, max_tokens=max_tokens)
    args = completion["choices"][0]["text"]
    return {"id": "chat" + completion["id"], "object": "chat.completion", "created": completion["created"],
            "model": completion["model"],
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                         "logprobs": R.chat_logprobs(completion["choices"][0]["logprobs"]),
                         "message": {"role": "assistant", "content": None,
                                     "function_call": {"name": name, "arguments": args},
                                     "tool_calls": [{"id": name, "type": "function",
                                                     "function": {"name": name, "arguments": args}}]}}],
            "usage": completion["usage"]}


# ---- functionary v1 / v2: the model's own tokenizer template -------------------------------------

_V1 = {"end_assistant": "<|END_OF_ASSISTANT|>", "start_call": "<|START_OF_FUNCTION_CALL|>",
       "end_call": "<|END_OF_FUNCTION_CALL|>"}
_V2 = {"recipient": "<|recipient|>", "from": "<|from|>", "stop": "<|stop|>", "content": "<|content|>"}


def _hf_tokenizer(llama: Any) -> Any:
    tok = getattr(llama, "tokenizer_", None)
    hf = getattr(tok, "hf_tokenizer", None)
    if hf is None:
        raise ValueError("functionary-v1/v2 render prompts with the model's Hugging Face tokenizer: pass "
                         "Llama(..., tokenizer=LlamaHFTokenizer.from_pretrained('meetkai/functionary-...'))")
    return hf


def functionary_v1_v2_chat_handler(*, llama: Any, messages: list[Any], functions: Any = None,
                                   function_call: Any = None, tools: Any = None, tool_choice: Any = None,
                                   stream: bool = False, max_tokens: int | None = None,
                                   logits_processor: Any = None, grammar: Any = None, **kwargs: Any) -> Any:
    hf = _hf_tokenizer(llama)
    v1 = _V1["start_call"] in (getattr(hf, "additional_special_tokens", None) or [])
    if tools is not None:
        functions = [t["function"] for t in tools if t.get("type") == "function"]
    if tool_choice is not None:
        function_call = tool_choice if isinstance(tool_choice, str) else tool_choice["function"]
    elif function_call is None:
        function_call = "auto"
    sampling = H.sampling_kwargs(kwargs, hooks={"logits_processor": logits_processor})

    system = typescript_namespace([] if function_call == "none" else (functions or []), indent_members=False,
                                  trailing_newline=False)
    turns = [{"role": "system", "content": system}, {"role": "system", "content": FUNCTIONARY_SYSTEM},
             *_qualified(messages)]
    prompt = hf.apply_chat_template(turns, tokenize=False) + ("assistant:\n" if v1 else
                                                              "<|from|>assistant\n<|recipient|>")

    def complete(text: str, **kw: Any) -> Any:
        return llama.create_completion(prompt=H.prompt_tokens(llama, text, messages, added_special=False),
                                       **{**sampling, "max_tokens": max_tokens, **kw})

    if function_call == "none" or not functions:
        if v1:
            completion = complete(prompt, stream=stream, stop=_V1["end_assistant"], grammar=grammar)
        else:
            completion = complete(prompt + "all\n<|content|>", stream=stream, stop=_V2["stop"], grammar=grammar)
        if not stream:
            completion["choices"][0]["text"] = completion["choices"][0]["text"].lstrip()
        return R.to_chat(completion, stream)
    if stream:
        if isinstance(function_call, dict) and not v1:
            name = function_call["name"]
            completion = complete(prompt + f"{name}\n{_V2['content']}", stream=True,
                                  stop=[_V2["stop"], _V2["from"]], grammar=_grammar_for(name, functions))
            return R.to_chat(completion, True, name)
        raise ValueError("functionary-v1/v2: streaming is supported for a named tool_choice on v2 only")

    calls: list[tuple[str, dict[str, Any]]] = []
    content: str | None = None
    last: dict[str, Any] | None = None
    if isinstance(function_call, dict):
        name = function_call["name"]
        if v1:
            text = prompt + f"{_V1['start_call']}{name}:\n"
            stops = [_V1["end_call"], _V1["end_assistant"]]
        else:
            text = prompt + f"{name}\n{_V2['content']}"
            stops = [_V2["stop"], _V2["from"]]
        calls.append((name, complete(text, stream=False, stop=stops, grammar=_grammar_for(name, functions))))
    elif v1:
        head = complete(prompt, stream=False, stop=["\n", _V1["end_assistant"]])
        text = head["choices"][0]["text"]
        if _V1["start_call"] not in text:
            head["choices"][0]["text"] = text.lstrip()
            return R.to_chat(head, False)
        name = text.split(_V1["start_call"])[-1].strip().rstrip(":").strip()
        call_prompt = prompt + text.replace(f"{_V1['start_call']} ", _V1["start_call"]) + "\n"
        calls.append((name, complete(call_prompt, stream=False, stop=_V1["end_call"],
                                     grammar=_grammar_for(name, functions))))
    else:
        text = prompt
        for _ in range(_MAX_CALLS):
            recipient = complete(text, stream=False, stop="\n", max_tokens=64,
                                 grammar=_names_only(functions, extra=["all"]))["choices"][0]["text"]
            text += f"{recipient}\n{_V2['content']}"
            if recipient == "all":
                c = complete(text, stream=False, stop=[_V2["stop"], _V2["from"]])
                content = (content or "") + c["choices"][0]["text"].lstrip()
                text += c["choices"][0]["text"]
            else:
                c = complete(text, stream=False, stop=[_V2["stop"], _V2["from"]],
                             grammar=_grammar_for(recipient, functions))
                calls.append((recipient, c))
                text += c["choices"][0]["text"]
            last = c
            if c["choices"][0]["finish_reason"] != "stop" or not _more_v2(llama, text, sampling):
                break
            text += f"\n{_V2['from']}assistant\n{_V2['recipient']}"
    if not calls:
        assert last is not None  # the v2 loop ran at least once
        last["choices"][0]["text"] = content or ""
        return R.chat_response(last)
    merged = _merge_calls(calls)
    merged["choices"][0]["message"]["content"] = content
    return merged


def _more_v2(llama: Any, text: str, sampling: dict[str, Any]) -> bool:
    """Whether a functionary-v2 model continues its turn (``<|from|>``) rather than ending it."""
    nxt = llama.create_completion(prompt=H.prompt_tokens(llama, text, [], added_special=False), stream=False,
                                  max_tokens=8, grammar=LlamaGrammar.from_string(
                                      f'root ::= {json.dumps(_V2["stop"])} | {json.dumps(_V2["from"])}'),
                                  **sampling)
    return nxt["choices"][0]["text"].startswith(_V2["from"])


def _names_only(functions: list[dict[str, Any]], extra: list[str] | None = None) -> LlamaGrammar:
    names = [f["name"] for f in functions] + list(extra or [])
    return LlamaGrammar.from_string("root ::= " + " | ".join(json.dumps(n) for n in names))


def _grammar_for(name: str, functions: list[dict[str, Any]]) -> LlamaGrammar:
    schema = _schema_of(name.removeprefix("functions."), functions)
    return H.grammar_for_schema(schema) if schema is not None else LlamaGrammar.from_string(JSON_GBNF)


__all__ = ["CHATML_FUNCTION_CALLING_TEMPLATE", "chatml_function_calling", "functionary_chat_handler",
           "functionary_prompt", "functionary_v1_v2_chat_handler", "render_chatml_function_calling",
           "typescript_namespace"]
