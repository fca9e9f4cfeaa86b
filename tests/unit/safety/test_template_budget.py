"""Hostile chat templates stop with TemplateError naming the budget, fast, without MemoryError."""

from __future__ import annotations

import time

import pytest

from llama_cpp._errors import TemplateError
from llama_cpp._safety.template_budget import RenderLimits
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("template", "budget"), [
    ("{{ 'A' * 2000000000 }}", "string budget"),
    ("{{ 'A' * 2e9 }}", "failed to render"),
    ("{% set s = 'A' * 10000000 %}{{ s + s + s }}", "string budget"),
    ("{{ [1] * 2000000000 }}", "string budget"),
    ("{{ 10 ** 1000000000 }}", "bit numbers"),
    ("{{ 'x' | center(2000000000) }}", "string budget"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "loop budget"),
    ("{% set s = 'A' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}", "loop budget"),
])
def test_hostile_template_raises_template_error(template: str, budget: str) -> None:
    start = time.monotonic()
    with pytest.raises(TemplateError, match=budget):
        Jinja2ChatFormatter(template)(messages=MESSAGES)
    assert time.monotonic() - start < 1.5


def test_output_budget() -> None:
    fmt = Jinja2ChatFormatter("{% for i in range(100) %}{{ 'A' * 1000 }}{% endfor %}",
                              limits=RenderLimits(output_chars=50_000))
    with pytest.raises(TemplateError, match="output exceeded"):
        fmt(messages=MESSAGES)


def test_loops_with_loop_variable_still_work() -> None:
    fmt = Jinja2ChatFormatter("{% for m in messages %}{{ loop.index }}:{{ m.content }}"
                              "{% if not loop.last %},{% endif %}{% endfor %}")
    assert fmt(messages=MESSAGES * 3).prompt == "1:hi,2:hi,3:hi"
