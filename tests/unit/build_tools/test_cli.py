"""``python -m build_tools``: every error class exits with its own code, prints its message, traces under -v."""

from __future__ import annotations

import argparse
import inspect
import logging

import pytest

from build_tools import cli, errors

CLASSES = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.BuildToolsError)]


def _failing(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    def run(_args: argparse.Namespace) -> int:
        raise exc

    parser = argparse.ArgumentParser()
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.set_defaults(func=run)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)


def test_every_error_lives_in_errors_with_an_exit_code() -> None:
    assert len(CLASSES) >= 20
    for cls in CLASSES:
        assert cls.__module__ == "build_tools.errors"
        assert cls.exit_code in (1, 2, 3), cls


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_exit_code_per_class(cls: type[errors.BuildToolsError], monkeypatch: pytest.MonkeyPatch,
                             caplog: pytest.LogCaptureFixture) -> None:
    _failing(monkeypatch, cls(f"{cls.__name__}: the message"))
    with caplog.at_level(logging.ERROR, logger="build_tools"):
        assert cli.main([]) == cls.exit_code
    assert f"{cls.__name__}: the message" in caplog.text
    assert "Traceback" not in caplog.text


def test_classes_of_exit_codes() -> None:
    assert errors.MissingInputError.exit_code == errors.ConfigError.exit_code == 2
    assert errors.ReleaseError.exit_code == errors.PublishError.exit_code == errors.HashMismatchError.exit_code == 1
    assert errors.ToolNotFoundError.exit_code == errors.NativeBuildError.exit_code == 3
    assert not issubclass(errors.MissingInputError, FileNotFoundError)


def test_traceback_under_verbose(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _failing(monkeypatch, errors.ToolNotFoundError("cmake is not installed"))
    with caplog.at_level(logging.ERROR, logger="build_tools"):
        assert cli.main(["-v"]) == 3
    assert "cmake is not installed" in caplog.text
    assert "Traceback" in caplog.text


def test_other_exceptions_are_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    _failing(monkeypatch, FileNotFoundError("a bug, not a user error"))
    with pytest.raises(FileNotFoundError):
        cli.main([])
