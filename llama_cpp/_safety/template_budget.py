"""A work and size budget for chat-template rendering: hostile templates stop with TemplateError.

Every ``{% for %}`` iterable is wrapped (at parse time) in :meth:`BudgetedSandbox.budget_iter`, which
charges one unit per iteration and checks a wall-clock deadline; ``*`` and ``+`` on strings and
lists, ``**`` on numbers, and the padding filters are refused before they build a result over the
size limit; the rendered output is counted as it is produced. The defaults are far above what real
chat templates need (a conversation renders in a few thousand iterations).
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
import time
from collections.abc import Iterable, Iterator
from typing import Any

from jinja2 import nodes
from jinja2.filters import do_center, do_indent
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .._errors import TemplateError


@dataclasses.dataclass(frozen=True)
class RenderLimits:
    """The budget of one render."""

    loop_iterations: int = 1_000_000
    string_chars: int = 16_000_000
    output_chars: int = 32_000_000
    seconds: float = 10.0


DEFAULT_LIMITS = RenderLimits()
_MAX_POW_BITS = 1 << 16


class Spend:
    """What one render has spent: loop iterations against its limits, and its deadline."""

    def __init__(self, limits: RenderLimits) -> None:
        self.limits = limits
        self.iterations = 0
        self.deadline = time.monotonic() + limits.seconds

    def iteration(self) -> None:
        self.iterations += 1
        if self.iterations > self.limits.loop_iterations:
            raise TemplateError(f"the chat template exceeded its loop budget "
                                f"({self.limits.loop_iterations} iterations per render)")
        if not self.iterations & 0x3FF and time.monotonic() > self.deadline:
            raise TemplateError(f"the chat template exceeded its time budget ({self.limits.seconds} s per render)")


#: the render in progress on this thread or task (None outside a budgeted render)
current_spend: contextvars.ContextVar[Spend | None] = contextvars.ContextVar("template_spend", default=None)


def check_length(n: int, what: str) -> None:
    """Refuse (``TemplateError``) building ``what`` of ``n`` items over the render's string limit."""
    spend = current_spend.get()
    limit = (spend.limits if spend else DEFAULT_LIMITS).string_chars
    if n > limit:
        raise TemplateError(f"the chat template tried to build {what} of {n} items; "
                            f"the string budget is {limit}")


def _sized(value: Any) -> bool:
    return isinstance(value, str | list | tuple | bytes)


def _checked_center(value: str, width: int = 80) -> str:
    check_length(int(width), "a centered string")
    return do_center(value, width)


def _checked_indent(s: str, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    if isinstance(width, int):
        check_length(width * (str(s).count("\n") + 1), "an indented string")
    else:
        check_length(len(width) * (str(s).count("\n") + 1), "an indented string")
    return do_indent(s, width, first, blank)


class _BudgetHook:
    """Reached from compiled templates as ``environment.budget``."""

    @staticmethod
    def iterate(iterable: Iterable[Any]) -> Iterator[Any]:
        spend = current_spend.get()
        if spend is None:
            spend = Spend(DEFAULT_LIMITS)
        for item in iterable:
            spend.iteration()
            yield item


class BudgetedSandbox(ImmutableSandboxedEnvironment):
    """An immutable sandbox whose renders are bounded by :class:`RenderLimits`."""

    intercepted_binops = frozenset(["*", "+", "**"])
    budget = _BudgetHook()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.filters["center"] = _checked_center
        self.filters["indent"] = _checked_indent

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Call(nodes.Getattr(nodes.EnvironmentAttribute("budget"), "iterate", "load"),
                                   [loop.iter], [], None, None, lineno=loop.lineno)
        return tree

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            seq, n = (left, right) if _sized(left) else (right, left)
            if _sized(seq) and isinstance(n, int):
                check_length(len(seq) * n, "a repeated string or list")
        elif operator == "+" and _sized(left) and _sized(right):
            check_length(len(left) + len(right), "a concatenated string or list")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
            if right * math.log2(abs(left)) > _MAX_POW_BITS:
                raise TemplateError(f"the chat template computed {left} ** {right}, "
                                    f"over the budget of {_MAX_POW_BITS}-bit numbers")
        return super().call_binop(context, operator, left, right)

    def render_bounded(self, template: Any, limits: RenderLimits, **variables: Any) -> str:
        """Render ``template`` under ``limits``; raises TemplateError naming the budget exceeded."""
        token = current_spend.set(Spend(limits))
        try:
            parts: list[str] = []
            size = 0
            for chunk in template.generate(**variables):
                size += len(chunk)
                if size > limits.output_chars:
                    raise TemplateError(f"the chat template's output exceeded its budget "
                                        f"({limits.output_chars} characters)")
                parts.append(chunk)
            return "".join(parts)
        except MemoryError as exc:
            raise TemplateError("the chat template ran out of memory; its string budget did not catch "
                                "the construct that did it") from exc
        finally:
            current_spend.reset(token)
