"""What an engine has done since it started, as llama-server counts it for ``/metrics``."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Counters:
    """Running totals of one engine (written by its thread, read by the metrics scrape)."""

    prompt_tokens: int = 0  # prompt tokens evaluated (those reused from the cache excluded)
    prompt_cached: int = 0  # prompt tokens reused from the cache
    prompt_seconds: float = 0.0
    predicted_tokens: int = 0
    predicted_seconds: float = 0.0
    n_tokens_max: int = 0  # the longest sequence seen (prompt + generated)
    requests: int = 0  # requests finished

    def add(self, n_prompt: int, n_cached: int, prompt_s: float, n_gen: int, gen_s: float) -> None:
        self.prompt_tokens += n_prompt - n_cached
        self.prompt_cached += n_cached
        self.prompt_seconds += prompt_s
        self.predicted_tokens += n_gen
        self.predicted_seconds += gen_s
        self.n_tokens_max = max(self.n_tokens_max, n_prompt + n_gen)
        self.requests += 1


__all__ = ["Counters"]
