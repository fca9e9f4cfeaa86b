"""What an engine has done since it started, as llama-server counts it for ``/metrics``."""

from __future__ import annotations

import dataclasses
from typing import Any


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
    spec_steps: int = 0  # speculative verify steps, drafted and accepted tokens (one-at-a-time engine: per
    spec_drafted: int = 0  # request from its decoder's statistics; the slots keep theirs in their speculation)
    spec_accepted: int = 0

    def add(self, n_prompt: int, n_cached: int, prompt_s: float, n_gen: int, gen_s: float) -> None:
        self.prompt_tokens += n_prompt - n_cached
        self.prompt_cached += n_cached
        self.prompt_seconds += prompt_s
        self.predicted_tokens += n_gen
        self.predicted_seconds += gen_s
        self.n_tokens_max = max(self.n_tokens_max, n_prompt + n_gen)
        self.requests += 1

    def add_speculative(self, stats: dict[str, Any]) -> None:
        """A request's speculative statistics (``SpeculativeStats.as_dict()``)."""
        self.spec_steps += int(stats.get("steps", 0) or 0)
        self.spec_drafted += int(stats.get("drafted", 0) or 0)
        self.spec_accepted += int(stats.get("accepted", 0) or 0)


__all__ = ["Counters"]
