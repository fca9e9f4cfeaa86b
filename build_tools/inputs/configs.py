"""The build matrix (``manifests/configs.toml``): frozen, validated build configurations.

Each ``[[config]]`` table is resolved (``extends`` merged in) and checked strictly: an unknown
key, a bad value or a duplicate name is a :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import platform
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..common.paths import CONFIGS_FILE
from ..errors import ConfigError, MissingInputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

SCHEMA_VERSION = 1
_NAME = re.compile(r"^[a-z0-9][a-z0-9.\-]*$")
_LOCAL = re.compile(r"^[a-z0-9]+(\.[a-z0-9]+)*$")
_CUDA_ARCH = re.compile(r"^[0-9]{2,3}[af]?(-real|-virtual)?$")
_CMAKE_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]*==[0-9][A-Za-z0-9.+!\-]*$")

CpuVariants = Literal["all", "single"]
_CPU_VARIANTS = ("all", "single")
Backend = Literal["cpu", "cuda", "vulkan", "metal"]
_BACKENDS = ("cpu", "cuda", "vulkan", "metal")
# Where a configuration that is not cross-built from Linux is built and runs: (system, machine),
# as platform.system() and the normalised platform.machine() name them. None: Linux, this machine.
PLATFORMS: dict[str, tuple[str, str]] = {"windows-x86_64": ("Windows", "x86_64"), "macos-arm64": ("Darwin", "arm64")}

# Variables the recipe owns: a configuration may not override them through ``cmake``.
RESERVED_CMAKE = frozenset(
    {
        "BUILD_SHARED_LIBS", "CMAKE_BUILD_TYPE", "CMAKE_INSTALL_RPATH", "CMAKE_BUILD_WITH_INSTALL_RPATH",
        "GGML_BACKEND_DL", "GGML_NATIVE", "GGML_CPU_ALL_VARIANTS", "GGML_CUDA", "LLAMA_BUILD_NUMBER",
        "LLAMA_BUILD_COMMIT", "CMAKE_CUDA_ARCHITECTURES", "CMAKE_CUDA_COMPILER", "CUDAToolkit_ROOT",
        "GGML_VULKAN", "Vulkan_GLSLC_EXECUTABLE", "CMAKE_TOOLCHAIN_FILE", "CMAKE_SYSTEM_NAME",
        "CMAKE_SYSTEM_PROCESSOR", "GGML_METAL", "GGML_METAL_EMBED_LIBRARY", "CMAKE_OSX_DEPLOYMENT_TARGET",
        "CMAKE_OSX_ARCHITECTURES",
    }
)


@dataclass(frozen=True)
class CudaSpec:
    """How a CUDA configuration gets its toolkit and what it compiles for."""

    version: str
    architectures: tuple[str, ...]
    toolkit: Literal["pypi", "system"] = "pypi"
    packages: tuple[str, ...] = ()
    runtime_requires: tuple[str, ...] = ()
    fa_quants: str | None = None
    no_vmm: bool = False

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "architectures": list(self.architectures),
            "toolkit": self.toolkit,
            "packages": list(self.packages),
            "runtime_requires": list(self.runtime_requires),
            "fa_quants": self.fa_quants,
            "no_vmm": self.no_vmm,
        }


@dataclass(frozen=True)
class VulkanSpec:
    """Where a Vulkan configuration's build pieces (headers, loader to link, ``glslc``) come from:
    the system package manager's packages, by manager (their versions enter the content key).
    Nothing of it is shipped: ``libvulkan.so.1`` and the drivers come from the user's system."""

    apt: tuple[str, ...] = ()
    dnf: tuple[str, ...] = ()
    smoke_apt: tuple[str, ...] = ()  # a software Vulkan device for the smoke tests (not in the key)
    smoke_dnf: tuple[str, ...] = ()
    headers_deb: str | None = None  # a Debian pool path: newer Vulkan headers than the distribution's
    headers_sha256: str | None = None

    def packages(self, manager: str, *, smoke: bool = False) -> tuple[str, ...]:
        return getattr(self, f"smoke_{manager}" if smoke else manager, ())

    def to_json(self) -> dict[str, Any]:
        return {"apt": list(self.apt), "dnf": list(self.dnf), "smoke_apt": list(self.smoke_apt),
                "smoke_dnf": list(self.smoke_dnf), "headers_deb": self.headers_deb,
                "headers_sha256": self.headers_sha256}


