"""Step 3: repack one native build into wheels, one per CPython tag, in parallel.

No compiler runs: the package is pure Python and loads its libraries with ctypes, so a
wheel is ``llama_cpp/**/*.py`` + ``llama_cpp/lib/<the native manifest's libraries>`` +
``llama_cpp/native-manifest.json`` + ``.dist-info`` (METADATA from pyproject.toml, WHEEL,
entry points, licenses, a CycloneDX SBOM, RECORD). Assembling the zip directly (rather
than running a build backend per interpreter) is what makes five wheels take seconds and
lets :mod:`build_tools.stages.wheels.inwheel` make them byte-for-byte reproducible.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sys
import sysconfig
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ... import RECIPE_VERSION
from ...common.fsutil import read_json, write_json_atomic
from ...common.hashing import sha256_file, sha256_json
from ...common.interpreters import VERSIONS
from ...common.paths import REPO_ROOT, VENDOR_DIR
from ...errors import ConfigError, MissingInputError, WheelBuildError
from ...inputs.configs import BuildConfig
from ..native.manifest import MANIFEST_NAME, NativeManifest
from .inwheel import Entry, source_date_epoch, write_wheel
from .sbom import SBOM_NAME, build_sbom, render

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

log = logging.getLogger(__name__)

WHEEL_RECIPE = "1"  # bump when the wheel layout changes in a way the content key cannot see
PYTHON_TAGS = tuple(f"cp{v.replace('.', '')}" for v in VERSIONS)
PACKAGE = "llama_cpp"
PACKAGE_SUFFIXES = (".py", ".pyi")
PACKAGE_FILES = ("py.typed",)
RECORD_FILE = "wheels.json"  # in the output dir: what the wheels step produced, and its content key
_VERSION_RE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)



@dataclass(frozen=True)
class ProjectMetadata:
    """The [project] table of pyproject.toml, resolved (version read from ``llama_cpp/_version.py``)."""

    name: str
    version: str
    summary: str = ""
    requires_python: str | None = None
    dependencies: tuple[str, ...] = ()
    classifiers: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    authors: tuple[str, ...] = ()
    license: str | None = None
    urls: tuple[tuple[str, str], ...] = ()
    scripts: tuple[tuple[str, str], ...] = ()
    extras: tuple[tuple[str, tuple[str, ...]], ...] = ()  # [project.optional-dependencies], sorted
    readme: str = ""
    readme_type: str = "text/markdown"

    @property
    def dist_name(self) -> str:
        """The name as it appears in filenames (``llama_cpp_python``)."""
        return canonicalize_name(self.name).replace("-", "_")


PLUGIN_PREFIX = "llama-cpp-python-"  # backend plugin wheels: llama-cpp-python-<key>, the extra <key>


def package_version(repo: Path = REPO_ROOT) -> str:
    path = repo / PACKAGE / "_version.py"
    try:
        m = _VERSION_RE.search(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WheelBuildError(f"{path} is missing: it is the single source of the package version") from None
    if not m:
        raise WheelBuildError(f"{path}: no `__version__ = \"X.Y.Z\"` line")
    try:
        return str(Version(m.group(1)))
    except InvalidVersion:
        raise WheelBuildError(f"{path}: __version__ {m.group(1)!r} is not a PEP 440 version") from None


def read_project(repo: Path = REPO_ROOT) -> ProjectMetadata:
    """Read pyproject.toml's [project] table into the metadata every wheel carries."""
    path = repo / "pyproject.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WheelBuildError(f"{path} is missing") from None
    except tomllib.TOMLDecodeError as exc:
        raise WheelBuildError(f"{path}: invalid TOML ({exc})") from None
    project = data.get("project")
    if not isinstance(project, dict) or "name" not in project:
        raise WheelBuildError(f"{path}: no [project] table with a name")
    version = package_version(repo)
    if "version" in project and str(Version(project["version"])) != version:
        raise WheelBuildError(f"{path}: version {project['version']} disagrees with llama_cpp/_version.py {version}")
    for dep in project.get("dependencies", []):
        try:
            Requirement(dep)
        except InvalidRequirement as exc:
            raise WheelBuildError(f"{path}: dependency {dep!r} is invalid ({exc})") from None
    extras = []
    for extra, deps in sorted(project.get("optional-dependencies", {}).items()):
        if not re.match(r"^[a-z0-9]+(-[a-z0-9]+)*$", extra) or not isinstance(deps, list):
            raise WheelBuildError(f"{path}: optional-dependencies.{extra} must be a normalized name with a list")
        for dep in deps:
            try:
                req = Requirement(dep)
            except InvalidRequirement as exc:
                raise WheelBuildError(f"{path}: optional dependency {dep!r} ({extra}) is invalid ({exc})") from None
            if canonicalize_name(req.name).startswith(PLUGIN_PREFIX) and str(req.specifier) != f"=={version}":
                raise WheelBuildError(f"{path}: optional-dependencies.{extra} pins {dep!r}, but a backend plugin "
                                      f"must be pinned to this version: {req.name}=={version}")
        extras.append((extra, tuple(deps)))
    readme, readme_type = "", "text/markdown"
    rd = project.get("readme")
    if isinstance(rd, str):
        readme_path = repo / rd
        readme_type = "text/markdown" if rd.lower().endswith(".md") else "text/x-rst" if rd.endswith(".rst") \
            else "text/plain"
        readme = readme_path.read_text(encoding="utf-8") if readme_path.is_file() else ""
    lic = project.get("license")
    license_expr = lic if isinstance(lic, str) else None
    return ProjectMetadata(
        name=project["name"],
        version=version,
        summary=str(project.get("description", "")),
        requires_python=project.get("requires-python"),
        dependencies=tuple(project.get("dependencies", ())),
        classifiers=tuple(project.get("classifiers", ())),
        keywords=tuple(project.get("keywords", ())),
        authors=tuple(a["name"] for a in project.get("authors", ()) if "name" in a),
        license=license_expr,
        urls=tuple(sorted(project.get("urls", {}).items())),
        scripts=tuple(sorted(project.get("scripts", {}).items())),
        extras=tuple(extras),
        readme=readme,
        readme_type=readme_type,
    )


