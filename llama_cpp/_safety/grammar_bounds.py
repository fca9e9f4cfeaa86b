"""Check GBNF repetition bounds ``{m}``, ``{m,}``, ``{m,n}`` before llama.cpp's parser expands them.

llama.cpp copies a repeated element ``n`` times (nested repetitions multiply), so one hostile
``{0,1000000000}`` exhausts memory inside the native parser. This scanner skips literals, character
classes and comments, multiplies bounds through nested groups, and raises GrammarError naming the
rule and the fix. Nesting depth and the number of rules are bounded too: llama.cpp's parser
recurses once per ``(`` and its stack walk once per rule reference, with no limit of its own, so a
400 KB grammar of nested parentheses would overflow the C stack.
"""

from __future__ import annotations

import re

from .._errors import GrammarError

MAX_REPETITION_EXPANSION = 100_000
MAX_NESTING = 256  # parenthesised groups inside each other
MAX_RULES = 8192   # JSON-schema grammars have tens to hundreds

_BOUND = re.compile(r"\{\s*(\d+)\s*(?:(,)\s*(\d*)\s*)?\}")
_RULE = re.compile(r"([A-Za-z0-9_-]+)\s*::=")
_NAME = re.compile(r"[A-Za-z0-9_-]+")


def _skip_quoted(text: str, i: int, close: str) -> int:
    i += 1
    while i < len(text) and text[i] != close:
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _repeat(text: str, i: int, rule: str) -> tuple[int, int]:
    """The expansion factor of a bound at ``text[i]`` (1 if none) and the index after it."""
    match = _BOUND.match(text, i)
    if match is None:
        return 1, i
    lo = int(match.group(1))
    hi = lo if match.group(2) is None else (int(match.group(3)) if match.group(3) else None)
    if hi is not None and hi < lo:
        raise GrammarError(f"rule {rule!r}: repetition {match.group(0)} has max {hi} < min {lo}; "
                           "write {m,n} with m <= n")
    factor = max(lo, hi or 0, 1)
    if factor > MAX_REPETITION_EXPANSION:
        raise GrammarError(f"rule {rule!r}: repetition {match.group(0)} expands to {factor} copies; "
                           f"the limit is {MAX_REPETITION_EXPANSION} (use * or + for unbounded repeats)")
    return factor, match.end()


def check_repetitions(grammar: str) -> None:
    """Raise GrammarError if a bound is inverted or the grammar's repetitions expand past the limit."""
    rule = "?"
    stack = [0]
    rules = 0
    i, n = 0, len(grammar)
    while i < n:
        c = grammar[i]
        rule_match = _RULE.match(grammar, i) if (i == 0 or grammar[i - 1] in "\n\r") else None
        if rule_match:
            rule, i = rule_match.group(1), rule_match.end()
            rules += 1
            if rules > MAX_RULES:
                raise GrammarError(f"the grammar defines more than {MAX_RULES} rules; merge rules or split the task")
            continue
        if c == "#":
            end = grammar.find("\n", i)
            i = n if end < 0 else end
            continue
        if c == "(":
            stack.append(0)
            if len(stack) - 1 > MAX_NESTING:
                raise GrammarError(f"rule {rule!r}: groups nest more than {MAX_NESTING} deep; flatten the "
                                   "grammar with named rules")
            i += 1
            continue
        if c.isspace() or c in "|*+?":
            i += 1
            continue
        if c == ")":
            cost = max(stack.pop(), 1) if len(stack) > 1 else 1
            i += 1
        elif c in "\"'":
            cost, i = 1, _skip_quoted(grammar, i, c)
        elif c == "[":
            cost, i = 1, _skip_quoted(grammar, i, "]")
        else:
            name = _NAME.match(grammar, i)
            cost, i = 1, (name.end() if name else i + 1)
        factor, i = _repeat(grammar, i, rule)
        stack[-1] += cost * factor
        if stack[-1] > MAX_REPETITION_EXPANSION:
            raise GrammarError(f"rule {rule!r}: nested or repeated bounds expand past "
                               f"{MAX_REPETITION_EXPANSION} elements; lower the {{m,n}} bounds")
