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

    def clearance(self) -> dict[str, Any]:
        """The saved clearance; raises :class:`PublishError` when these wheels were not cleared."""
        path = self.path / CLEARANCE_FILE
        data = read_json(path, missing=f"{path} is missing: these wheels have not passed validate and smoke "
                         "(nox -s validate, nox -s smoke)", invalid=PublishError, missing_error=PublishError)
        if data.get("schema_version") != 1 or not isinstance(data.get("wheels"), list):
            raise PublishError(f"{path}: not a clearance of schema 1")
        return data

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
