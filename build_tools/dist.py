"""One typed view of a ``dist/<config>/`` folder, and the gate that clears its wheels for publishing.

What a dist folder holds, and which stage writes it::

    *.whl             the wheels (stage 3)
    wheels.json       the wheels *record*: the files the wheels stage produced and their content key
    validation.json   the validate report (stage 4)
    smoke.json        the smoke report (stage 5)
    clearance.json    written by :func:`clear` only when validate and smoke both passed: the files,
                      by sha256, that publish may take (the only thing publish reads from here)

The local chain (:mod:`build_tools.release`) and the CI path (``smoke --merge-reports``, then
``publish``) both clear through :func:`clear`. Not to be confused with the *native manifest*
(``native-manifest.json``: the libraries of one native build) or the index's published
``release-manifest.json`` (what one variant of the PEP 503 index serves).
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common.fsutil import read_json, write_json_atomic
from .common.hashing import sha256_file
from .common.names import sha256_problem, variant_problem, wheel_filename_problem
from .common.paths import REPO_ROOT
from .errors import PublishError
from .inputs.configs import BuildConfig
from .stages import smoke, validate
from .stages.native.manifest import MANIFEST_NAME, NativeManifest
from .stages.smoke import SmokeReport
from .stages.validate import ValidationReport
from .stages.wheels import BuiltWheel, load_record
from .stages.wheels.build import PACKAGE

DIST = REPO_ROOT / "dist"
CLEARANCE_FILE = "clearance.json"
PROJECT = "llama-cpp-python"


@dataclass(frozen=True)
class ClearedWheel:
    """One wheel of a clearance, its fields checked for type and form."""

    filename: str
    sha256: str
    size: int
    tag: str
    version: str
    requires_python: str | None
    smoke: str


@dataclass(frozen=True)
class Clearance:
    """``clearance.json``, parsed strictly: every name is one that can safely become a path."""

    config: str
    variant: str
    release: bool
    version: str
    native_key: str
    wheels: tuple[ClearedWheel, ...]
    raw: dict[str, Any]  # what the index's release-manifest.json records of this release

    @classmethod
    def from_json(cls, data: Any, where: Path) -> Clearance:
        def bad(field: str, problem: str) -> PublishError:
            return PublishError(f"{where}: {field} {problem}; re-run validate and smoke to write a new clearance")

        def typed(obj: dict[str, Any], key: str, kind: type, field: str) -> Any:
            value = obj.get(key)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise bad(field, f"must be {kind.__name__}, got {type(value).__name__} {value!r:.60}")
            return value

        if not isinstance(data, dict):
            raise bad("the document", f"must be a JSON object, got {type(data).__name__}")
        if data.get("schema_version") != 1:
            raise bad("schema_version", f"must be 1, got {data.get('schema_version')!r:.40}")
        if data.get("project") != PROJECT:
            raise bad("project", f"must be {PROJECT!r}, got {data.get('project')!r:.60}")
        variant = typed(data, "variant", str, "variant")
        if (problem := variant_problem(variant)) is not None:
            raise bad("variant", problem)
        wheels = []
        for i, w in enumerate(typed(data, "wheels", list, "wheels")):
            field = f"wheels[{i}]"
            if not isinstance(w, dict):
                raise bad(field, f"must be an object, got {type(w).__name__}")
            name = w.get("filename")
            if (problem := wheel_filename_problem(name)) is not None:
                raise bad(f"{field}.filename", problem)
            if (problem := sha256_problem(w.get("sha256"))) is not None:
                raise bad(f"{field}.sha256", problem)
            size = typed(w, "size", int, f"{field}.size")
            if size < 0:
                raise bad(f"{field}.size", f"must not be negative, got {size}")
            rp = w.get("requires_python")
            if rp is not None and not isinstance(rp, str):
                raise bad(f"{field}.requires_python", f"must be a string or null, got {type(rp).__name__}")
            smoke_verdict = typed(w, "smoke", str, f"{field}.smoke")
            if smoke_verdict not in ("pass", "skip"):
                raise bad(f"{field}.smoke", f"must be 'pass' or 'skip', got {smoke_verdict!r:.40}")
            wheels.append(ClearedWheel(name, w["sha256"], size, typed(w, "tag", str, f"{field}.tag"),
                                       typed(w, "version", str, f"{field}.version"), rp, smoke_verdict))
        if len({w.filename for w in wheels}) != len(wheels):
            raise bad("wheels", "lists a filename twice")
        return cls(typed(data, "config", str, "config"), variant, typed(data, "release", bool, "release"),
                   typed(data, "version", str, "version"), typed(data, "native_key", str, "native_key"),
                   tuple(wheels), data)


@dataclass(frozen=True)
class DistDir:
    """``dist/<config>/``: its wheels record and the reports the later stages left in it."""

    path: Path

    @classmethod
    def of(cls, config: BuildConfig, base: Path = DIST) -> DistDir:
        return cls(base / config.name)

    def wheels(self) -> list[BuiltWheel]:
        """The wheels the record lists (raises when the wheels stage has not run here)."""
        return load_record(self.path)[1]

    def validation(self) -> ValidationReport | None:
        return validate.load_report(self.path)

    def smoke(self) -> SmokeReport | None:
        return smoke.load_report(self.path)

    def clearance(self) -> Clearance:
        """The saved clearance; raises :class:`PublishError` when these wheels were not cleared."""
        path = self.path / CLEARANCE_FILE
        data = read_json(path, missing=f"{path} is missing: these wheels have not passed validate and smoke "
                         "(nox -s validate, nox -s smoke)", invalid=PublishError, missing_error=PublishError)
        return Clearance.from_json(data, path)

    def cleared_files(self) -> tuple[Clearance, list[tuple[ClearedWheel, Path]]]:
        """The clearance and its wheels' files, each proven to be the file validate and smoke passed.

        A name must resolve to a regular file directly inside this folder (no symlink), its sha256
        must be the cleared one, and ``validation.json`` and ``smoke.json`` must independently say
        that this exact file passed: editing the clearance alone cannot clear a file.
        """
        rel = self.clearance()
        where = self.path / CLEARANCE_FILE
        validation, smoke_report = self.validation(), self.smoke()
        if validation is None:
            raise PublishError(f"{self.path / validate.REPORT_FILE} is missing or unreadable: the clearance in "
                               f"{where} cannot be confirmed (re-run nox -s validate and smoke)")
        if smoke_report is None:
            raise PublishError(f"{self.path / smoke.REPORT_FILE} is missing or unreadable: the clearance in "
                               f"{where} cannot be confirmed (re-run nox -s smoke)")
        for name, ours, theirs in (("config", rel.config, validation.config),
                                   ("version", rel.version, validation.version),
                                   ("native_key", rel.native_key, validation.native_key)):
            if ours != theirs:
                raise PublishError(f"{where}: {name} {ours!r} disagrees with {validate.REPORT_FILE}'s {theirs!r}")
        passed = {(w.filename, w.sha256) for w in validation.wheels if w.ok}
        root = self.path.resolve()
        out = []
        for w in rel.wheels:
            path = self.path / w.filename
            if path.is_symlink() or path.resolve().parent != root:
                raise PublishError(f"refusing {w.filename}: it is a link or resolves outside {self.path}")
            if not path.is_file():
                raise PublishError(f"{path} is listed in {where} but missing")
            digest = sha256_file(path)
            if digest != w.sha256:
                raise PublishError(f"refusing {w.filename}: its sha256 {digest[:16]} is not the validated and "
                                   f"smoke-tested {w.sha256[:16]} (re-run validate and smoke)")
            if (w.filename, w.sha256) not in passed:
                raise PublishError(f"refusing {w.filename}: {validate.REPORT_FILE} has no passing entry for sha256 "
                                   f"{w.sha256[:16]} (the clearance in {where} is not backed by validation)")
            cells = [r for r in smoke_report.results if r.wheel == w.filename]
            verdict = smoke_report.verdict(w.filename)
            if verdict not in ("pass", "skip") or any(r.wheel_sha256 != w.sha256 for r in cells) \
                    or verdict != w.smoke:
                raise PublishError(f"refusing {w.filename}: {smoke.REPORT_FILE} gives it {verdict!r} for "
                                   f"these bytes, not the cleared {w.smoke!r}")
            out.append((w, path))
        return rel, out

    def forget_reports(self) -> None:
        """Drop the reports and clearance: they describe wheels that were just replaced."""
        for name in (validate.REPORT_FILE, smoke.REPORT_FILE, CLEARANCE_FILE):
            (self.path / name).unlink(missing_ok=True)


def embedded_manifest(wheel: Path) -> NativeManifest:
    """The native manifest a wheel embeds (validation proved it is the native build's)."""
    with zipfile.ZipFile(wheel) as zf:
        return NativeManifest.from_json(json.loads(zf.read(f"{PACKAGE}/{MANIFEST_NAME}")), str(wheel))


def clear(dist: DistDir, *, config: BuildConfig, wheels: Sequence[BuiltWheel], validation: ValidationReport,
          smoke: SmokeReport, native: NativeManifest, strict: bool) -> Path:
    """The gate: write ``clearance.json`` for the wheels that passed validation and smoke, by sha256.

    Raises :class:`PublishError` unless both passed for these exact files.
    """
    if not validation.ok:
        raise PublishError(f"validation of {config.name} failed; no clearance written")
    if not smoke.ok:
        raise PublishError(f"smoke tests of {config.name} failed; no clearance written")
    validated = {w.sha256 for w in validation.wheels if w.ok}
    entries = []
    for w in wheels:
        if w.sha256 not in validated:
            raise PublishError(f"{w.filename} (sha256 {w.sha256[:16]}) was not the file that passed validation")
        verdict = smoke.verdict(w.filename)
        if verdict == "fail" or (verdict == "skip" and strict):
            raise PublishError(f"{w.filename}: smoke verdict {verdict}")
        entries.append({"filename": w.filename, "sha256": w.sha256, "size": w.size, "tag": w.tag,
                        "version": w.version, "requires_python": w.requires_python, "smoke": verdict})
    src = native.source
    data = {
        "schema_version": 1,
        "project": PROJECT,
        "config": config.name,
        "variant": config.variant,
        "release": config.release,
        "version": wheels[0].version if wheels else None,
        "native_key": native.key,
        "llama_cpp": {"commit": src.get("commit"), "build_number": src.get("build_number")},
        "source_date_epoch": wheels[0].epoch if wheels else None,
        "gates": {"validate": "passed", "smoke": "passed (strict)" if strict else "passed"},
        "wheels": entries,
    }
    path = dist.path / CLEARANCE_FILE
    write_json_atomic(path, data)
    return path
