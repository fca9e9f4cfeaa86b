"""Find and load the native libraries, load the compute backends, and say what happened.

The libraries live in the package (``llama_cpp/lib/``) unless ``LLAMA_CPP_LIB_PATH`` names another
directory; the current directory is never searched. Loading happens once, on first use, under a
lock:

1. when a CUDA backend file is present, preload the CUDA runtime from NVIDIA's wheels
   (``llama_cpp._native.cuda_runtime.preload()``, if that module exists);
2. load ``ggml-base``, ``ggml``, ``llama`` (and ``mtmd`` when present) by absolute path and route
   their logs into :mod:`logging` (:mod:`llama_cpp._native.log_routing`);
3. probe every backend file (``libggml-<name>[-<variant>].so``) with ``dlopen`` to capture the
   loader's error (e.g. ``libcuda.so.1: cannot open shared object file``), pick the best-scoring
   variant per backend like ggml does, and register it with ``ggml_backend_load``;
4. probe the backend modules of installed plugin wheels the same way, after the core wheel's own
   (:mod:`llama_cpp._native.plugins`: the ``llama_cpp.backends`` entry points);
5. ``llama_backend_init()``.

:func:`backends` reports, per backend file, whether it loaded and why not, and which plugin it came from.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import sys
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .._errors import BackendUnavailableError, LibraryLoadError, LibraryNotFoundError
from ..ggml_cpp import (
    GGML_BACKEND_DEVICE_TYPE_ACCEL,
    GGML_BACKEND_DEVICE_TYPE_CPU,
    GGML_BACKEND_DEVICE_TYPE_GPU,
    GGML_BACKEND_DEVICE_TYPE_IGPU,
    GGML_BACKEND_DEVICE_TYPE_META,
)
from . import cuda_runtime
from . import dll_search as _dll_search
from . import plugins as _plugins
from .sites import ENV_LIB_PATH, PACKAGE_LIB_DIR

log = logging.getLogger("llama_cpp")

ENV_REQUIRE_GPU = "LLAMA_CPP_REQUIRE_GPU"

_CORE = ("ggml_base", "ggml", "llama", "mtmd")  # load order; mtmd optional
_FILE_STEMS = {"ggml_base": "ggml-base", "ggml": "ggml", "llama": "llama", "mtmd": "mtmd"}
_DISPLAY = {
    "cpu": "CPU", "cuda": "CUDA", "hip": "HIP", "musa": "MUSA", "vulkan": "Vulkan", "metal": "Metal",
    "blas": "BLAS", "sycl": "SYCL", "rpc": "RPC", "opencl": "OpenCL", "cann": "CANN", "zendnn": "ZenDNN",
    "hexagon": "Hexagon", "virtgpu": "VirtGPU", "openvino": "OpenVINO",
}
_DEV_TYPES = {GGML_BACKEND_DEVICE_TYPE_CPU: "CPU", GGML_BACKEND_DEVICE_TYPE_GPU: "GPU",
              GGML_BACKEND_DEVICE_TYPE_IGPU: "IGPU", GGML_BACKEND_DEVICE_TYPE_ACCEL: "ACCEL",
              GGML_BACKEND_DEVICE_TYPE_META: "META"}
@dataclass(frozen=True)
class DeviceInfo:
    """A device of a loaded backend (``ggml_backend_dev_*``)."""

    name: str
    description: str
    type: str  # CPU, GPU, IGPU, ACCEL, META
    memory_free: int
    memory_total: int

    @property
    def memory(self) -> int:
        return self.memory_total


@dataclass(frozen=True)
class BackendStatus:
    """One backend file (or built-in backend) and whether it is serving."""

    name: str
    path: Path | None
    loaded: bool
    reason: str | None = None
    devices: list[DeviceInfo] = field(default_factory=list)
    plugin: str | None = None  # the plugin wheel it came from (``llama-cpp-python-vulkan``), None for the core's


@dataclass
class Libraries:
    """The loaded core libraries (ctypes handles) and what :func:`load` found."""

    lib_dir: Path
    llama: ctypes.CDLL
    ggml: ctypes.CDLL
    ggml_base: ctypes.CDLL
    mtmd: ctypes.CDLL | None
    paths: dict[str, Path]
    backends: list[BackendStatus]


_lock = threading.RLock()
_state: Libraries | None = None
_dll_dirs: list[Any] = []  # os.add_dll_directory handles (Windows), kept alive
_search_dirs: list[Path] = []  # the folders our DLLs' dependencies resolve from (Windows)


def lib_dir() -> Path:
    """The directory the libraries are loaded from: ``$LLAMA_CPP_LIB_PATH`` or the package's ``lib/``."""
    override = os.environ.get(ENV_LIB_PATH)
    if override:
        p = Path(override).expanduser()
        if not p.is_dir():
            raise LibraryNotFoundError(
                f"{ENV_LIB_PATH}={override!r} is not a directory: point it at the directory holding "
                "libllama/libggml, or unset it to use the libraries inside the package"
            )
        return p.resolve()
    return PACKAGE_LIB_DIR


