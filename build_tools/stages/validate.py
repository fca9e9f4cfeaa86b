"""Step 4: refuse a release unless every wheel is exactly what the native build and sources say.

Each check has a name; a failing wheel's report lists every failure by that name:

    archive             the file is a readable zip with one .dist-info
    library-hash        a library differs from the native manifest's sha256 (or is missing / extra)
    libraries-identical the N wheels do not all carry byte-identical libraries
    embedded-manifest   llama_cpp/native-manifest.json is not the build's manifest
    payload             a Python file, METADATA, entry points or license differs from what the wheels
                        stage makes from the sources (sha256), or is missing
    name                an entry name that is not a normalized relative path (``..``, absolute, a
                        backslash, ``./``, empty parts, control characters, non-NFC), a duplicate, or a link
    version             filename, .dist-info, METADATA, llama_cpp/_version.py and the intended version disagree
    tag                 filename and WHEEL tags disagree with each other or with the intended tag
    record              RECORD hashes or sizes are wrong, or it lists too few / too many files
    unexpected-file     a file the wheels stage did not produce (an added module, tests, vendored
                        sources, build files, bytecode)
    sbom                the CycloneDX SBOM is missing or its hashes disagree with the manifest
    metadata            `twine check --strict` fails (or twine is missing)
    size-budget         the wheel exceeds the configuration's wheel_size_budget_mb
    cuda-runtime        a CUDA wheel lacks a runtime Requires-Dist of its configuration
    driver-library      the wheel carries a GPU driver, runtime or loader (CUDA, Vulkan)
    architecture        an ELF, PE or Mach-O file in the package is built for another machine than the platform tag names
    dylib-dependency    a macOS dylib loads a library neither in the wheel nor in macOS, has an LC_RPATH other than
                        @loader_path, or delocate copied a library in (.dylibs/)
    graft               (Windows) a file delvewheel's <dist>.libs/ should not hold: not a DLL of the
                        libraries' machine, a driver's, Windows' or CPython's own DLL, or one nothing imports
    dll-dependency      (Windows) a DLL imports one that is neither in the wheel, nor Windows', nor CPython's
                        for the wheel's tag (VCRUNTIME140.dll), nor a driver's
    cpu-variants        a GGML_CPU_ALL_VARIANTS build lacks a CPU variant that ggml's own list
                        (vendor/llama.cpp/ggml/src/CMakeLists.txt) builds for the target, or has one it does not
"""

from __future__ import annotations

import csv
import email.parser
import hashlib
import io
import json
import os
import re
import stat
import sys
import unicodedata
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ..common import elf, pe, proc
from ..common.fsutil import write_json_atomic
from ..common.paths import REPO_ROOT, VENDOR_DIR
from ..errors import ManifestError, ToolTimeoutError, WheelError
from ..inputs.configs import BuildConfig
from .native.cpu_variants import cpu_variant_problems
from .native.manifest import MANIFEST_NAME, NativeManifest
from .wheels.build import PACKAGE, BuiltWheel, dist_info_name, expected_version, payload_entries, read_project
from .wheels.inwheel import parse_wheel_name, record_hash
from .wheels.repair_macos import dependency_problems, is_macos_tag, tag_arch
from .wheels.repair_windows import DELVEWHEEL_RECORD, INIT, graft_problems, is_windows_tag, libs_dir, unpatched_init
from .wheels.sbom import SBOM_NAME

REPORT_FILE = "validation.json"
_DRIVER = re.compile(r"^(libcuda\.so|libcudart\.so|libcublas(Lt)?\.so|libnvidia-|nvcuda\.dll|cudart64_|cublas(Lt)?64_"
                     r"|libvulkan\.so|vulkan-1\.dll|libMoltenVK)")
_BUILD_FILE = re.compile(r"(^|/)(CMakeLists\.txt|CMakeCache\.txt|Makefile|build\.ninja|\.ninja_.*)$|\.(o|a|obj|lib|"
                         r"c|cc|cpp|h|hpp|cu|cuh|pyc|pyo|log)$")
_VERSION_RE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)


@dataclass(frozen=True)
class Failure:
    check: str
    message: str