def wheel_version(meta: ProjectMetadata, config: BuildConfig) -> str:
    """The package version plus the configuration's local label (``0.4.0+cu130``)."""
    return f"{meta.version}+{config.local_version}" if config.local_version else meta.version


def requirements(meta: ProjectMetadata, config: BuildConfig) -> list[str]:
    """Requires-Dist: the project's dependencies, then a CUDA configuration's runtime wheels."""
    reqs = list(meta.dependencies)
    if config.cuda is not None:
        reqs += list(config.cuda.runtime_requires)
    return reqs


def default_platform_tag() -> str:
    """This machine's platform tag before repair (``linux_x86_64``, ``win_amd64``, ``macosx_11_0_arm64``)."""
    return re.sub(r"[-.]", "_", sysconfig.get_platform())


_CROSS_TAGS = {("Linux", "aarch64"): "linux_aarch64", ("Linux", "x86_64"): "linux_x86_64",
               ("Windows", "x86_64"): "win_amd64"}


def _macos_tag() -> str:
    """The macOS tag of the libraries' deployment target (a macOS 11+ tag has minor version 0)."""
    from ..native.build import MACOS_DEPLOYMENT_TARGET

    major, _, minor = MACOS_DEPLOYMENT_TARGET.partition(".")
    if minor.strip("0"):
        raise ConfigError(f"MACOS_DEPLOYMENT_TARGET {MACOS_DEPLOYMENT_TARGET} is not X.0: pip's tags name "
                          "only major macOS versions, so the wheel would claim releases the libraries refuse")
    return f"macosx_{major}_0_arm64"