def _platform_names(stem: str) -> list[str]:
    if sys.platform == "win32":
        return [f"{stem}.dll", f"lib{stem}.dll"]
    if sys.platform == "darwin":
        return [f"lib{stem}.dylib", f"lib{stem}.0.dylib"]
    return [f"lib{stem}.so", f"lib{stem}.so.0"]


def _find_core(directory: Path, key: str) -> Path | None:
    stem = _FILE_STEMS[key]
    for name in _platform_names(stem):
        if (directory / name).is_file():
            return directory / name
    if sys.platform not in ("win32", "darwin"):
        versioned = sorted(directory.glob(f"lib{stem}.so.*"), key=lambda p: (len(p.name), p.name))
        if versioned:
            return versioned[0]
    return None


def _backend_files(directory: Path) -> list[Path]:
    if sys.platform == "win32":
        prefix, ext = "ggml-", ".dll"
    else:
        prefix, ext = "libggml-", ".so"
    out = []
    for p in sorted(directory.iterdir()):
        n = p.name
        if n.startswith(prefix) and n.endswith(ext) and not n.startswith(prefix + "base") and p.is_file():
            out.append(p)
    return out


def _family(path: Path) -> tuple[str, str]:
    """``libggml-cpu-haswell.so`` -> (``cpu``, ``haswell``); ``libggml-cuda.so`` -> (``cuda``, ``""``)."""
    stem = path.name.split(".")[0]
    stem = stem[len("libggml-"):] if stem.startswith("libggml-") else stem[len("ggml-"):]
    fam, _, variant = stem.partition("-")
    return fam, variant


def explain_dlerror(message: str, path: Path | None = None) -> str:
    """Turn a loader error into the missing dependency (with a hint) when it names one; on Windows,
    whose error names none, the dependency is found from ``path``'s import table."""
    return _dll_search.explain_load_error(message, path, search=_search_dirs or ([path.parent] if path else []))


def _dlopen(path: Path) -> tuple[ctypes.CDLL | None, str | None]:
    try:
        return ctypes.CDLL(str(path)), None
    except OSError as exc:
        return None, str(exc)


def _cdll_handle_and_name(handle: ctypes.CDLL) -> tuple[int, str]:
    """The OS handle (``dlopen``/``LoadLibrary``) of a loaded library and the name it was opened with.

    These are ctypes' own ``CDLL._handle`` and ``CDLL._name``: ctypes has no public accessor for either."""
    return handle._handle, handle._name


def _dlclose(handle: ctypes.CDLL) -> None:
    try:
        import _ctypes

        native, _ = _cdll_handle_and_name(handle)
        if sys.platform == "win32":
            _ctypes.FreeLibrary(native)  # type: ignore[attr-defined]
        else:
            _ctypes.dlclose(native)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001, S110 - closing is an optimisation only
        pass


def _has_cuda_backend(directory: Path) -> bool:
    return any(p.name.startswith(("libggml-cuda", "ggml-cuda")) for p in directory.iterdir())


