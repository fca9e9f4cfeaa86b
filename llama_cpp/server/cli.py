"""Command-line flags generated from the settings classes: ``--<field> VALUE`` for every field.

Booleans take a value (``--embedding true``), lists take several (``--tensor_split 0.5 0.5``),
dicts take a JSON object, as upstream's server does.
"""

from __future__ import annotations

import argparse
import json
import types
import typing
from typing import Any, TypeVar

from pydantic import BaseModel

_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}


def parse_bool(text: str) -> bool:
    s = str(text).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean: use true or false")


def parse_json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _kind(annotation: Any) -> tuple[str, Any]:
    """``("bool"|"list"|"dict"|"scalar", element type)`` of a field annotation."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if bool in args:
            return "bool", bool
        return _kind(args[0]) if args else ("scalar", str)
    if origin is typing.Literal:
        return "scalar", type(typing.get_args(annotation)[0])
    if origin is list:
        (elem,) = typing.get_args(annotation) or (str,)
        return "list", elem
    if origin is dict:
        return "dict", dict
    if annotation is bool:
        return "bool", bool
    return "scalar", annotation if annotation in (int, float, str) else str


def add_args_from_model(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """One ``--name`` flag per field of ``model`` (help from the field's description)."""
    for name, field in model.model_fields.items():
        help_text = field.description or ""
        if not field.is_required() and field.default not in (None, ""):
            help_text += f" (default: {field.default})"
        kind, elem = _kind(field.annotation)
        if kind == "bool":
            parser.add_argument(f"--{name}", dest=name, type=parse_bool, metavar="BOOL", help=help_text)
        elif kind == "list":
            parser.add_argument(f"--{name}", dest=name, nargs="*", type=getattr(elem, "from_arg", elem),
                                help=help_text)
        elif kind == "dict":
            parser.add_argument(f"--{name}", dest=name, type=parse_json_object, metavar="JSON", help=help_text)
        else:
            parser.add_argument(f"--{name}", dest=name, type=elem, help=help_text)


M = TypeVar("M", bound=BaseModel)


def parse_model_from_args(model: type[M], args: argparse.Namespace) -> M:
    """``model`` built from the flags that were given (the rest from the environment or defaults)."""
    return model(**{k: v for k, v in vars(args).items() if v is not None and k in model.model_fields})


__all__ = ["add_args_from_model", "parse_bool", "parse_json_object", "parse_model_from_args"]