def target_platform_tag(config: BuildConfig, requested: str) -> str:
    """The platform tag before repair for ``config``: ``requested`` (the host's by default), or, for
    a cross build or a ``platform``, its target's; an explicit tag that contradicts the target is refused."""
    if config.cross is None and config.platform is None:
        return requested
    where = config.target
    target = _macos_tag() if where == ("Darwin", "arm64") else _CROSS_TAGS[where]
    if requested not in (target, default_platform_tag()):
        what = f"cross target {config.cross.triple}" if config.cross else f"platform {config.platform}"
        raise ConfigError(f"platform tag {requested!r} does not match {config.name}'s {what} ({target}); "
                          "drop --platform-tag")
    return target


def _with_extra(dep: str, extra: str) -> str:
    """``dep`` as a Requires-Dist that applies only with ``extra`` (its own marker kept)."""
    req = Requirement(dep)
    marker = f'({req.marker}) and extra == "{extra}"' if req.marker else f'extra == "{extra}"'
    req.marker = None
    return f"{req}; {marker}"


def render_metadata(meta: ProjectMetadata, version: str, reqs: Sequence[str],
                    license_files: Sequence[str] = ()) -> bytes:
    lines = ["Metadata-Version: 2.4", f"Name: {meta.name}", f"Version: {version}"]
    if meta.summary:
        lines.append(f"Summary: {meta.summary}")
    if meta.keywords:
        lines.append(f"Keywords: {','.join(meta.keywords)}")
    if meta.authors:
        lines.append(f"Author: {', '.join(meta.authors)}")
    if meta.license:
        lines.append(f"License-Expression: {meta.license}")
    lines += [f"License-File: {f}" for f in license_files]
    lines += [f"Classifier: {c}" for c in meta.classifiers]
    lines += [f"Project-URL: {label}, {url}" for label, url in meta.urls]
    if meta.requires_python:
        lines.append(f"Requires-Python: {meta.requires_python}")
    lines += [f"Requires-Dist: {r}" for r in reqs]
    for extra, deps in meta.extras:
        lines.append(f"Provides-Extra: {extra}")
        lines += [f"Requires-Dist: {_with_extra(dep, extra)}" for dep in deps]
    if meta.readme:
        lines.append(f"Description-Content-Type: {meta.readme_type}")
    text = "\n".join(lines) + "\n"
    if meta.readme:
        text += "\n" + meta.readme.rstrip("\n") + "\n"
    return text.encode("utf-8")


def render_wheel_file(tags: Sequence[str]) -> bytes:
    lines = ["Wheel-Version: 1.0", f"Generator: llama-cpp-python build_tools {WHEEL_RECIPE}",
             "Root-Is-Purelib: false", *(f"Tag: {t}" for t in tags)]
    return ("\n".join(lines) + "\n").encode("utf-8")