@dataclass(frozen=True)
class CrossSpec:
    """A cross-compiled configuration's target and the packages of its compiler (their versions
    enter the content key). The CMake toolchain file is generated from it by the native stage."""

    triple: str  # the GNU target triple, also the compilers' prefix: ``aarch64-linux-gnu-gcc``
    system_processor: str  # CMAKE_SYSTEM_PROCESSOR: what ggml's architecture detection reads
    system_name: str = "Linux"
    apt: tuple[str, ...] = ()
    dnf: tuple[str, ...] = ()
    # "gcc": the triple-prefixed GNU compilers; "clang-N": one clang driven with --target=<triple>,
    # linking against the GNU cross toolchain's sysroot and libstdc++ (newer -march than its GCC);
    # "gcc-posix" / "gcc-win32": MinGW-w64's GCC of that thread model (std::thread and std::mutex
    # need posix with GCC 12), named explicitly rather than through Debian's alternatives.
    compiler: str = "gcc"

    @property
    def uses_clang(self) -> bool:
        return self.compiler.startswith("clang")

    def packages(self, manager: str) -> tuple[str, ...]:
        return getattr(self, manager, ())

    def is_native(self, machine: str | None = None, system: str | None = None) -> bool:
        """True on a machine of the target itself (an arm64 CI runner): it builds with its own compiler."""
        machine = (machine or platform.machine()).lower().replace("arm64", "aarch64").replace("amd64", "x86_64")
        return machine == self.system_processor and (system or platform.system()) == self.system_name

    def to_json(self) -> dict[str, Any]:
        return {"triple": self.triple, "system_processor": self.system_processor,
                "system_name": self.system_name, "apt": list(self.apt), "dnf": list(self.dnf),
                **({"compiler": self.compiler} if self.compiler != "gcc" else {})}


@dataclass(frozen=True)
class BuildConfig:
    """One native build configuration, fully resolved."""

    name: str
    backend: Backend
    variant: str
    description: str
    cpu_variants: CpuVariants = "all"
    local_version: str | None = None
    cmake: tuple[tuple[str, str], ...] = ()
    wheel_size_budget_mb: float = 50.0
    cuda: CudaSpec | None = None
    release: bool = True
    vulkan: VulkanSpec | None = None
    cross: CrossSpec | None = None
    platform: str | None = None  # a key of PLATFORMS: built natively there (None: Linux)
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def target(self) -> tuple[str, str]:
        """(system, machine) the libraries are built for: the cross target, the platform, else Linux x86-64."""
        if self.cross is not None:
            return self.cross.system_name, self.cross.system_processor
        if self.platform is not None:
            return PLATFORMS[self.platform]
        return "Linux", "x86_64"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "backend": self.backend,
            "variant": self.variant,
            "description": self.description,
            "cpu_variants": self.cpu_variants,
            "local_version": self.local_version,
            "cmake": dict(self.cmake),
            "wheel_size_budget_mb": self.wheel_size_budget_mb,
            "cuda": self.cuda.to_json() if self.cuda else None,
            "release": self.release,
            **({"vulkan": self.vulkan.to_json()} if self.vulkan else {}),
            **({"cross": self.cross.to_json()} if self.cross else {}),
            **({"platform": self.platform} if self.platform else {}),
        }


@dataclass(frozen=True)
class BuildMatrix:
    configs: dict[str, BuildConfig]
    default: str
    path: Path = CONFIGS_FILE

    def get(self, name: str) -> BuildConfig:
        try:
            return self.configs[name]
        except KeyError:
            raise ConfigError(
                f"unknown configuration {name!r}; {self.path} defines {sorted(self.configs)}"
            ) from None

    def names(self) -> list[str]:
        return list(self.configs)


_TOP_KEYS = {"schema_version", "default", "config"}
_CONFIG_KEYS = {
    "name", "extends", "backend", "variant", "description", "cpu_variants", "local_version",
    "cmake", "wheel_size_budget_mb", "cuda", "release", "vulkan", "cross", "platform",
}
_CROSS_KEYS = {"triple", "system_processor", "system_name", "apt", "dnf", "compiler"}
_CROSS_COMPILER = re.compile(r"^(gcc(-posix|-win32)?|clang(-[0-9]{1,3})?)$")
_TRIPLE = re.compile(r"^[a-z0-9_]+(-[a-z0-9_]+){1,3}$")
# CMAKE_SYSTEM_PROCESSOR values a cross build may name (what ggml's CMake recognises per family).
_PROCESSORS = ("aarch64", "x86_64")
_SYSTEMS = ("Linux", "Windows")
_VULKAN_KEYS = {"apt", "dnf", "smoke_apt", "smoke_dnf", "headers_deb", "headers_sha256"}
_DEB_NAME = re.compile(r"^[a-z0-9][a-z0-9.+\-]*$")
_CUDA_KEYS = {"version", "architectures", "toolkit", "packages", "runtime_requires", "fa_quants", "no_vmm"}