def _preload_cuda_runtime(directory: Path) -> None:
    if sys.platform in ("win32", "darwin"):
        return  # Windows: the DLL directories below; macOS has no CUDA
    backend = next((p for p in sorted(directory.iterdir()) if p.name.startswith(("libggml-cuda", "ggml-cuda"))),
                   None)
    if backend is None:
        return
    try:
        cuda_runtime.preload(backend=backend)
    except Exception as exc:  # noqa: BLE001 - the backend probe below reports what is then missing
        log.warning("CUDA runtime preload failed: %s", exc)


def _load_core(directory: Path) -> tuple[dict[str, ctypes.CDLL | None], dict[str, Path]]:
    handles: dict[str, ctypes.CDLL | None] = {}
    paths: dict[str, Path] = {}
    for key in _CORE:
        path = _find_core(directory, key)
        if path is None:
            if key == "mtmd":
                handles[key] = None
                continue
            tried = ", ".join(_platform_names(_FILE_STEMS[key]))
            raise LibraryNotFoundError(
                f"{_FILE_STEMS[key]} library not found in {directory} (looked for {tried}): reinstall "
                f"llama-cpp-python, or set {ENV_LIB_PATH} to the lib directory of a llama.cpp build"
            )
        try:
            handles[key] = ctypes.CDLL(str(path))
        except OSError as exc:
            raise LibraryLoadError(
                f"cannot load {path}: {explain_dlerror(str(exc), path)}. The file exists but the dynamic loader "
                "refused it: install the missing dependency, or reinstall a wheel built for this platform"
            ) from exc
        paths[key] = path
    return handles, paths


#: one symbol per core library that every build of the pinned llama.cpp exports
_PROBE_SYMBOLS = {"ggml_base": "ggml_time_init", "ggml": "ggml_backend_load", "llama": "llama_log_set"}


def _check_exports(handles: dict[str, ctypes.CDLL | None]) -> None:
    """Refuse a foreign library (say ``libllama.so`` from another project) before the first call."""
    for key, symbol in _PROBE_SYMBOLS.items():
        handle = handles[key]
        if handle is not None:
            _fn(handle, symbol, [], None)


def _fn(handle: ctypes.CDLL, name: str, argtypes: list[Any], restype: Any) -> Any:
    try:
        f = getattr(handle, name)
    except AttributeError:
        _, lib = _cdll_handle_and_name(handle)
        raise LibraryLoadError(
            f"{lib} does not export {name}: it is not a llama.cpp/ggml build that matches these "
            f"bindings (a foreign or older library?). Point {ENV_LIB_PATH} at the lib directory of a "
            "matching build, or unset it to use the bundled libraries") from None
    f.argtypes = argtypes
    f.restype = restype
    return f


def _devices(ggml: ctypes.CDLL, reg: int) -> list[DeviceInfo]:
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    count = _fn(ggml, "ggml_backend_reg_dev_count", [vp], sz)(reg)
    get = _fn(ggml, "ggml_backend_reg_dev_get", [vp, sz], vp)
    name = _fn(ggml, "ggml_backend_dev_name", [vp], ctypes.c_char_p)
    desc = _fn(ggml, "ggml_backend_dev_description", [vp], ctypes.c_char_p)
    dtype = _fn(ggml, "ggml_backend_dev_type", [vp], ctypes.c_int)
    memory = _fn(ggml, "ggml_backend_dev_memory", [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], None)
    out = []
    for i in range(count):
        dev = get(reg, i)
        free, total = sz(0), sz(0)
        memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(DeviceInfo(
            name=(name(dev) or b"").decode("utf-8", "replace"),
            description=(desc(dev) or b"").decode("utf-8", "replace"),
            type=_DEV_TYPES.get(dtype(dev), str(dtype(dev))),
            memory_free=free.value,
            memory_total=total.value,
        ))
    return out


