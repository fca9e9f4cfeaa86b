"""Compare the results of :mod:`.calls` under upstream 0.3.36 and under this package.

Everything must be equal, floats within ``FLOAT_TOLERANCE`` (both packages run the same llama.cpp
kernels; the tolerance only absorbs float32/float64 rounding in the Python that turns logits into
logprobs), except the cases :data:`KNOWN` lists: each names its reason, and docs/compatibility.md
lists the same ones (tests/unit/build_tools/test_differential.py holds the two together).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

FLOAT_TOLERANCE = 1e-4

#: case pattern (``*``: one path segment) -> why the results differ (the same reasons docs/compatibility.md gives)
KNOWN: dict[str, str] = {
    "package": "the package's own version",
    "*/logprobs/greedy": "upstream refuses logprobs unless Llama(logits_all=True); here any context gives them "
                         "(the logits_all cases are compared)",
    "*/logprobs/echo": "upstream refuses logprobs unless Llama(logits_all=True) (see */logprobs/greedy)",
    "*/chat/logprobs": "upstream refuses logprobs unless Llama(logits_all=True) (see */logprobs/greedy)",
    "*/grammar/json-schema": "json_schema_to_gbnf is llama.cpp's converter here, upstream's older Python port "
                             "there: other whitespace rules and integer bounds, so another grammar",
    "*/chat/json_schema": "the schema's grammar comes from llama.cpp's converter (see */grammar/json-schema)",
    "*/logits_all/logprobs/echo": "echoed prompt logprobs: upstream's text_offset counts the first SentencePiece "
                                  "token's leading space that its text drops, and without a BOS its prompt rows are "
                                  "one position off and the last token is missing; here offsets index the text and "
                                  "each token is scored by the row before it",
    "*/state": "after load_state, sample() reads the restored position's logits; upstream reads the logits the "
               "last evaluation before the load left (its next token is not the saved state's)",
}
#: the same for the downstream libraries' recorded outputs (nox -s downstream)
DOWNSTREAM_KNOWN: dict[str, str] = {}


@dataclass
class Report:
    equal: list[str] = field(default_factory=list)
    known: dict[str, str] = field(default_factory=dict)  # case -> reason
    different: dict[str, str] = field(default_factory=dict)  # case -> first difference
    missing: list[str] = field(default_factory=list)
    unused_known: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.different and not self.missing

    def lines(self) -> list[str]:
        """One line per known difference, unexplained difference and missing case."""
        return ([f"known    {case}  -- {why}" for case, why in sorted(self.known.items())]
                + [f"DIFFERS  {case}  -- {diff}" for case, diff in sorted(self.different.items())]
                + [f"MISSING  {case} (on one side only)" for case in self.missing])

    def summary(self) -> str:
        return (f"{len(self.equal)} equal, {len(self.known)} known differences, {len(self.different)} unexplained "
                f"differences, {len(self.missing)} missing")


def _same_error(a: Any, b: Any) -> bool:
    """Both calls failed, here with upstream's exception class or a subclass (messages differ by design)."""
    return (isinstance(a, dict) and isinstance(b, dict) and "error" in a and "error" in b
            and a["error"] in b.get("classes", [b["error"]]))


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where ``a`` (upstream) and ``b`` (here) first differ, or None."""
    if _same_error(a, b):
        return None
    if isinstance(a, bool) or isinstance(b, bool):
        return None if a == b else f"{path or '.'}: {a!r} != {b!r}"
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, int) and isinstance(b, int):
            return None if a == b else f"{path or '.'}: {a!r} != {b!r}"
        fa, fb = float(a), float(b)
        if math.isnan(fa) and math.isnan(fb) or fa == fb:
            return None
        if math.isfinite(fa) and math.isfinite(fb) and abs(fa - fb) <= FLOAT_TOLERANCE * max(1.0, abs(fa)):
            return None
        return f"{path or '.'}: {a!r} != {b!r}"
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                return f"{path}.{k}: only {'upstream' if k in a else 'here'} has it"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None if len(a) == len(b) else f"{path}: {len(a)} items upstream, {len(b)} here"
    return None if a == b else f"{path or '.'}: {_short(a)} != {_short(b)}"


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 160 else r[:157] + "..."


def _matches(case: str, pattern: str) -> bool:
    """``*`` stands for one path segment (``*/state`` is ``spm/state``, not ``spm/x/state``)."""
    return re.fullmatch(re.escape(pattern).replace(r"\*", "[^/]*"), case) is not None


def known_reason(case: str, known: dict[str, str] = KNOWN) -> str | None:
    for pattern, why in known.items():
        if _matches(case, pattern):
            return why
    return None


def compare(upstream: dict[str, Any], here: dict[str, Any], known: dict[str, str] = KNOWN) -> Report:
    report = Report()
    used: set[str] = set()
    for case in sorted(set(upstream) | set(here)):
        if case not in upstream or case not in here:
            report.missing.append(case)
            continue
        diff = first_difference(upstream[case], here[case])
        if diff is None:
            report.equal.append(case)
            continue
        why = known_reason(case, known)
        if why is None:
            report.different[case] = diff
        else:
            report.known[case] = f"{why} ({diff})"
            used.update(p for p in known if _matches(case, p))
    report.unused_known = sorted(set(known) - used)
    return report
