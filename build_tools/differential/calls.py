"""The calls the differential check makes, run once under each package (upstream 0.3.36 and this one).

    python calls.py MODELS.json OUT.json

Standalone on purpose: it imports only ``llama_cpp`` (whichever the interpreter has), NumPy and
the standard library, and uses only upstream 0.3.36's public API, so the same file runs in both
environments. ``MODELS.json`` names the model files (``spm``, ``bpe``, ``embed``, optional
``gemma``); ``OUT.json`` gets ``{case: result}``, a result being JSON data or ``{"error": ...}``.
Volatile fields (ids, timestamps) are dropped here; floats are compared by :mod:`.compare`.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

import llama_cpp
from llama_cpp import Llama, LlamaGrammar

PROMPTS = ("The quick brown fox", "Once upon a time", "hello world, this is")
TEXTS = ("Hello world", " leading space", "emoji \U0001f600 and accents éà", "<|im_start|>user\nhi<|im_end|>",
         "", "a" * 40, "line\nbreaks\ttabs")
#: sampler settings, each run with two seeds; keys are create_completion's keywords
SAMPLERS: dict[str, dict[str, Any]] = {
    "default": {},
    "temp-0.5": {"temperature": 0.5},
    "temp-1.5": {"temperature": 1.5},
    "temp-negative": {"temperature": -1.0},
    "top_k-1": {"top_k": 1},
    "top_k-5": {"top_k": 5},
    "top_k-0": {"top_k": 0},
    "top_p-0.5": {"top_p": 0.5},
    "min_p-0.2": {"min_p": 0.2, "top_k": 0, "top_p": 1.0},
    "typical-0.5": {"typical_p": 0.5},
    "mirostat-1": {"mirostat_mode": 1, "mirostat_tau": 3.0, "mirostat_eta": 0.2},
    "mirostat-2": {"mirostat_mode": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2},
    "mirostat-2-temp": {"mirostat_mode": 2, "temperature": 0.3},
    "repeat-1.1": {"repeat_penalty": 1.1},
    "repeat-1.5": {"repeat_penalty": 1.5},
    "frequency-0.8": {"frequency_penalty": 0.8},
    "presence-0.8": {"presence_penalty": 0.8},
    "penalties-all": {"repeat_penalty": 1.2, "frequency_penalty": 0.3, "presence_penalty": 0.3},
    "logit_bias": {"logit_bias": {5: 4.0, 17: -100.0, 30: 2.5}},
}
GBNF = r'''root ::= "yes" | "no" | "maybe " [a-z]+'''
NUMBER_GBNF = r'''root ::= [0-9]+ ("." [0-9]+)?'''
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer"}}, "required": ["name", "age"]}
CHAT_FORMATS = ("llama-2", "llama-3", "alpaca", "qwen", "vicuna", "oasst_llama", "baichuan-2", "baichuan",
                "openbuddy", "redpajama-incite", "snoozy", "phind", "intel", "open-orca", "mistrallite", "zephyr",
                "pygmalion", "chatml", "mistral-instruct", "chatglm3", "openchat", "saiga", "gemma")
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
VOLATILE = ("id", "created")


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return obj


def _model_name(out: Any) -> Any:
    if isinstance(out, dict) and "model" in out:
        out = {**out, "model": "<model>"}
    return out


class Recorder:
    def __init__(self) -> None:
        self.results: dict[str, Any] = {}

    def case(self, name: str, fn: Callable[[], Any]) -> None:
        try:
            self.results[name] = _clean(_model_name(fn()))
        except Exception as exc:  # noqa: BLE001 - recorded, compared
            self.results[name] = {"error": type(exc).__name__, "message": str(exc)[:300],
                                  "classes": [c.__name__ for c in type(exc).__mro__],
                                  "where": traceback.format_exc(limit=-1).strip().splitlines()[-2][:200]}


def tokens(rec: Recorder, llm: Llama, tag: str) -> None:
    for i, text in enumerate(TEXTS):
        for add_bos in (True, False):
            for special in (True, False):
                rec.case(f"{tag}/tokenize/{i}/bos={add_bos}/special={special}",
                         lambda t=text, b=add_bos, s=special: llm.tokenize(t.encode(), add_bos=b, special=s))
        rec.case(f"{tag}/detokenize/{i}", lambda t=text: llm.detokenize(llm.tokenize(t.encode(), add_bos=False,
                                                                                     special=True)).decode("utf-8", "replace"))
    rec.case(f"{tag}/detokenize/special", lambda: llm.detokenize([llm.token_bos(), llm.token_eos()], special=True)
             .decode("utf-8", "replace"))
    rec.case(f"{tag}/vocab", lambda: [llm.n_vocab(), llm.token_bos(), llm.token_eos(), llm.n_ctx(), llm.n_embd()])


#: the sampler settings run on Gemma 3 270M too (every one runs on the tiny models)
REAL_MODEL_SAMPLERS = ("default", "top_k-5", "min_p-0.2", "mirostat-2", "repeat-1.1", "penalties-all", "logit_bias")


def completions(rec: Recorder, llm: Llama, tag: str, n: int = 24, samplers: tuple[str, ...] | None = None) -> None:
    for i, prompt in enumerate(PROMPTS):
        rec.case(f"{tag}/greedy/{i}", lambda p=prompt: llm.create_completion(p, max_tokens=n, temperature=0.0))
    rec.case(f"{tag}/greedy/repeat-1.3", lambda: llm.create_completion(PROMPTS[0], max_tokens=n, temperature=0.0,
                                                                        repeat_penalty=1.3))
    rec.case(f"{tag}/greedy/stop", lambda: llm.create_completion(PROMPTS[1], max_tokens=n, temperature=0.0,
                                                                 stop=["e"]))
    rec.case(f"{tag}/greedy/echo", lambda: llm.create_completion(PROMPTS[2], max_tokens=8, temperature=0.0,
                                                                 echo=True))
    rec.case(f"{tag}/greedy/max_tokens-0", lambda: llm.create_completion(PROMPTS[0], max_tokens=0, temperature=0.0)
             ["usage"])
    rec.case(f"{tag}/stream", lambda: [c["choices"][0]["text"] for c in llm.create_completion(
        PROMPTS[0], max_tokens=n, temperature=0.7, seed=11, stream=True)])
    for name, kw in SAMPLERS.items():
        if samplers is not None and name not in samplers:
            continue
        for seed in (7, 123456):
            rec.case(f"{tag}/sampled/{name}/seed={seed}",
                     lambda kw=kw, s=seed: llm.create_completion(PROMPTS[0], max_tokens=n, seed=s, **kw))
    rec.case(f"{tag}/logprobs/greedy", lambda: llm.create_completion(PROMPTS[1], max_tokens=8, temperature=0.0,
                                                                     logprobs=3))
    rec.case(f"{tag}/logprobs/echo", lambda: llm.create_completion(PROMPTS[1], max_tokens=4, temperature=0.0,
                                                                   logprobs=2, echo=True))
    rec.case(f"{tag}/grammar/gbnf", lambda: llm.create_completion(
        PROMPTS[0], max_tokens=n, seed=5, grammar=LlamaGrammar.from_string(GBNF, verbose=False)))
    rec.case(f"{tag}/grammar/number-greedy", lambda: llm.create_completion(
        PROMPTS[2], max_tokens=12, temperature=0.0, grammar=LlamaGrammar.from_string(NUMBER_GBNF, verbose=False)))
    rec.case(f"{tag}/grammar/json-schema", lambda: llm.create_completion(
        PROMPTS[1], max_tokens=40, seed=9,
        grammar=LlamaGrammar.from_json_schema(json.dumps(SCHEMA), verbose=False)))
    # the object's seed: an explicit seed, then calls without one advance it as upstream does
    def seed_sequence() -> list[str]:
        llm.set_seed(42)
        return [llm.create_completion(PROMPTS[0], max_tokens=8)["choices"][0]["text"] for _ in range(3)]
    rec.case(f"{tag}/seed-sequence", seed_sequence)
    rec.case(f"{tag}/seed-minus-one", lambda: sorted(llm.create_completion(PROMPTS[0], max_tokens=4, seed=-1)
                                                     ["choices"][0].keys()))
    rec.case(f"{tag}/generate", lambda: _take(llm.generate(llm.tokenize(PROMPTS[0].encode()), temp=0.0,
                                                           repeat_penalty=1.2), 12))


def _take(it: Any, n: int) -> list[int]:
    out = []
    for tok in it:
        out.append(int(tok))
        if len(out) == n:
            break
    return out


def chats(rec: Recorder, path: str, tag: str, formats: tuple[str, ...] = CHAT_FORMATS) -> None:
    for fmt in formats:
        def run(fmt: str = fmt) -> Any:
            llm = Llama(model_path=path, n_ctx=1024, chat_format=fmt, verbose=False, seed=3)
            try:
                return [llm.create_chat_completion(MESSAGES, max_tokens=12, temperature=0.0),
                        llm.create_chat_completion(MESSAGES, max_tokens=12, seed=77, repeat_penalty=1.1)]
            finally:
                llm.close()
        rec.case(f"{tag}/chat-format/{fmt}", run)
    llm = Llama(model_path=path, n_ctx=512, verbose=False)
    try:
        rec.case(f"{tag}/chat/template", lambda: llm.create_chat_completion(MESSAGES, max_tokens=12, temperature=0.0))
        rec.case(f"{tag}/chat/stream", lambda: [c["choices"][0]["delta"] for c in llm.create_chat_completion(
            MESSAGES, max_tokens=12, temperature=0.0, stream=True)])
        rec.case(f"{tag}/chat/json_object", lambda: llm.create_chat_completion(
            MESSAGES, max_tokens=24, seed=4, response_format={"type": "json_object"}))
        rec.case(f"{tag}/chat/json_schema", lambda: llm.create_chat_completion(
            MESSAGES, max_tokens=32, seed=4, response_format={"type": "json_object", "schema": SCHEMA}))
        rec.case(f"{tag}/chat/logprobs", lambda: llm.create_chat_completion(
            MESSAGES, max_tokens=6, temperature=0.0, logprobs=True, top_logprobs=2))
    finally:
        llm.close()


def logprobs(rec: Recorder, path: str, tag: str) -> None:
    """logprobs on a Llama(logits_all=True), which upstream needs for them."""
    llm = Llama(model_path=path, n_ctx=512, logits_all=True, verbose=False)
    try:
        rec.case(f"{tag}/logits_all/logprobs/greedy", lambda: llm.create_completion(
            PROMPTS[1], max_tokens=8, temperature=0.0, logprobs=3))
        rec.case(f"{tag}/logits_all/logprobs/echo", lambda: llm.create_completion(
            PROMPTS[1], max_tokens=4, temperature=0.0, logprobs=2, echo=True))
        rec.case(f"{tag}/logits_all/logprobs/sampled", lambda: llm.create_completion(
            PROMPTS[0], max_tokens=8, seed=5, logprobs=1))
        rec.case(f"{tag}/logits_all/chat-logprobs", lambda: llm.create_chat_completion(
            MESSAGES, max_tokens=6, temperature=0.0, logprobs=True, top_logprobs=2))
    finally:
        llm.close()


def state(rec: Recorder, llm: Llama, tag: str) -> None:
    def roundtrip() -> Any:
        llm.reset()
        llm.eval(llm.tokenize(PROMPTS[0].encode()))
        st = llm.save_state()
        first = [llm.sample(temp=0.0)]
        llm.eval(llm.tokenize(b" jumps", add_bos=False))
        llm.load_state(st)
        again = [llm.sample(temp=0.0)]
        return {"n_tokens": st.n_tokens, "first": first, "again": again, "after_load": llm.n_tokens,
                "input_ids": llm.input_ids[:llm.n_tokens].tolist()}
    rec.case(f"{tag}/state", roundtrip)

    def completion_after_load() -> Any:
        llm.create_completion(PROMPTS[1], max_tokens=4, temperature=0.0)
        st = llm.save_state()
        a = llm.create_completion(PROMPTS[1], max_tokens=8, seed=31)
        llm.load_state(st)
        b = llm.create_completion(PROMPTS[1], max_tokens=8, seed=31)
        return [a["choices"][0]["text"], b["choices"][0]["text"]]
    rec.case(f"{tag}/state-completion", completion_after_load)


def embeddings(rec: Recorder, path: str) -> None:
    llm = Llama(model_path=path, embedding=True, n_ctx=128, verbose=False)
    try:
        rec.case("embed/create_embedding", lambda: llm.create_embedding(["hello world", "a b c"]))
        rec.case("embed/embed", lambda: llm.embed("hello world"))
        rec.case("embed/embed-unnormalized", lambda: llm.embed(["hello", "world"], normalize=False))
    finally:
        llm.close()


def main(argv: list[str]) -> int:
    models = json.loads(open(argv[0]).read())
    rec = Recorder()
    rec.results["package"] = {"version": llama_cpp.__version__}
    for tag in ("spm", "bpe"):
        llm = Llama(model_path=models[tag], n_ctx=512, verbose=False, logits_all=False)
        try:
            tokens(rec, llm, tag)
            completions(rec, llm, tag)
            state(rec, llm, tag)
        finally:
            llm.close()
        logprobs(rec, models[tag], tag)
    chats(rec, models["spm"], "spm")
    embeddings(rec, models["embed"])
    if models.get("gemma"):
        llm = Llama(model_path=models["gemma"], n_ctx=1024, verbose=False)
        try:
            tokens(rec, llm, "gemma")
            completions(rec, llm, "gemma", n=16, samplers=REAL_MODEL_SAMPLERS)
        finally:
            llm.close()
        chats(rec, models["gemma"], "gemma", formats=("gemma", "chatml"))
    with open(argv[1], "w") as f:
        json.dump(rec.results, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
