"""Type checks at the public entry points: a wrong type is named at the boundary, not found
deep inside as ``'<=' not supported between 'str' and 'int'``.

:class:`ArgumentTypeError` is both a :class:`~llama_cpp._errors.ParameterError` (a
``ValueError``: the server answers 400) and a ``TypeError`` (what Python raises for a wrong type).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .._errors import ParameterError


class ArgumentTypeError(ParameterError, TypeError):
    """An argument of the wrong type (the message names it and what it accepts)."""


#: argument name -> kind, for the generation entry points
KINDS: dict[str, str] = {
    "max_tokens": "int?", "seed": "int?", "logprobs": "int?", "penalty_last_n": "int?", "top_logprobs": "int?",
    "top_k": "int", "mirostat_mode": "int",
    "temperature": "num", "top_p": "num", "min_p": "num", "typical_p": "num", "frequency_penalty": "num",
    "presence_penalty": "num", "repeat_penalty": "num", "tfs_z": "num", "mirostat_tau": "num", "mirostat_eta": "num",
    "echo": "bool", "stream": "bool", "special_in_content": "bool",
    "stop": "stop", "logit_bias": "bias", "suffix": "str?", "model": "str?",
}

_WHAT = {"int?": "an integer or None", "int": "an integer", "num": "a finite number", "bool": "a bool",
         "stop": "a string, a list of strings or None", "bias": "a dict of token id -> bias, or None",
         "str?": "a string or None", "bool?": "a bool or None"}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) or (hasattr(v, "__index__") and not isinstance(v, bool | float))


def _ok(kind: str, v: Any) -> bool:
    if kind.endswith("?") and v is None:
        return True
    base = kind.rstrip("?")
    if base == "int":
        return _is_int(v)
    if base == "num":
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v)) or _is_int(v)
    if base == "bool":
        return isinstance(v, bool) or (_is_int(v) and int(v) in (0, 1))
    if base == "str":
        return isinstance(v, str)
    if base == "stop":
        return v is None or isinstance(v, str) or (isinstance(v, list | tuple) and all(isinstance(s, str) for s in v))
    if base == "bias":
        return v is None or isinstance(v, Mapping)  # keys and values: _generation.sampling checks them
    raise AssertionError(kind)


def check(values: Mapping[str, Any], kinds: Mapping[str, str] | None = None) -> None:
    """Raise ArgumentTypeError for the first of ``values`` (named as in :data:`KINDS`, or ``kinds``)
    whose type is wrong; names without a kind are not checked."""
    table = {**KINDS, **(kinds or {})}
    for name, value in values.items():
        kind = table.get(name)
        if kind is not None and not _ok(kind, value):
            shown = repr(value)
            raise ArgumentTypeError(f"{name} must be {_WHAT[kind]}, got {shown[:60]} ({type(value).__name__})")
