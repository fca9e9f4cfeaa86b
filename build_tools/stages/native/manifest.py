"""The native manifest: what one native build produced, byte for byte, and from which inputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...common.elf import is_elf, read_dynamic
from ...common.fsutil import read_json, write_json_atomic
from ...common.hashing import sha256_file
from ...errors import ManifestError

SCHEMA_VERSION = 1
MANIFEST_NAME = "native-manifest.json"


@dataclass(frozen=True)
class LibraryRecord:
    path: str  # relative to the build result root, POSIX separators, e.g. "lib/libllama.so.0"
    sha256: str
    size: int
    soname: str | None = None
    needed: tuple[str, ...] = ()
    runpath: tuple[str, ...] = ()
    rpath: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "sha256": self.sha256,
            "size": self.size,
            "soname": self.soname,
            "needed": list(self.needed),
            "runpath": list(self.runpath),
            "rpath": list(self.rpath),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LibraryRecord:
        return cls(
            path=d["path"], sha256=d["sha256"], size=int(d["size"]), soname=d.get("soname"),
            needed=tuple(d.get("needed", ())), runpath=tuple(d.get("runpath", ())),
            rpath=tuple(d.get("rpath", ())),
        )


def describe_library(root: Path, rel: str) -> LibraryRecord:
    """The record of one built library: hash, size, and its loader metadata by format.

    ELF: SONAME, NEEDED, RUNPATH, RPATH. PE (Windows DLL): its file name as the SONAME, the import
    and delay-load tables as NEEDED. Mach-O: the install name as the SONAME, load and weak dylibs as
    NEEDED, LC_RPATH as the RUNPATH.
    """
    path = root / rel
    digest, size = sha256_file(path), path.stat().st_size
    if is_elf(path):
        info = read_dynamic(path)
        return LibraryRecord(rel, digest, size, info.soname, info.needed, info.runpath, info.rpath)
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:2] == b"MZ" or head in (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xca\xfe\xba\xbe"):
        from llama_cpp._native.binfmt import read_dependencies  # the runtime's reader: one parser for both sides

        try:
            deps = read_dependencies(path)
        except ValueError as exc:
            raise ManifestError(f"{path}: cannot read its dependencies ({exc})") from None
        if deps.format == "pe":
            return LibraryRecord(rel, digest, size, path.name, deps.needed + deps.weak)
        return LibraryRecord(rel, digest, size, deps.install_name, deps.needed + deps.weak, deps.rpaths)
    return LibraryRecord(rel, digest, size)


@dataclass(frozen=True)
class NativeManifest:
    config: dict[str, Any]
    key: str
    key_inputs: dict[str, Any]
    source: dict[str, Any]
    toolchain: dict[str, Any]
    cmake: dict[str, list[str]]
    libraries: tuple[LibraryRecord, ...]
    backends: tuple[str, ...]
    schema_version: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def config_name(self) -> str:
        return str(self.config["name"])

    def library(self, name: str) -> LibraryRecord:
        for lib in self.libraries:
            if lib.name == name:
                return lib
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "config": self.config,
            "key": self.key,
            "key_inputs": self.key_inputs,
            "source": self.source,
            "toolchain": self.toolchain,
            "cmake": self.cmake,
            "libraries": [lib.to_json() for lib in self.libraries],
            "backends": list(self.backends),
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], where: str = "manifest") -> NativeManifest:
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: expected a JSON object")
        if d.get("schema_version") != SCHEMA_VERSION:
            raise ManifestError(
                f"{where}: schema_version {d.get('schema_version')!r} is not {SCHEMA_VERSION}; rebuild it"
            )
        try:
            return cls(
                config=d["config"], key=d["key"], key_inputs=d["key_inputs"], source=d["source"],
                toolchain=d["toolchain"], cmake=d["cmake"],
                libraries=tuple(LibraryRecord.from_json(x) for x in d["libraries"]),
                backends=tuple(d["backends"]), extra=d.get("extra", {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{where}: malformed manifest ({exc!r})") from None

    def write(self, root: Path) -> Path:
        path = root / MANIFEST_NAME
        write_json_atomic(path, self.to_json())
        return path


def load_manifest(path: Path) -> NativeManifest:
    if path.is_dir():
        path = path / MANIFEST_NAME
    data = read_json(path, missing=f"native manifest not found: {path}", invalid=ManifestError)
    return NativeManifest.from_json(data, str(path))


def verify_files(manifest: NativeManifest, root: Path) -> list[str]:
    """Rehash every library under ``root``; return one message per file that is missing or differs."""
    problems: list[str] = []
    for lib in manifest.libraries:
        path = root / lib.path
        if not path.is_file():
            problems.append(f"{lib.path}: missing")
            continue
        size = path.stat().st_size
        digest = sha256_file(path)
        if digest != lib.sha256 or size != lib.size:
            problems.append(
                f"{lib.path}: sha256 {digest} ({size} bytes) differs from manifest "
                f"{lib.sha256} ({lib.size} bytes)"
            )
    return problems