def _load_backends(directory: Path, ggml: ctypes.CDLL,
                   plugins: list[_plugins.Plugin] | tuple[()] = ()) -> list[BackendStatus]:
    vp = ctypes.c_void_p
    backend_load = _fn(ggml, "ggml_backend_load", [ctypes.c_char_p], vp)
    reg_name = _fn(ggml, "ggml_backend_reg_name", [vp], ctypes.c_char_p)
    reg_count = _fn(ggml, "ggml_backend_reg_count", [], ctypes.c_size_t)
    reg_get = _fn(ggml, "ggml_backend_reg_get", [ctypes.c_size_t], vp)

    # probe: dlopen each file, note errors and scores
    probes: dict[Path, tuple[ctypes.CDLL | None, str | None, int]] = {}
    origin: dict[Path, str] = {}  # plugin modules, after the core's own backends
    files = _backend_files(directory)
    for plugin in plugins:
        if plugin.lib_dir is not None:
            for path in _backend_files(plugin.lib_dir):
                files.append(path)
                origin[path] = plugin.name
    for path in files:
        handle, err = _dlopen(path)
        score = 0
        if handle is not None:
            try:
                score_fn = _fn(handle, "ggml_backend_score", [], ctypes.c_int)
            except LibraryLoadError:
                score = 1  # backends without a score function are always eligible
            else:
                score = int(score_fn())
        probes[path] = (handle, err, score)

    families: dict[str, list[Path]] = {}
    for path in probes:
        families.setdefault(_family(path)[0], []).append(path)

    statuses: list[BackendStatus] = [
        BackendStatus(_DISPLAY.get(p.family, p.family), None, False, p.problem, plugin=p.name)
        for p in plugins if p.problem is not None]
    from_files: set[int] = set()
    for fam, paths in families.items():
        display = _DISPLAY.get(fam, fam)
        ok = [p for p in paths if probes[p][0] is not None and probes[p][2] > 0]
        best = max(ok, key=lambda p: probes[p][2]) if ok else None
        for path in paths:
            handle, err, score = probes[path]
            if err is not None:
                statuses.append(BackendStatus(display, path, False, explain_dlerror(err, path)))
            elif score <= 0:
                statuses.append(BackendStatus(display, path, False, "not supported on this system (score 0)"))
            elif path is not best:
                assert best is not None
                statuses.append(BackendStatus(
                    display, path, False, f"not selected: {best.name} scores higher ({probes[best][2]} > {score})"))
            else:
                reg = backend_load(os.fsencode(str(path)))
                if not reg:
                    statuses.append(BackendStatus(display, path, False, _LOAD_FAILED.get(
                        fam, "ggml_backend_load failed (see the llama_cpp.native log)")))
                else:
                    from_files.add(reg)
                    rname = (reg_name(reg) or display.encode()).decode("utf-8", "replace")
                    statuses.append(loaded_status(fam, rname, path, _devices(ggml, reg)))
        for i, st in enumerate(statuses):
            if st.path in origin and st.plugin is None:
                statuses[i] = replace(st, plugin=origin[st.path])
        for path in paths:
            if probes[path][0] is not None:
                _dlclose(probes[path][0])  # type: ignore[arg-type]

    # backends compiled into libggml (non-DL builds) register themselves
    for i in range(reg_count()):
        reg = reg_get(i)
        if reg and reg not in from_files:
            rname = (reg_name(reg) or b"?").decode("utf-8", "replace")
            statuses.append(BackendStatus(rname, None, True, None, _devices(ggml, reg)))

    for fam, paths in families.items():
        fam_status = [s for s in statuses if s.path in paths]
        if not any(s.loaded for s in fam_status):
            reasons = [s.reason for s in fam_status if s.reason and not s.reason.startswith("not supported")]
            reason = reasons[0] if reasons else (fam_status[0].reason if fam_status else "no file")
            log.warning("%s backend not loaded: %s", _DISPLAY.get(fam, fam), reason)
    return statuses


# Why a backend whose file loaded may still refuse to register, by family.
_LOAD_FAILED = {
    "vulkan": "the Vulkan loader found no driver or device (no ICD: install the GPU's Vulkan driver, e.g. "
              "mesa-vulkan-drivers; see the llama_cpp.native log)",
    "cuda": "the CUDA backend found no usable device (driver too old for this build, or no GPU; see the "
            "llama_cpp.native log)",
}


