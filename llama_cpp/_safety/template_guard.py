"""Round two of the chat-template budget: every string-producing operation, and wall time on
every call, not only in ``{% for %}`` loops.

:class:`GuardedSandbox` extends :class:`llama_cpp._safety.template_budget.BudgetedSandbox`:

* ``~`` (compiled to a join) is rewritten at parse time into a budgeted concatenation;
* ``%`` formatting, ``str.format``/``format_map``, the ``format``, ``join``, ``replace`` and
  ``tojson`` filters, ``lipsum`` and the string methods ``ljust``/``rjust``/``center``/``zfill``/
  ``expandtabs``/``replace``/``join`` are sized *before* they run (widths and precisions count);
* every call, attribute lookup and operator checks the render's wall-clock deadline;
* the source is limited to :data:`MAX_TEMPLATE_CHARS` and its block and bracket nesting to
  :data:`MAX_NESTING` (Jinja's parser recurses per level: 300 nested ``{% if %}`` were a
  ``RecursionError``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

from jinja2 import nodes
from jinja2.runtime import markup_join
from jinja2.utils import generate_lorem_ipsum
from jinja2.visitor import NodeTransformer

from .._errors import TemplateError
from .template_budget import DEFAULT_LIMITS, BudgetedSandbox, Spend, check_length, current_spend

#: a chat template's source length (real ones are a few KB; the largest known about 60 KB)
MAX_TEMPLATE_CHARS = 1 << 20
#: nested blocks ({% if %}, {% for %}, ...) or brackets inside one expression
MAX_NESTING = 64

_OPEN_BLOCK = re.compile(r"\{%-?\+?\s*(if|for|macro|call|filter|with|block|generation|raw)\b")
_SET_BLOCK = re.compile(r"\{%-?\+?\s*set\s+[^=%]*?-?%\}")
_END_BLOCK = re.compile(r"\{%-?\+?\s*end\w+")
_TAG = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.S)
_NUMBER = re.compile(r"\d+")
_PCT_STAR = re.compile(r"%[-#0 +]*\*")
_NESTED_FIELD = re.compile(r"\{[^{}]*\{")


def _deadline() -> None:
    spend = current_spend.get()
    if spend is not None and time.monotonic() > spend.deadline:
        raise TemplateError(f"the chat template exceeded its time budget ({spend.limits.seconds} s per render)")


def _text_len(value: Any) -> int:
    return len(value) if isinstance(value, str) else len(str(value))


def check_nesting(source: str) -> None:
    """Refuse a source over :data:`MAX_TEMPLATE_CHARS` or nesting deeper than :data:`MAX_NESTING`."""
    if len(source) > MAX_TEMPLATE_CHARS:
        raise TemplateError(f"the chat template is {len(source)} characters; the limit is {MAX_TEMPLATE_CHARS}")
    depth = 0
    for m in re.finditer(r"\{%.*?%\}", source, re.S):
        tag = m.group(0)
        if _END_BLOCK.match(tag):
            depth -= 1
        elif _OPEN_BLOCK.match(tag) or _SET_BLOCK.fullmatch(tag):
            depth += 1
            if depth > MAX_NESTING:
                raise TemplateError(f"the chat template nests blocks more than {MAX_NESTING} deep; flatten it")
    for m in _TAG.finditer(source):
        level = 0
        for c in m.group(0):
            if c in "([{":
                level += 1
                if level > MAX_NESTING + 2:  # the tag's own braces count
                    raise TemplateError(f"the chat template nests brackets more than {MAX_NESTING} deep")
            elif c in ")]}":
                level -= 1


def _format_estimate(fmt: str, values: Iterable[Any]) -> int:
    """An upper bound on the length of ``fmt`` formatted with ``values`` (%-style or {}-style):
    every number in ``fmt`` may be a width, and with ``*`` or nested fields so may every int value."""
    values = list(values)
    total = len(fmt) + sum(_text_len(v) for v in values) + sum(int(n) for n in _NUMBER.findall(fmt))
    if _PCT_STAR.search(fmt) or _NESTED_FIELD.search(fmt):
        total += sum(abs(v) for v in values if isinstance(v, int))
    return total


def _format_values(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    values = list(args) + list(kwargs.values())
    out: list[Any] = []
    for v in values:
        out += list(v.values()) if isinstance(v, dict) else list(v) if isinstance(v, tuple) else [v]
    return out


def _size_str_method(name: str, s: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any] | None:
    """Check the result size of ``s.<name>(*args)`` before it runs; returns a materialized
    iterable for ``join`` (so a generator is consumed once)."""
    if name in ("ljust", "rjust", "center", "zfill") and args and isinstance(args[0], int):
        check_length(args[0], f"a str.{name} result")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            check_length(len(s) + s.count("\t") * max(size, 0), "a str.expandtabs result")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        n = (len(s) + 1) if not args[0] else s.count(args[0])
        check_length(len(s) + n * max(len(args[1]) - len(args[0]), 0), "a str.replace result")
    elif name == "join" and args:
        items = list(args[0])
        check_length(sum(_text_len(i) for i in items) + len(s) * max(len(items) - 1, 0), "a joined string")
        return items
    return None


class _GuardHook:
    """Reached from compiled templates as ``environment.budget``."""

    @staticmethod
    def iterate(iterable: Iterable[Any]) -> Iterator[Any]:
        spend = current_spend.get() or Spend(DEFAULT_LIMITS)
        for item in iterable:
            spend.iteration()
            yield item

    @staticmethod
    def concat(*parts: Any) -> Any:
        _deadline()
        check_length(sum(_text_len(p) for p in parts), "a ~ concatenation")
        return markup_join(parts)


class _ConcatToCall(NodeTransformer):
    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        node = self.generic_visit(node)
        return nodes.Call(nodes.Getattr(nodes.EnvironmentAttribute("budget"), "concat", "load"),
                          list(node.nodes), [], None, None, lineno=node.lineno)


def _checked_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
    check_length(int(n) * int(max) * 16, "lipsum text")
    return generate_lorem_ipsum(n=n, html=html, min=min, max=max)


def _checked_join(env: Any) -> Any:
    base = env.filters["join"]

    def join(eval_ctx: Any, value: Any, d: str = "", attribute: Any = None) -> str:
        items = list(value)
        check_length(sum(_text_len(i) for i in items) + len(str(d)) * max(len(items) - 1, 0), "a joined string")
        return base(eval_ctx, items, d, attribute)

    join.jinja_pass_arg = base.jinja_pass_arg  # type: ignore[attr-defined]
    return join


def _checked_replace(env: Any) -> Any:
    base = env.filters["replace"]

    def replace(eval_ctx: Any, s: str, old: str, new: str, count: int | None = None) -> str:
        _size_str_method("replace", str(s), (str(old), str(new)), {})
        return base(eval_ctx, s, old, new, count)

    replace.jinja_pass_arg = base.jinja_pass_arg  # type: ignore[attr-defined]
    return replace


def _checked_format(env: Any) -> Any:
    base = env.filters["format"]

    def format_(value: str, *args: Any, **kwargs: Any) -> str:
        check_length(_format_estimate(str(value), _format_values(args, kwargs)), "a formatted string")
        return base(value, *args, **kwargs)

    return format_


def _checked_tojson(env: Any) -> Any:
    base = env.filters["tojson"]

    def tojson(*args: Any, **kwargs: Any) -> Any:
        indent = kwargs.get("indent")
        if isinstance(indent, int) and indent > 64 or isinstance(indent, str) and len(indent) > 64:
            raise TemplateError(f"the chat template asked tojson for an indent of {indent!r}; the limit is 64")
        return base(*args, **kwargs)

    if hasattr(base, "jinja_pass_arg"):
        tojson.jinja_pass_arg = base.jinja_pass_arg  # type: ignore[attr-defined]
    return tojson


class GuardedSandbox(BudgetedSandbox):
    """A :class:`BudgetedSandbox` whose every string-producing operation is sized first and whose
    every call checks the wall-clock deadline."""

    intercepted_binops = frozenset(["*", "+", "**", "%"])
    budget = _GuardHook()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.globals["lipsum"] = _checked_lipsum
        self.filters["join"] = _checked_join(self)
        self.filters["replace"] = _checked_replace(self)
        self.filters["format"] = _checked_format(self)
        self.finalize_filters()

    def finalize_filters(self) -> None:
        """Wrap ``tojson`` (call again after replacing it)."""
        self.filters["tojson"] = _checked_tojson(self)

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        check_nesting(source)
        try:
            tree = super()._parse(source, name, filename)
        except RecursionError as exc:
            raise TemplateError("the chat template nests too deeply to parse; flatten it") from exc
        return _ConcatToCall().visit(tree)

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().compile(*args, **kwargs)
        except RecursionError as exc:
            raise TemplateError("the chat template nests too deeply to compile; flatten it") from exc

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _deadline()
        if operator == "%" and isinstance(left, str):
            values = _format_values(right if isinstance(right, tuple) else (right,), {})
            check_length(_format_estimate(left, values), "a %-formatted string")
        return super().call_binop(context, operator, left, right)

    def getattr(self, obj: Any, attribute: str) -> Any:
        _deadline()
        return super().getattr(obj, attribute)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _deadline()
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str) and not isinstance(__obj, type):
            items = _size_str_method(getattr(__obj, "__name__", ""), owner, args, kwargs)
            if items is not None:
                args = (items, *args[1:])
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Any:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt = value.__self__

        def checked(*args: Any, **kwargs: Any) -> str:
            _deadline()
            check_length(_format_estimate(fmt, _format_values(args, kwargs)), "a str.format result")
            return wrapped(*args, **kwargs)

        return checked
