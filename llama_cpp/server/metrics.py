"""The server's counters in Prometheus' text format (``/metrics``), and the per-request access log.

Per model (label ``model``), llama-server's metric names: ``llamacpp:prompt_tokens_total``,
``prompt_tokens_cached_total``, ``prompt_seconds_total``, ``tokens_predicted_total``,
``tokens_predicted_seconds_total``, ``n_decode_total``, ``n_tokens_max``, the speculative
``spec_decode_num_draft_tokens_total`` / ``…accepted_tokens_total`` / ``…drafts_total`` (counters),
and ``prompt_tokens_seconds``, ``predicted_tokens_seconds``, ``requests_processing``,
``requests_deferred``, ``kv_cache_tokens``, ``kv_cache_usage_ratio`` (gauges; the last two as
older llama-server versions named them), and the shared prompt cache's ``prompt_cache_bytes``,
``…_limit_bytes``, ``…_states``, ``…_tokens`` (gauges), ``…_restored_total``,
``…_restored_tokens_total``, ``…_evicted_total`` (counters; llama-server logs these) and
``…_skipped_total`` (states not saved because copying them costs more than evaluating them again). A model served
one request at a time counts its context's decodes and the prompt tokens ``Llama`` kept from its last
prompt; one that speculates there has no ``n_decode_total`` (its decoder's verify batches are not
counted) and counts what its decoder reuses as evaluated. Per API key (label ``key``: a hash of the key, never the
key): ``llamacpp:key_requests_total`` (with ``status``), ``llamacpp:key_prompt_tokens_total`` and
``llamacpp:key_tokens_predicted_total``.
"""

from __future__ import annotations

import hashlib
import threading
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

PREFIX = "llamacpp:"


def key_label(key: str | None) -> str:
    """A request's key as a metrics and log label: a short hash (the key itself is never shown)."""
    if not key:
        return "anonymous"
    return "key-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]