def loaded_status(family: str, name: str, path: Path | None, devices: list[DeviceInfo]) -> BackendStatus:
    """A registered backend's status: a GPU-style backend with no device is not serving
    (Metal without a Metal device, Vulkan with a loader but no driver)."""
    if family not in ("cpu", "rpc") and not devices:  # RPC devices come with rpc_servers (added later)
        display = _DISPLAY.get(family, name)
        why = f"loaded, but found no {display} device (no driver or no supported GPU on this machine)"
        if family == "vulkan":
            why += ("; ggml-vulkan skips CPU devices such as llvmpipe/lavapipe unless GGML_VK_VISIBLE_DEVICES "
                    "names them (e.g. GGML_VK_VISIBLE_DEVICES=0)")
        return BackendStatus(name, path, False, why)
    return BackendStatus(name, path, True, None, devices)


def _backend_init(handles: dict[str, ctypes.CDLL | None], statuses: list[BackendStatus]) -> None:
    llama, ggml = handles["llama"], handles["ggml"]
    assert llama is not None and ggml is not None
    if any(s.loaded for s in statuses):
        _fn(llama, "llama_backend_init", [], None)()
        return
    # llama_backend_init() would fall back to ggml_backend_load_all(), which searches the current
    # directory: do its other work by hand instead.
    base = handles["ggml_base"]
    assert base is not None
    _fn(base, "ggml_time_init", [], None)()


def _load_locked() -> Libraries:
    global _state
    if _state is not None:
        return _state
    directory = lib_dir()
    if not directory.is_dir():
        raise LibraryNotFoundError(
            f"native library directory {directory} does not exist: the package was installed without its "
            f"libraries (reinstall a binary wheel), or set {ENV_LIB_PATH} to a llama.cpp build's lib directory"
        )
    if sys.platform == "win32":  # dependencies resolve from our lib\ and NVIDIA's wheels, never the cwd
        dirs = _dll_search.dll_directories(directory, cuda=_has_cuda_backend(directory))
        _dll_dirs.extend(_dll_search.add_dll_directories(dirs))
        _search_dirs[:] = dirs
    # ggml's abort handler otherwise attaches gdb/lldb for a backtrace, which hangs when two threads
    # assert at once: an unavoidable abort must end the process.
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    from .._version import __version__

    plugins = _plugins.discover(__version__)
    for d in [directory, *(p.lib_dir for p in plugins if p.lib_dir is not None and p.family == "cuda")]:
        _preload_cuda_runtime(d)
    handles, paths = _load_core(directory)
    _check_exports(handles)
    from . import log_routing as _logging

    _logging.install(handles["llama"], handles["mtmd"])
    statuses = _load_backends(directory, handles["ggml"], plugins)  # type: ignore[arg-type]
    _backend_init(handles, statuses)
    _state = Libraries(directory, handles["llama"], handles["ggml"], handles["ggml_base"],  # type: ignore[arg-type]
                       handles["mtmd"], paths, statuses)
    return _state


def _libraries() -> Libraries:
    st = _state
    if st is not None:
        return st
    with _lock:
        return _load_locked()


def _env_require_gpu() -> bool:
    return os.environ.get(ENV_REQUIRE_GPU, "").strip().lower() in ("1", "true", "yes", "on")


def load() -> Libraries:
    """Load everything once (thread-safe) and return the handles (``.llama``, ``.ggml``, ``.ggml_base``, ``.mtmd``).

    Raises :class:`LibraryNotFoundError`/:class:`LibraryLoadError` naming the path and the fix, and
    :class:`BackendUnavailableError` when no compute backend loaded (or no GPU one while
    ``LLAMA_CPP_REQUIRE_GPU=1``).
    """
    st = _libraries()
    ensure_backends(_env_require_gpu(), _libs=st)
    return st


def library_handle(name: str) -> ctypes.CDLL:
    """The CDLL of ``llama``, ``ggml``, ``ggml_base`` or ``mtmd``; raises if that library is absent."""
    st = load()
    h = getattr(st, name)
    if h is None:
        raise LibraryNotFoundError(
            f"{_FILE_STEMS[name]} library not found in {st.lib_dir}: this installation has no multimodal "
            "support; install a wheel that ships libmtmd"
        )
    return h