def render_entry_points(meta: ProjectMetadata) -> bytes | None:
    if not meta.scripts:
        return None
    return ("[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in meta.scripts)).encode("utf-8")


def package_entries(repo: Path = REPO_ROOT) -> list[Entry]:
    """The package's Python sources (no caches, no libraries, nothing that is not source)."""
    pkg = repo / PACKAGE
    if not (pkg / "__init__.py").is_file():
        raise WheelBuildError(f"{pkg}/__init__.py is missing: run from a checkout of the repository")
    out = []
    for p in sorted(pkg.rglob("*")):
        rel = p.relative_to(repo)
        if not p.is_file() or "__pycache__" in rel.parts or rel.parts[1:2] == ("lib",):
            continue
        if p.suffix in PACKAGE_SUFFIXES or p.name in PACKAGE_FILES:
            out.append(Entry(rel.as_posix(), p.read_bytes()))
    return out


def license_entries(repo: Path, dist_info: str) -> list[Entry]:
    """License texts: the project's own (if any) and llama.cpp's, whose binaries the wheel ships."""
    found = []
    for src, name in ((repo / "LICENSE", "LICENSE"), (VENDOR_DIR / "LICENSE", "llama.cpp/LICENSE")):
        if src.is_file():
            found.append(Entry(f"{dist_info}/licenses/{name}", src.read_bytes()))
    return found


def dist_info_name(meta: ProjectMetadata, config: BuildConfig) -> str:
    return f"{meta.dist_name}-{wheel_version(meta, config)}.dist-info"


def payload_entries(meta: ProjectMetadata, config: BuildConfig, repo: Path = REPO_ROOT) -> list[Entry]:
    """The files every wheel of ``config`` carries whatever its tag and native build: the package's
    sources, METADATA, entry points and licenses (validate compares wheels against exactly these)."""
    dist_info = dist_info_name(meta, config)
    licenses = license_entries(repo, dist_info)
    out = package_entries(repo) + licenses
    out.append(Entry(f"{dist_info}/METADATA", render_metadata(
        meta, wheel_version(meta, config), requirements(meta, config),
        [e.name.split("/licenses/", 1)[1] for e in licenses])))
    ep = render_entry_points(meta)
    if ep is not None:
        out.append(Entry(f"{dist_info}/entry_points.txt", ep))
    return out


@dataclass(frozen=True)
class WheelOptions:
    """What to build: which tags, where, and with which timestamp."""

    out_dir: Path
    python_tags: tuple[str, ...] = PYTHON_TAGS
    single: bool = False  # one py3-none-<platform> wheel instead of one per CPython
    platform_tag: str = field(default_factory=default_platform_tag)
    epoch: int | None = None
    jobs: int | None = None
    repo: Path = REPO_ROOT

    def tags(self) -> list[tuple[str, str]]:
        """(python tag, abi tag) pairs."""
        if self.single:
            return [("py3", "none")]
        for t in self.python_tags:
            if not re.match(r"^cp3\d{1,2}$", t):
                raise WheelBuildError(f"python tag {t!r} is not like 'cp312'")
        return [(t, t) for t in self.python_tags]


@dataclass(frozen=True)
class BuiltWheel:
    """One wheel on disk and what it is meant to be."""

    path: Path
    config: str
    variant: str
    name: str
    version: str
    python_tag: str
    abi_tag: str
    platform_tag: str
    sha256: str
    size: int
    native_key: str
    epoch: int
    requires_python: str | None = None
    repaired: bool = False

    @property
    def filename(self) -> str:
        return self.path.name

    @property
    def tag(self) -> str:
        return f"{self.python_tag}-{self.abi_tag}-{self.platform_tag}"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = self.path.name
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any], base: Path) -> BuiltWheel:
        return cls(**{**d, "path": base / d["path"]})

    def refreshed(self, path: Path, **changes: Any) -> BuiltWheel:
        """This wheel after an edit: new path, hash and size."""
        return replace(self, path=path, sha256=sha256_file(path), size=path.stat().st_size, **changes)