class KeyCounters:
    """Requests and tokens per key label (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str], int] = defaultdict(int)
        self.prompt_tokens: dict[str, int] = defaultdict(int)
        self.predicted_tokens: dict[str, int] = defaultdict(int)

    def request(self, label: str, status: int) -> None:
        with self._lock:
            self.requests[(label, str(status))] += 1

    def tokens(self, label: str, usage: dict[str, Any] | None) -> None:
        if not usage:
            return
        with self._lock:
            self.prompt_tokens[label] += int(usage.get("prompt_tokens", 0) or 0)
            self.predicted_tokens[label] += int(usage.get("completion_tokens", 0) or 0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


class _Family:
    def __init__(self, name: str, kind: str, help_: str) -> None:
        self.name, self.kind, self.help = PREFIX + name, kind, help_
        self.samples: list[tuple[dict[str, str], float]] = []

    def add(self, labels: dict[str, str], value: float) -> None:
        self.samples.append((labels, float(value)))

    def render(self) -> str:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        lines += [f"{self.name}{_labels(lab)} {val!r}" for lab, val in self.samples]
        return "\n".join(lines)


_MODEL_METRICS = [
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "counter", "Total time spent processing prompts"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "counter", "Total time spent generating tokens"),
    ("n_decode_total", "counter", "Total number of llama_decode() calls"),
    ("n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total", "counter", "Speculative: Total draft tokens accepted by the target "
     "model"),
    ("spec_decode_num_drafts_total", "counter", "Speculative: Total speculative decoding verification steps"),
    ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s"),
    ("requests_processing", "gauge", "Number of requests processing"),
    ("requests_deferred", "gauge", "Number of requests deferred"),
    ("kv_cache_tokens", "gauge", "KV cache tokens in use (running requests and prompts kept for reuse)"),
    ("kv_cache_usage_ratio", "gauge", "KV cache usage (1 = full)"),
    ("prompt_cache_bytes", "gauge", "Host memory held by the prompt cache the slots share"),
    ("prompt_cache_limit_bytes", "gauge", "The prompt cache's limit (cache_ram; -1: none)"),
    ("prompt_cache_states", "gauge", "Prompt states held by the prompt cache"),
    ("prompt_cache_tokens", "gauge", "Tokens of the prompt states held by the prompt cache"),
    ("prompt_cache_restored_total", "counter", "Prompt states restored from the prompt cache into a slot"),
    ("prompt_cache_restored_tokens_total", "counter", "Prompt tokens reused from states restored from the "
     "prompt cache"),
    ("prompt_cache_evicted_total", "counter", "Prompt states evicted from the prompt cache to stay within its "
     "limit"),
    ("prompt_cache_skipped_total", "counter", "Prompt states not saved because copying them off "
     "the device and back costs more than evaluating their tokens again (e.g. over RPC)"),
]


def model_values(engine: Any) -> dict[str, float]:
    """One engine's values for :data:`_MODEL_METRICS` (what it cannot tell is left out)."""
    c = engine.counters
    st = engine.stats()
    out = {"prompt_tokens_total": c.prompt_tokens, "prompt_tokens_cached_total": c.prompt_cached,
           "prompt_seconds_total": c.prompt_seconds, "tokens_predicted_total": c.predicted_tokens,
           "tokens_predicted_seconds_total": c.predicted_seconds, "n_tokens_max": c.n_tokens_max,
           "prompt_tokens_seconds": c.prompt_tokens / c.prompt_seconds if c.prompt_seconds else 0.0,
           "predicted_tokens_seconds": c.predicted_tokens / c.predicted_seconds if c.predicted_seconds else 0.0,
           "requests_processing": st["active"], "requests_deferred": st["waiting"]}
    n_decode = engine.n_decode
    if n_decode is not None:  # a speculative decoder's own verify batches are not counted: left out then
        out["n_decode_total"] = n_decode
    used = engine.kv_tokens()
    out["kv_cache_tokens"] = used
    out["kv_cache_usage_ratio"] = used / max(engine.n_slots * engine.n_ctx_slot, 1)
    pc = getattr(engine, "prompt_cache", None)
    if pc is not None:
        out["prompt_cache_bytes"] = pc.size
        out["prompt_cache_limit_bytes"] = -1 if pc.limit is None else pc.limit
        out["prompt_cache_states"] = len(pc)
        out["prompt_cache_tokens"] = pc.n_tokens
        out["prompt_cache_restored_total"] = pc.restored
        out["prompt_cache_restored_tokens_total"] = pc.restored_tokens
        out["prompt_cache_evicted_total"] = pc.evicted
        out["prompt_cache_skipped_total"] = pc.skipped
    spec = st.get("speculative")
    if spec is not None:
        out["spec_decode_num_draft_tokens_total"] = spec["drafted"]
        out["spec_decode_num_accepted_tokens_total"] = spec["accepted"]
        out["spec_decode_num_drafts_total"] = spec["steps"]
    return out


def render(models: Iterable[tuple[str, Any]], keys: KeyCounters) -> str:
    """The text exposition of every loaded model's engine (``(alias, engine)``) and the key counters."""
    families = {name: _Family(name, kind, help_) for name, kind, help_ in _MODEL_METRICS}
    for alias, engine in models:
        for name, value in model_values(engine).items():
            families[name].add({"model": alias}, value)
    key_req = _Family("key_requests_total", "counter", "HTTP requests per API key (a hash of it) and status")
    key_prompt = _Family("key_prompt_tokens_total", "counter", "Prompt tokens per API key (a hash of it)")
    key_pred = _Family("key_tokens_predicted_total", "counter", "Generated tokens per API key (a hash of it)")
    with keys._lock:
        for (label, status), n in sorted(keys.requests.items()):
            key_req.add({"key": label, "status": status}, n)
        for label, n in sorted(keys.prompt_tokens.items()):
            key_prompt.add({"key": label}, n)
        for label, n in sorted(keys.predicted_tokens.items()):
            key_pred.add({"key": label}, n)
    out = [f.render() for f in (*families.values(), key_req, key_prompt, key_pred) if f.samples]
    return "\n".join(out) + "\n"


__all__ = ["KeyCounters", "PREFIX", "key_label", "model_values", "render"]