@dataclass
class WheelReport:
    filename: str
    sha256: str
    size: int
    failures: list[Failure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def fail(self, check: str, message: str) -> None:
        self.failures.append(Failure(check, message))


@dataclass
class ValidationReport:
    config: str
    version: str
    native_key: str
    wheels: list[WheelReport]

    @property
    def ok(self) -> bool:
        return bool(self.wheels) and all(w.ok for w in self.wheels)

    def failed_checks(self) -> set[str]:
        return {f.check for w in self.wheels for f in w.failures}

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": 1, "config": self.config, "version": self.version, "native_key": self.native_key,
            "ok": self.ok,
            "wheels": [{"filename": w.filename, "sha256": w.sha256, "size": w.size, "ok": w.ok,
                        "failures": [{"check": f.check, "message": f.message} for f in w.failures]}
                       for w in self.wheels],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ValidationReport:
        """The report :meth:`to_json` wrote (``ok`` is derived, not read)."""
        return cls(data["config"], data["version"], data["native_key"], [
            WheelReport(w["filename"], w["sha256"], w["size"],
                        [Failure(f["check"], f["message"]) for f in w.get("failures", [])])
            for w in data["wheels"]])

    def render(self) -> str:
        lines = [f"validate {self.config} {self.version}: {'OK' if self.ok else 'REFUSED'}"]
        for w in self.wheels:
            lines.append(f"  {'ok  ' if w.ok else 'FAIL'} {w.filename} ({w.size / 1e6:.1f} MB)")
            lines += [f"       [{f.check}] {f.message}" for f in w.failures]
        return "\n".join(lines)


def _tag_specific(name: str, dist_info: str, lib_names: set[str], grafts: str | None = None) -> bool:
    """Whether ``name`` is one of the files that depend on the tag or the native build (checked
    by their own checks: WHEEL, RECORD, the SBOM, the embedded manifest, the libraries, and on
    Windows delvewheel's grafts and record)."""
    if grafts is not None and (name.startswith(grafts + "/") and name.count("/") == 1
                               or name == f"{dist_info}/{DELVEWHEEL_RECORD}"):
        return True
    if name.startswith(dist_info + "/"):
        rest = name[len(dist_info) + 1:]
        return rest in ("WHEEL", "RECORD") or (rest.startswith("sboms/") and rest.endswith(".cdx.json")
                                               and rest.count("/") == 1)
    if name == f"{PACKAGE}/{MANIFEST_NAME}":
        return True
    lib = name.split("/")
    return len(lib) == 3 and lib[:2] == [PACKAGE, "lib"] and lib[2] in lib_names


def _extra_reason(name: str) -> str:
    """Why a file the wheels stage did not produce is in a wheel (the likeliest story, for the message)."""
    parts = name.split("/")
    if _BUILD_FILE.search(name):
        return "a build file or compiled artefact"
    if any(p in ("tests", "test", "vendor", "__pycache__", "build") for p in parts[:-1]):
        return "tests, vendored sources or build output"
    if parts[0].endswith(".dist-info"):
        return "not a .dist-info file the wheels stage writes"
    if parts[0] != PACKAGE:
        return f"outside the {PACKAGE}/ package"
    if parts[1:2] == ["lib"]:
        return "a library the native manifest does not list"
    return "not a file of the package's sources (added after the wheels stage)"


def _name_problem(name: str) -> str | None:
    """None if ``name`` is a normalized relative POSIX path, else what is wrong with it."""
    if not name:
        return "an empty name"
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return "an absolute path"
    if "\\" in name:
        return "a backslash in the name"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return "a control character in the name"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "a '..', '.' or empty path component"
    if unicodedata.normalize("NFC", name) != name:
        return "not in Unicode NFC form"
    return None


def _check_names(rep: WheelReport, infos: Sequence[zipfile.ZipInfo]) -> None:
    seen: dict[str, int] = {}
    folded: dict[str, str] = {}
    for info in infos:
        name = info.filename
        why = _name_problem(name.rstrip("/") if info.is_dir() else name)
        if why:
            rep.fail("name", f"{name!r}: {why}")
        seen[name] = seen.get(name, 0) + 1
        if seen[name] == 2:
            rep.fail("name", f"{name} appears twice in the archive (an installer may take either copy)")
        other = folded.setdefault(name.casefold(), name)
        if other != name:
            rep.fail("name", f"{name} and {other} differ only in case (they collide on Windows and macOS)")
        mode = info.external_attr >> 16
        if info.create_system == 3 and stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
            rep.fail("name", f"{name} is not a regular file (a symlink or device entry)")


def _check_payload(rep: WheelReport, zf: zipfile.ZipFile, names: Sequence[str], expected: dict[str, str],
                   dist_info: str, lib_names: set[str], repo: Path, grafts: str | None = None,
                   unpatched: dict[str, tuple[bytes, ...] | None] | None = None) -> None:
    """Every file that does not depend on the tag or the native build is byte for byte what the
    wheels stage makes from ``repo``; nothing is missing and nothing was added. ``unpatched``: files
    compared without delvewheel's patch (None: already refused)."""
    present = set(names)
    unpatched = unpatched or {}
    for name, digest in sorted(expected.items()):
        if name not in present:
            rep.fail("payload", f"{name} is missing (the wheels stage puts it in every wheel)")
            continue
        if name in unpatched and unpatched[name] is None:
            continue
        candidates = [hashlib.sha256(d).hexdigest() for d in unpatched.get(name) or (zf.read(name),)]
        got = digest if digest in candidates else candidates[0]
        if got != digest:
            rep.fail("payload", f"{name}: sha256 {got[:16]} is not {digest[:16]}, what the wheels stage makes "
                                f"from {repo} (the file was changed after it was built)")
    for name in sorted(present - set(expected)):
        if not _tag_specific(name, dist_info, lib_names, grafts):
            rep.fail("unexpected-file", f"{name}: {_extra_reason(name)}")


def expected_payload(config: BuildConfig, repo: Path = REPO_ROOT) -> tuple[str, dict[str, str]]:
    """The .dist-info name and, per file, the sha256 every wheel of ``config`` must carry."""
    meta = read_project(repo)
    return dist_info_name(meta, config), {e.name: hashlib.sha256(e.data).hexdigest()
                                          for e in payload_entries(meta, config, repo)}


def _check_record(rep: WheelReport, zf: zipfile.ZipFile, dist_info: str) -> None:
    record_name = f"{dist_info}/RECORD"
    try:
        text = zf.read(record_name).decode("utf-8")
        rows = list(csv.reader(io.StringIO(text)))
    except KeyError:
        rep.fail("record", "RECORD is missing")
        return
    except (UnicodeDecodeError, csv.Error) as exc:
        rep.fail("record", f"RECORD is unreadable ({exc})")
        return
    listed: dict[str, tuple[str, str]] = {}
    for i, row in enumerate(rows):
        if not row:
            continue
        if len(row) != 3:
            rep.fail("record", f"RECORD line {i + 1} has {len(row)} fields: {row!r}")
            continue
        if row[0] in listed:
            rep.fail("record", f"RECORD lists {row[0]} twice")
        listed[row[0]] = (row[1], row[2])
    files = {i.filename for i in zf.infolist() if not i.is_dir()}
    for name in sorted(files - set(listed)):
        rep.fail("record", f"{name} is in the archive but not in RECORD")
    for name in sorted(set(listed) - files):
        rep.fail("record", f"RECORD lists {name}, which is not in the archive")
    for name in sorted(files & set(listed)):
        digest, size = listed[name]
        if name == record_name:
            continue
        data = zf.read(name)
        if digest != record_hash(data):
            rep.fail("record", f"{name}: RECORD hash {digest or '(empty)'} != actual {record_hash(data)}")
        if size != str(len(data)):
            rep.fail("record", f"{name}: RECORD size {size or '(empty)'} != actual {len(data)}")


def _check_libraries(rep: WheelReport, zf: zipfile.ZipFile, manifest: NativeManifest) -> str:
    """Each library is the native manifest's, by sha256; returns the wheel's library digests joined."""
    digests = []
    for lib in manifest.libraries:
        arc = f"{PACKAGE}/lib/{lib.name}"
        try:
            got = hashlib.sha256(zf.read(arc)).hexdigest()
        except KeyError:
            rep.fail("library-hash", f"{arc} is missing")
            continue
        digests.append(got)
        if got != lib.sha256:
            rep.fail("library-hash", f"{arc}: sha256 {got} != native manifest {lib.sha256}")
    return "|".join(digests)


def _check_architecture(rep: WheelReport, zf: zipfile.ZipFile, names: Sequence[str], platform_tag: str) -> None:
    """Every ELF file under the package is built for the architecture the platform tag names."""
    want = elf.platform_machine(platform_tag)
    if want is None:
        return
    arch = {m: a for a, m in elf.MACHINES.items()}
    for n in names:
        if not n.startswith(f"{PACKAGE}/"):
            continue
        with zf.open(n) as f:
            got = elf.machine_of(f.read(64))
        if got is not None and got != want:
            rep.fail("architecture", f"{n} is an ELF file for {arch.get(got, f'e_machine {got}')}, but the wheel is "
                                     f"tagged {platform_tag} ({arch[want]}): rebuild it from that platform's native build")


def _check_macos(rep: WheelReport, zf: zipfile.ZipFile, names: Sequence[str], lib_names: set[str],
                 platform_tag: str) -> None:
    """A macOS wheel's dylibs: thin Mach-O files of the tag's architecture, loading only each other
    and macOS, with LC_RPATH @loader_path only, and nothing copied in by delocate."""
    files = {n: zf.read(n) for n in names if n.startswith(f"{PACKAGE}/") or "/.dylibs/" in f"/{n}"}
    for problem in dependency_problems(files, sorted(lib_names), tag_arch(platform_tag)):
        wrong_arch = "not a Mach-O library" in problem or " file in an " in problem
        rep.fail("architecture" if wrong_arch else "dylib-dependency", problem)


def _check_embedded_manifest(rep: WheelReport, zf: zipfile.ZipFile, manifest: NativeManifest) -> None:
    try:
        embedded = json.loads(zf.read(f"{PACKAGE}/{MANIFEST_NAME}"))
        if embedded.get("key") != manifest.key or embedded != manifest.to_json():
            rep.fail("embedded-manifest", f"embedded manifest (key {str(embedded.get('key'))[:16]}) is not "
                                          f"the native build's (key {manifest.key[:16]})")
    except (KeyError, ValueError, AttributeError) as exc:
        rep.fail("embedded-manifest", f"{PACKAGE}/{MANIFEST_NAME} missing or invalid ({exc})")


def _check_version(rep: WheelReport, w: BuiltWheel, zf: zipfile.ZipFile, dist_info: str, meta: Any,
                   intended: str, local: str | None) -> None:
    name = parse_wheel_name(w.path.name)
    seen = {"filename": name.version, ".dist-info": dist_info[: -len(".dist-info")].split("-", 1)[-1],
            "METADATA": str(meta.get("Version", "")), "intended": intended}
    try:
        m = _VERSION_RE.search(zf.read(f"{PACKAGE}/_version.py").decode("utf-8"))
        base = m.group(1) if m else "(no __version__)"
    except KeyError:
        base = "(missing _version.py)"
    seen["llama_cpp.__version__"] = f"{base}+{local}" if local else base
    if len(set(seen.values())) != 1:
        rep.fail("version", "versions disagree: " + ", ".join(f"{k} {v}" for k, v in seen.items()))
    wanted_name = canonicalize_name(w.name).replace("-", "_")
    if name.name != wanted_name or canonicalize_name(str(meta.get("Name", ""))) != canonicalize_name(w.name):
        rep.fail("version", f"distribution name {name.name!r} / METADATA {meta.get('Name')!r} is not {w.name!r}")


def _check_tags(rep: WheelReport, w: BuiltWheel, zf: zipfile.ZipFile, dist_info: str,
                intended_python: set[str]) -> None:
    name = parse_wheel_name(w.path.name)
    file_tags = set(name.tags)
    try:
        wheel_meta = email.parser.Parser().parsestr(zf.read(f"{dist_info}/WHEEL").decode("utf-8"))
        wheel_tags = set(wheel_meta.get_all("Tag") or [])
        if wheel_meta.get("Root-Is-Purelib", "").strip().lower() != "false":
            rep.fail("tag", "WHEEL says Root-Is-Purelib: true for a wheel carrying native libraries")
    except KeyError:
        rep.fail("tag", "WHEEL is missing")
        return
    if file_tags != wheel_tags:
        rep.fail("tag", f"filename tags {sorted(file_tags)} != WHEEL tags {sorted(wheel_tags)}")
    if name.tag != w.tag:
        rep.fail("tag", f"filename tag {name.tag} is not the intended {w.tag}")
    if name.python not in intended_python:
        rep.fail("tag", f"python tag {name.python} is not one of the intended {sorted(intended_python)}")
    if name.python.startswith("cp") and name.abi != name.python:
        rep.fail("tag", f"abi tag {name.abi} does not match python tag {name.python}")
    if name.python == "py3" and name.abi != "none":
        rep.fail("tag", f"py3 wheel with abi tag {name.abi}; expected none")
    if "any" in name.platform.split("."):
        rep.fail("tag", "platform tag 'any' on a wheel with native libraries")


def _check_metadata_deps(rep: WheelReport, meta: Any, config: BuildConfig) -> None:
    if config.cuda is None:
        return
    have: dict[str, list[Requirement]] = {}
    for r in meta.get_all("Requires-Dist") or []:
        try:
            req = Requirement(r)
        except InvalidRequirement:
            rep.fail("cuda-runtime", f"Requires-Dist {r!r} is not a valid requirement")
            continue
        have.setdefault(canonicalize_name(req.name), []).append(req)
    for want in config.cuda.runtime_requires:
        req = Requirement(want)
        got = have.get(canonicalize_name(req.name), [])
        if not got:
            rep.fail("cuda-runtime", f"METADATA lacks Requires-Dist {want!r} (CUDA {config.cuda.version} runtime)")
        elif not any(g.specifier == req.specifier for g in got):
            rep.fail("cuda-runtime", f"Requires-Dist for {req.name} is {[str(g) for g in got]}, expected {want!r}")


def _check_sbom(rep: WheelReport, zf: zipfile.ZipFile, dist_info: str, manifest: NativeManifest) -> None:
    try:
        sbom = json.loads(zf.read(f"{dist_info}/sboms/{SBOM_NAME}"))
    except KeyError:
        rep.fail("sbom", f"{dist_info}/sboms/{SBOM_NAME} is missing")
        return
    except ValueError as exc:
        rep.fail("sbom", f"SBOM is not JSON ({exc})")
        return
    if sbom.get("bomFormat") != "CycloneDX":
        rep.fail("sbom", "SBOM bomFormat is not CycloneDX")
    hashes = {c.get("name"): {h.get("content") for h in c.get("hashes", [])}
              for c in sbom.get("components", []) if c.get("type") == "file"}
    for lib in manifest.libraries:
        if lib.sha256 not in hashes.get(f"{PACKAGE}/lib/{lib.name}", set()):
            rep.fail("sbom", f"SBOM has no matching SHA-256 for {PACKAGE}/lib/{lib.name}")


_WINDOWS_MACHINES = {"win_amd64": "x86_64", "win_arm64": "arm64", "win32": "x86"}


def _check_windows(rep: WheelReport, zf: zipfile.ZipFile, names: Sequence[str], dist_info: str,
                   manifest: NativeManifest, abi_tag: str,
                   platform_tag: str) -> tuple[str, dict[str, tuple[bytes, ...] | None], str]:
    """A Windows wheel's DLL set (the grafts in ``<dist>.libs/``, every import resolved) and its
    delvewheel patch; returns the grafts folder, ``__init__.py`` without the patch, and the grafts'
    digests (every wheel of a build must carry the same: ``libraries-identical``)."""
    grafts = libs_dir(dist_info[: -len(".dist-info")].split("-", 1)[0])
    lib_names = [lib.name for lib in manifest.libraries]
    wanted = {f"{PACKAGE}/lib/{n}" for n in lib_names}
    files = {n: zf.read(n) for n in names if n in wanted or n.startswith(grafts + "/")}
    for check, message in graft_problems(files, lib_names, grafts, pe.python_dlls(abi_tag, platform_tag)):
        rep.fail(check, message)
    want = _WINDOWS_MACHINES.get(platform_tag)
    for n, d in sorted(files.items()):
        try:
            got = pe.parse_pe(d).machine
        except ValueError:
            continue  # already refused by graft_problems
        if want is not None and got != want:
            rep.fail("architecture", f"{n} is a PE file for {got}, but the wheel is tagged {platform_tag} ({want})")
    unpatched: dict[str, tuple[bytes, ...] | None] = {}
    if any(n.startswith(grafts + "/") for n in names) and INIT in names:
        try:
            unpatched[INIT] = unpatched_init(zf.read(INIT), grafts)
        except ValueError as exc:
            rep.fail("payload", f"{INIT}: {exc} (only delvewheel's DLL-directory patch may change it)")
            unpatched[INIT] = None
    key = "".join(f"|{n}={hashlib.sha256(d).hexdigest()}" for n, d in sorted(files.items()) if n.startswith(grafts))
    return grafts, unpatched, key


def _cpu_variant_problems(manifest: NativeManifest) -> list[str]:
    """The ``cpu-variants`` check against the vendored ggml, once per build (every wheel carries the
    same libraries, checked by ``library-hash``)."""
    try:
        return cpu_variant_problems(manifest, VENDOR_DIR)
    except ManifestError as exc:
        return [str(exc)]


def twine_check(paths: Sequence[Path]) -> dict[str, list[str]]:
    """``twine check --strict`` per file: filename -> problems (empty when it passed)."""
    try:
        done = proc.run([sys.executable, "-m", "twine", "check", "--strict", *paths], check=False, timeout=300,
                        env={**os.environ, "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "10000"})
    except ToolTimeoutError:
        return {p.name: ["twine check timed out"] for p in paths}
    out = done.stdout + done.stderr
    if "No module named twine" in out:
        return {p.name: ["twine is not installed: pip install -r requirements/release.txt"] for p in paths}
    # twine's console may wrap long lines anywhere (even inside a path): unwrap before parsing.
    text = re.sub(r"\x1b\[[0-9;]*m", "", out).replace("\r", "")
    text = re.sub(r"\s*\n\s*", "", text)
    results: dict[str, list[str]] = {}
    hits = list(re.finditer(r"Checking\s*(\S+?\.whl)\s*:\s*(PASSED|FAILED)", text))
    for n, m in enumerate(hits):
        rest = text[m.end(): hits[n + 1].start() if n + 1 < len(hits) else len(text)].strip()
        passed = m.group(2) == "PASSED" and "warning" not in rest[:40].lower()
        results[Path(m.group(1)).name] = [] if passed else [f"twine check {m.group(2)}: {rest[:1000]}"]
    for p in paths:
        if p.name not in results:
            results[p.name] = [f"twine check gave no verdict (exit {proc.returncode}): {out.strip()[-500:]}"]
    return results


def validate(wheels: Sequence[BuiltWheel], manifest: NativeManifest, config: BuildConfig, *,
             version: str, python_tags: Sequence[str], twine: bool = True,
             repo: Path = REPO_ROOT) -> ValidationReport:
    """Check every wheel against ``manifest`` and the sources in ``repo``; the report names each
    failure (``report.ok`` decides the release)."""
    report = ValidationReport(config.name, version, manifest.key, [])
    want_dist_info, payload = expected_payload(config, repo)
    lib_names = {lib.name for lib in manifest.libraries}
    lib_sets: dict[str, list[str]] = {}
    intended_python = set(python_tags)
    twine_results = twine_check([w.path for w in wheels]) if twine and wheels else {}
    variant_problems = _cpu_variant_problems(manifest)
    for w in wheels:
        data = w.path.read_bytes() if w.path.is_file() else b""
        rep = WheelReport(w.path.name, hashlib.sha256(data).hexdigest(), len(data))
        report.wheels.append(rep)
        if not data:
            rep.fail("archive", f"{w.path} is missing or empty")
            continue
        try:
            zf = zipfile.ZipFile(io.BytesIO(data))
            _check_names(rep, zf.infolist())
            names = [i.filename for i in zf.infolist() if not i.is_dir()]
            dirs = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
            if len(dirs) != 1:
                raise WheelError(f"expected one .dist-info directory, found {sorted(dirs)}")
            dist_info = dirs.pop()
            meta = email.parser.Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode("utf-8"))
            parse_wheel_name(w.path.name)
        except (zipfile.BadZipFile, WheelError, KeyError, UnicodeDecodeError) as exc:
            rep.fail("archive", f"unreadable wheel: {exc}")
            continue
        try:
            lib_key = _check_libraries(rep, zf, manifest)
            _check_embedded_manifest(rep, zf, manifest)
            _check_version(rep, w, zf, dist_info, meta, version, config.local_version)
            _check_tags(rep, w, zf, dist_info, intended_python)
            _check_record(rep, zf, dist_info)
            if dist_info != want_dist_info:
                rep.fail("version", f"{dist_info} is not {want_dist_info}")
            grafts: str | None = None
            unpatched: dict[str, tuple[bytes, ...] | None] = {}
            tag = parse_wheel_name(w.path.name)
            if is_windows_tag(tag.platform):
                grafts, unpatched, graft_key = _check_windows(rep, zf, names, dist_info, manifest, tag.abi,
                                                              tag.platform)
                lib_key += graft_key
            lib_sets.setdefault(lib_key, []).append(w.path.name)
            # a wrongly named .dist-info already failed "version": compare its contents under its own name
            _check_payload(rep, zf, names, {n.replace(want_dist_info, dist_info, 1): d for n, d in payload.items()},
                           dist_info, lib_names, repo, grafts, unpatched)
            for n in names:
                if _DRIVER.match(n.rsplit("/", 1)[-1]):
                    rep.fail("driver-library", f"{n}: a GPU driver, runtime or loader (CUDA, Vulkan) must come "
                                               "from the system or NVIDIA's wheels, never from this wheel")
            _check_architecture(rep, zf, names, parse_wheel_name(w.path.name).platform)
            if is_macos_tag(parse_wheel_name(w.path.name).platform):
                _check_macos(rep, zf, names, lib_names, parse_wheel_name(w.path.name).platform)
            _check_sbom(rep, zf, dist_info, manifest)
            _check_metadata_deps(rep, meta, config)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:  # a damaged member
            rep.fail("archive", f"a member of the wheel cannot be read: {exc}")
            continue
        for problem in twine_results.get(w.path.name, []):
            rep.fail("metadata", problem)
        for problem in variant_problems:
            rep.fail("cpu-variants", problem)
        budget = config.wheel_size_budget_mb * 1e6
        if len(data) > budget:
            rep.fail("size-budget", f"{len(data) / 1e6:.1f} MB exceeds the {config.name} budget of "
                                    f"{config.wheel_size_budget_mb:g} MB (wheel_size_budget_mb in configs.toml)")
    if len(lib_sets) > 1:
        groups = "; ".join(f"{', '.join(v)}" for v in lib_sets.values())
        for rep in report.wheels:
            rep.fail("libraries-identical", f"the wheels do not carry identical libraries (groups: {groups})")
    return report


def run(wheels: Sequence[BuiltWheel], manifest: NativeManifest, config: BuildConfig, out_dir: Path, *,
        twine: bool = True, repo: Path = REPO_ROOT) -> ValidationReport:
    """The stage: validate the wheels against the native manifest and save the report in ``out_dir``."""
    report = validate(wheels, manifest, config, version=expected_version(config, repo),
                      python_tags=sorted({w.python_tag for w in wheels}), twine=twine, repo=repo)
    save_report(report, out_dir)
    return report


def save_report(report: ValidationReport, out_dir: Path) -> Path:
    path = out_dir / REPORT_FILE
    write_json_atomic(path, report.to_json())
    return path


def load_report(out_dir: Path) -> ValidationReport | None:
    """The saved report of ``out_dir``, or None when validation has not run there (or left no readable report)."""
    try:
        return ValidationReport.from_json(json.loads((out_dir / REPORT_FILE).read_text(encoding="utf-8")))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