def library_path(name: str) -> Path | None:
    st = _state
    return st.paths.get(name) if st is not None else None


def backends() -> list[BackendStatus]:
    """Per backend file: loaded or not, why not, and the devices it serves (loads the libraries);
    then each RPC server added in this process (``rpc_servers=``) with its remote devices."""
    return list(_libraries().backends)


def devices_of(reg: int) -> list[DeviceInfo]:
    """The devices of a backend registry (``ggml_backend_reg_t``), with their memory."""
    return _devices(_libraries().ggml, reg)


def add_backend(status: BackendStatus) -> None:
    """Record a backend registered after loading (an RPC server's remote devices) for :func:`backends`."""
    with _lock:
        _libraries().backends.append(status)


def _gpu_loaded(statuses: list[BackendStatus]) -> bool:
    return any(s.loaded and any(d.type in ("GPU", "IGPU") for d in s.devices) for s in statuses)


def ensure_backends(require_gpu: bool = False, *, _libs: Libraries | None = None) -> None:
    """Raise :class:`BackendUnavailableError` unless a backend (a GPU one, if required) is serving.

    Public as ``llama_cpp.ensure_backends(require_gpu=True)``: call it before loading a model to
    refuse a silent CPU fallback; ``LLAMA_CPP_REQUIRE_GPU=1`` makes the first native call check it.
    """
    statuses = (_libs or _libraries()).backends
    if not any(s.loaded for s in statuses if s.name != "RPC"):  # the RPC module alone computes nothing here
        detail = "; ".join(f"{s.path.name if s.path else s.name}: {s.reason}" for s in statuses) or "no backend files"
        raise BackendUnavailableError(
            f"no compute backend could be loaded from {lib_dir()} ({detail}): reinstall llama-cpp-python "
            "for this platform"
        )
    if (require_gpu or _env_require_gpu()) and not _gpu_loaded(statuses):
        failed = [f"{s.name} backend{f' (plugin {s.plugin})' if s.plugin else ''} not loaded: {s.reason}"
                  for s in statuses if not s.loaded and s.name.upper() != "CPU"]
        if failed:
            detail = "; ".join(failed)
            fix = "install the missing driver/runtime"
        else:
            detail = "this installation has no GPU backend"
            fix = ('install a GPU backend plugin (pip install "llama-cpp-python[cuda13]", [cuda12] or [vulkan]) '
                   "or a GPU wheel variant")
        raise BackendUnavailableError(
            f"a GPU backend is required ({ENV_REQUIRE_GPU}=1 or llama_cpp.ensure_backends(require_gpu=True)) "
            f"but none loaded: {detail}; {fix}, or allow the CPU (unset {ENV_REQUIRE_GPU}, require_gpu=False)"
        )


def system_info() -> str:
    """llama.cpp's ``llama_print_system_info()`` string."""
    f = _fn(load().llama, "llama_print_system_info", [], ctypes.c_char_p)
    return (f() or b"").decode("utf-8", "replace")


_WATCHED = re.compile(r"^(lib)?(llama|ggml|mtmd)|cuda|cublas|nvrtc|nvJitLink|vulkan|gomp", re.IGNORECASE)


def loaded_library_paths() -> dict[str, Path]:
    """Which native files are mapped in this process (basename -> path): ours and the GPU runtimes.

    Read from ``/proc/self/maps`` on Linux; elsewhere, the core libraries :func:`load` opened.
    """
    maps = Path("/proc/self/maps")
    out: dict[str, Path] = {}
    if maps.exists():
        directory = None
        try:
            directory = lib_dir()
        except LibraryNotFoundError:
            pass
        for line in maps.read_text().splitlines():
            parts = line.split(None, 5)
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            p = Path(parts[5].strip())
            if ".so" not in p.name:
                continue
            if _WATCHED.search(p.name) or (directory is not None and p.parent == directory):
                out.setdefault(p.name, p)
        return out
    st = _state
    return {p.name: p for p in st.paths.values()} if st is not None else {}