def content_key(nb_manifest: NativeManifest, manifest_bytes: bytes, options: WheelOptions,
                config: BuildConfig, repair: bool) -> str:
    """Everything a wheel's bytes depend on; the same key means the wheels on disk can be reused."""
    meta = read_project(options.repo)
    sources = [(e.name, _digest(e.data)) for e in package_entries(options.repo)]
    licenses = [(e.name, _digest(e.data)) for e in license_entries(options.repo, "x")]
    return sha256_json({
        "recipe": [RECIPE_VERSION, WHEEL_RECIPE],
        "native_key": nb_manifest.key,
        "manifest": _digest(manifest_bytes),
        "meta": asdict(meta),
        "config": config.to_json(),
        "tags": options.tags(),
        "platform": options.platform_tag,
        "epoch": source_date_epoch(options.epoch),
        "sources": sources,
        "licenses": licenses,
        "repair": repair,
    })


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_wheels(nb: Any, config: BuildConfig, options: WheelOptions) -> list[BuiltWheel]:
    """Assemble one wheel per requested tag from ``nb`` (a :class:`NativeBuild`), in parallel.

    Libraries are copied byte for byte from the native build after rehashing them against
    its manifest: a library that changed since the build is an error, not a silent repack.
    """
    manifest: NativeManifest = nb.manifest
    if manifest.config_name != config.name:
        raise WheelBuildError(f"native build is for {manifest.config_name!r}, not {config.name!r}")
    from ..native.manifest import verify_files

    problems = verify_files(manifest, nb.root)
    if problems:
        raise WheelBuildError(f"native build {nb.root} does not match its manifest: {problems}; rebuild it "
                              f"with `nox -s native -- {config.name} --force`")
    meta = read_project(options.repo)
    version = wheel_version(meta, config)
    epoch = source_date_epoch(options.epoch)
    dist_info = dist_info_name(meta, config)
    common = payload_entries(meta, config, options.repo)
    common.append(Entry(f"{PACKAGE}/{MANIFEST_NAME}", nb.manifest_path.read_bytes()))
    for lib in manifest.libraries:
        common.append(Entry(f"{PACKAGE}/lib/{lib.name}", (nb.root / lib.path).read_bytes(), executable=True))
    options.out_dir.mkdir(parents=True, exist_ok=True)

    def one(py_abi: tuple[str, str]) -> BuiltWheel:
        py, abi = py_abi
        tag = f"{py}-{abi}-{options.platform_tag}"
        sbom = build_sbom(name=meta.name, version=version, manifest=manifest, wheel_tag=tag, epoch=epoch)
        entries = [*common, Entry(f"{dist_info}/WHEEL", render_wheel_file([tag])),
                   Entry(f"{dist_info}/sboms/{SBOM_NAME}", render(sbom))]
        path = options.out_dir / f"{meta.dist_name}-{version}-{tag}.whl"
        started = time.monotonic()
        write_wheel(path, entries, dist_info, epoch)
        log.info("[%s] %s (%.1f MB, %.1f s)", config.name, path.name, path.stat().st_size / 1e6,
                 time.monotonic() - started)
        return BuiltWheel(path=path, config=config.name, variant=config.variant, name=meta.name,
                          version=version, python_tag=py, abi_tag=abi, platform_tag=options.platform_tag,
                          sha256=sha256_file(path), size=path.stat().st_size, native_key=manifest.key,
                          epoch=epoch, requires_python=meta.requires_python)

    tags = options.tags()
    with ThreadPoolExecutor(max_workers=options.jobs or min(len(tags), 8)) as pool:
        return list(pool.map(one, tags))  # zlib releases the GIL: threads compress in parallel


def save_record(out_dir: Path, key: str, wheels: Sequence[BuiltWheel]) -> Path:
    path = out_dir / RECORD_FILE
    write_json_atomic(path, {"schema_version": 1, "key": key, "wheels": [w.to_json() for w in wheels]})
    return path


def load_record(out_dir: Path) -> tuple[str, list[BuiltWheel]]:
    """The wheels a previous run recorded in ``out_dir`` (key, wheels); raises if there is no record."""
    path = out_dir / RECORD_FILE
    data = read_json(path, missing=f"{path} is missing: run `nox -s wheels -- <config>` first",
                     invalid=WheelBuildError)
    return str(data.get("key", "")), [BuiltWheel.from_json(w, out_dir) for w in data["wheels"]]


def reusable(out_dir: Path, key: str) -> list[BuiltWheel] | None:
    """The recorded wheels if they were built from the same inputs and are intact on disk."""
    try:
        old_key, wheels = load_record(out_dir)
    except (MissingInputError, WheelBuildError, KeyError, TypeError):
        return None
    if old_key != key or not wheels:
        return None
    for w in wheels:
        if not w.path.is_file() or w.path.stat().st_size != w.size or sha256_file(w.path) != w.sha256:
            return None
    return wheels


def clean_stale(out_dir: Path, keep: Sequence[BuiltWheel]) -> None:
    """Remove wheels of earlier runs from ``out_dir`` so that later steps see exactly this set."""
    names = {w.path.name for w in keep}
    for p in out_dir.glob("*.whl"):
        if p.name not in names:
            p.unlink()


def expected_version(config: BuildConfig, repo: Path = REPO_ROOT) -> str:
    """The version every wheel of ``config`` must carry (the package version + the local variant)."""
    return wheel_version(read_project(repo), config)