def _check_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key {key!r} (allowed: {', '.join(sorted(allowed))})")


def _typed(table: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
    if key not in table:
        if default is ...:
            raise ConfigError(f"{where}: missing required key {key!r}")
        return default
    value = table[key]
    ok = isinstance(value, typ) and not (isinstance(value, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,)))
    if not ok:
        names = "/".join(t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)))
        raise ConfigError(f"{where}.{key}: expected {names}, got {value!r}")
    return value


def _str_list(table: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = _typed(table, key, list, where, [])
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise ConfigError(f"{where}.{key}[{i}]: expected a non-empty string, got {item!r}")
    return tuple(value)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _parse_cuda(raw: Any, where: str) -> CudaSpec:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a table")
    _check_keys(raw, _CUDA_KEYS, where)
    version = _typed(raw, "version", str, where)
    if not re.match(r"^[0-9]+\.[0-9]+$", version):
        raise ConfigError(f"{where}.version: {version!r} is not MAJOR.MINOR")
    archs = _str_list(raw, "architectures", where)
    if not archs:
        raise ConfigError(f"{where}.architectures: at least one architecture is required")
    for i, arch in enumerate(archs):
        if not _CUDA_ARCH.match(arch):
            raise ConfigError(f"{where}.architectures[{i}]: {arch!r} is not like '90-real' or '120-virtual'")
    toolkit = _typed(raw, "toolkit", str, where, "pypi")
    if toolkit not in ("pypi", "system"):
        raise ConfigError(f"{where}.toolkit: {toolkit!r} is not 'pypi' or 'system'")
    packages = _str_list(raw, "packages", where)
    for i, pin in enumerate(packages):
        if not _PIN.match(pin):
            raise ConfigError(f"{where}.packages[{i}]: {pin!r} is not an exact pin 'name==version'")
    if toolkit == "pypi" and not packages:
        raise ConfigError(f"{where}.packages: a 'pypi' toolkit needs its pinned wheels")
    fa = _typed(raw, "fa_quants", str, where, None)
    return CudaSpec(
        version=version,
        architectures=archs,
        toolkit=toolkit,  # type: ignore[arg-type]
        packages=packages,
        runtime_requires=_str_list(raw, "runtime_requires", where),
        fa_quants=fa,
        no_vmm=_typed(raw, "no_vmm", bool, where, False),
    )


def _package_lists(raw: dict[str, Any], where: str, keys: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """System package lists of a table, each name checked."""
    lists = {}
    for key in keys:
        items = _typed(raw, key, list, where, [])
        for item in items:
            if not isinstance(item, str) or not _DEB_NAME.match(item):
                raise ConfigError(f"{where}.{key}: {item!r} is not a package name")
        lists[key] = tuple(items)
    return lists


def _parse_vulkan(raw: Any, where: str) -> VulkanSpec:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a table")
    _check_keys(raw, _VULKAN_KEYS, where)
    lists = _package_lists(raw, where, ("apt", "dnf", "smoke_apt", "smoke_dnf"))
    if not (lists["apt"] or lists["dnf"]):
        raise ConfigError(f"{where}: name the packages that provide glslc and the Vulkan headers (apt or dnf)")
    deb = _typed(raw, "headers_deb", str, where, None)
    sha = _typed(raw, "headers_sha256", str, where, None)
    if (deb is None) != (sha is None):
        raise ConfigError(f"{where}: headers_deb and headers_sha256 go together")
    if deb is not None and not re.match(r"^pool/[a-z0-9/._+~-]+\.deb$", deb):
        raise ConfigError(f"{where}.headers_deb: {deb!r} is not a Debian pool path (pool/main/.../x.deb)")
    if sha is not None and not re.match(r"^[0-9a-f]{64}$", sha):
        raise ConfigError(f"{where}.headers_sha256: {sha!r} is not a sha256")
    return VulkanSpec(**lists, headers_deb=deb, headers_sha256=sha)


def _parse_cross(raw: Any, where: str) -> CrossSpec:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a table")
    _check_keys(raw, _CROSS_KEYS, where)
    triple = _typed(raw, "triple", str, where)
    if not _TRIPLE.match(triple):
        raise ConfigError(f"{where}.triple: {triple!r} is not a GNU target triple like 'aarch64-linux-gnu'")
    processor = _typed(raw, "system_processor", str, where)
    if processor not in _PROCESSORS:
        raise ConfigError(f"{where}.system_processor: {processor!r} is not one of {_PROCESSORS}")
    system = _typed(raw, "system_name", str, where, "Linux")
    if system not in _SYSTEMS:
        raise ConfigError(f"{where}.system_name: {system!r} is not one of {_SYSTEMS}")
    compiler = _typed(raw, "compiler", str, where, "gcc")
    if not _CROSS_COMPILER.match(compiler):
        raise ConfigError(f"{where}.compiler: {compiler!r} is not 'gcc', 'clang' or 'clang-N' (e.g. 'clang-19'), "
                          "or MinGW-w64's 'gcc-posix' / 'gcc-win32'")
    if compiler.startswith("gcc-") and system != "Windows":
        raise ConfigError(f"{where}.compiler: {compiler!r} names a MinGW-w64 thread model; it needs "
                          "system_name = \"Windows\" (use 'gcc' for Linux targets)")
    lists = _package_lists(raw, where, ("apt", "dnf"))
    if not (lists["apt"] or lists["dnf"]):
        raise ConfigError(f"{where}: name the packages that provide {triple}-gcc and {triple}-g++ (apt or dnf)")
    return CrossSpec(triple=triple, system_processor=processor, system_name=system, compiler=compiler, **lists)


def _parse_config(raw: dict[str, Any], where: str) -> BuildConfig:
    _check_keys(raw, _CONFIG_KEYS - {"extends"}, where)
    name = _typed(raw, "name", str, where)
    backend = _typed(raw, "backend", str, where)
    if backend not in _BACKENDS:
        raise ConfigError(f"{where}.backend: {backend!r} is not one of {_BACKENDS}")
    variant = _typed(raw, "variant", str, where)
    if not _LOCAL.match(variant):
        raise ConfigError(f"{where}.variant: {variant!r} must be lowercase letters and digits")
    cpu_variants = _typed(raw, "cpu_variants", str, where, "all")
    if cpu_variants not in _CPU_VARIANTS:
        raise ConfigError(f"{where}.cpu_variants: {cpu_variants!r} is not one of {_CPU_VARIANTS}")
    local = _typed(raw, "local_version", str, where, None)
    if local is not None and not _LOCAL.match(local):
        raise ConfigError(f"{where}.local_version: {local!r} is not a valid local version label")
    cmake_raw = _typed(raw, "cmake", dict, where, {})
    cmake: list[tuple[str, str]] = []
    for var, value in sorted(cmake_raw.items()):
        if not _CMAKE_VAR.match(var):
            raise ConfigError(f"{where}.cmake: {var!r} is not a CMake variable name")
        if var in RESERVED_CMAKE:
            raise ConfigError(f"{where}.cmake.{var}: set by the recipe from the configuration; remove it")
        if isinstance(value, bool):
            value = "ON" if value else "OFF"
        elif isinstance(value, (int, float, str)):
            value = str(value)
        else:
            raise ConfigError(f"{where}.cmake.{var}: expected a string, number or boolean, got {value!r}")
        cmake.append((var, value))
    budget = _typed(raw, "wheel_size_budget_mb", (int, float), where, 50.0)
    if budget <= 0:
        raise ConfigError(f"{where}.wheel_size_budget_mb: must be positive, got {budget}")
    if backend == "cuda" and "cuda" not in raw:
        raise ConfigError(f"{where}: backend 'cuda' needs a [config.cuda] table")
    if backend != "cuda" and "cuda" in raw:
        raise ConfigError(f"{where}.cuda: only allowed with backend = 'cuda'")
    if backend == "vulkan" and "vulkan" not in raw:
        raise ConfigError(f"{where}: backend 'vulkan' needs a [config.vulkan] table (the packages of its toolchain)")
    if backend != "vulkan" and "vulkan" in raw:
        raise ConfigError(f"{where}.vulkan: only allowed with backend = 'vulkan'")
    cuda = _parse_cuda(raw["cuda"], f"{where}.cuda") if "cuda" in raw else None
    vulkan = _parse_vulkan(raw["vulkan"], f"{where}.vulkan") if "vulkan" in raw else None
    cross = _parse_cross(raw["cross"], f"{where}.cross") if "cross" in raw else None
    if cross is not None and backend == "cuda":
        raise ConfigError(f"{where}.cross: a CUDA build is not cross-compiled; build it on its own platform")
    platform_name = _parse_platform(raw, where, backend, cross)
    return BuildConfig(
        name=name,
        backend=backend,  # type: ignore[arg-type]
        variant=variant,
        description=_typed(raw, "description", str, where, ""),
        cpu_variants=cpu_variants,  # type: ignore[arg-type]
        local_version=local,
        cmake=tuple(cmake),
        wheel_size_budget_mb=float(budget),
        cuda=cuda,
        release=_typed(raw, "release", bool, where, True),
        vulkan=vulkan,
        cross=cross,
        platform=platform_name,
    )


def _parse_platform(raw: dict[str, Any], where: str, backend: str, cross: CrossSpec | None) -> str | None:
    """``platform``: where a native (not cross) build runs; Metal exists only on macOS, and the
    Vulkan and cross toolchains come from Linux package managers."""
    name = _typed(raw, "platform", str, where, None)
    if name is not None and name not in PLATFORMS:
        raise ConfigError(f"{where}.platform: {name!r} is not one of {tuple(PLATFORMS)} "
                          "(omit it for Linux; a cross build names its target in [config.cross])")
    if name is not None and cross is not None:
        raise ConfigError(f"{where}.platform: a cross build names its target in [config.cross]; remove one of them")
    system = PLATFORMS[name][0] if name else "Linux"
    if backend == "metal" and system != "Darwin":
        raise ConfigError(f"{where}.backend: 'metal' needs platform = \"macos-arm64\" (Metal exists only on macOS)")
    if system == "Darwin" and backend != "metal":
        raise ConfigError(f"{where}.backend: a macOS configuration is backend = 'metal' (the Metal backend "
                          "serves the GPU and the CPU variants beside it)")
    if backend == "vulkan" and system != "Linux":
        raise ConfigError(f"{where}.platform: the Vulkan toolchain is provisioned on Linux only; drop platform")
    return name


def parse_matrix(data: dict[str, Any], path: Path = CONFIGS_FILE) -> BuildMatrix:
    where = path.name
    _check_keys(data, _TOP_KEYS, where)
    schema = _typed(data, "schema_version", int, where)
    if schema != SCHEMA_VERSION:
        raise ConfigError(f"{where}.schema_version: {schema} is not supported (expected {SCHEMA_VERSION})")
    tables = _typed(data, "config", list, where)
    raw_by_name: dict[str, dict[str, Any]] = {}
    for i, table in enumerate(tables):
        w = f"{where}: config[{i}]"
        if not isinstance(table, dict):
            raise ConfigError(f"{w}: expected a table")
        name = _typed(table, "name", str, w)
        if not _NAME.match(name):
            raise ConfigError(f"{w}.name: {name!r} must be lowercase letters, digits, '.' and '-'")
        if name in raw_by_name:
            raise ConfigError(f"{w}.name: duplicate configuration name {name!r}")
        _check_keys(table, _CONFIG_KEYS, f"{where}: config {name!r}")
        raw_by_name[name] = table

    def resolve(name: str, chain: tuple[str, ...]) -> dict[str, Any]:
        table = raw_by_name[name]
        parent = table.get("extends")
        if parent is None:
            return table
        if not isinstance(parent, str) or parent not in raw_by_name:
            raise ConfigError(f"{where}: config {name!r}.extends: {parent!r} is not a defined configuration")
        if parent in chain:
            raise ConfigError(f"{where}: config {name!r}.extends: cycle {' -> '.join(chain + (parent,))}")
        merged = _merge(resolve(parent, chain + (parent,)), {k: v for k, v in table.items() if k != "extends"})
        merged.pop("extends", None)
        return merged

    configs = {
        name: _parse_config(resolve(name, (name,)), f"{where}: config {name!r}") for name in raw_by_name
    }
    default = _typed(data, "default", str, where, next(iter(configs), ""))
    if default not in configs:
        raise ConfigError(f"{where}.default: {default!r} is not a defined configuration")
    return BuildMatrix(configs=configs, default=default, path=path)


def load_matrix(path: Path = CONFIGS_FILE) -> BuildMatrix:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise MissingInputError(f"build matrix not found: {path}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML ({exc})") from None
    return parse_matrix(data, path)
