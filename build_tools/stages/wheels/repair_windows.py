"""Step 3b for Windows wheels: delvewheel grafts the runtime DLLs the libraries import.

delvewheel reads PE files with pefile and runs on any OS, so the MinGW-w64 cross build is repaired
here as the MSVC build is on a Windows runner. It copies each DLL the libraries import that Windows
does not provide (MinGW's ``libstdc++-6.dll``, ``libgcc_s_seh-1.dll``, ``libwinpthread-1.dll``; MSVC's
C++ runtime) into ``<dist>.libs/`` and adds an ``os.add_dll_directory`` patch to
``llama_cpp/__init__.py``. GPU drivers and NVIDIA's runtime DLLs are excluded: they come from the
system and NVIDIA's wheels. ``--no-mangle-all`` keeps our DLLs byte-identical to the native
manifest (mangling would rewrite their import tables); the cost is that a grafted runtime shares
its name with other copies in the process, which for one C++ runtime per wheel is the usual case.

Anything beyond that is a :class:`RepairError`; :func:`graft_problems` and :func:`unpatched_init`
are the same rules validate applies to the wheels afterwards.
"""

from __future__ import annotations

import ast
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ...common import pe, proc
from ...errors import RepairError
from ...inputs.configs import BuildConfig
from ..native.manifest import NativeManifest
from .build import PACKAGE, BuiltWheel
from .inwheel import parse_wheel_name, read_entries, rewrite

log = logging.getLogger(__name__)

LIBS_SUFFIX = ".libs"  # delvewheel's default: grafts go to <dist>.libs/ beside the package
EXCLUDES = ("nvcuda.dll", "nvml.dll", "vulkan-1.dll", "cudart64_*.dll", "cublas64_*.dll", "cublasLt64_*.dll",
            "nvrtc64_*.dll", "nvJitLink_*.dll")
INIT = f"{PACKAGE}/__init__.py"
DELVEWHEEL_RECORD = "DELVEWHEEL"  # the .dist-info file delvewheel writes
_PATCH = re.compile(rb'(\r?\n)?(?:"""""" )?# start delvewheel patch\r?\n(.*?)# end delvewheel patch\r?\n(\r?\n)?',
                    re.DOTALL)
_PATCH_CALLS = {"os.path.isdir", "os.path.abspath", "os.path.join", "os.path.dirname", "os.add_dll_directory"}


@dataclass(frozen=True)
class WindowsRepair:
    wheels: list[BuiltWheel]
    grafted: tuple[str, ...]  # the DLL names copied into <dist>.libs/


def is_windows_tag(platform_tag: str) -> bool:
    return platform_tag.startswith("win")


def libs_dir(dist_name: str) -> str:
    return f"{dist_name}{LIBS_SUFFIX}"


def runtime_dirs(config: BuildConfig) -> list[Path]:
    """Where the cross compiler's runtime DLLs are (none for a build on Windows: delvewheel finds the
    MSVC runtime on PATH). Asked of the compiler, so a GCC update moves nothing by hand."""
    spec = config.cross
    if spec is None or spec.system_name != "Windows" or spec.is_native():
        return []
    from ..native.cross_toolchain import compiler_names

    cc = [compiler_names(spec)[0], *([f"--target={spec.triple}"] if spec.uses_clang else [])]
    dirs: list[Path] = []
    for dll in ("libstdc++-6.dll", "libgcc_s_seh-1.dll", "libwinpthread-1.dll"):
        out = proc.run([*cc, f"-print-file-name={dll}"], what=f"{cc[0]} -print-file-name", error=RepairError).stdout
        found = Path(out.strip())
        if found.is_absolute() and found.is_file() and found.parent.resolve() not in dirs:
            dirs.append(found.parent.resolve())
    sysroot_lib = (Path("/usr") / spec.triple / "lib").resolve()
    if sysroot_lib.is_dir() and sysroot_lib not in dirs:
        dirs.append(sysroot_lib)
    return dirs


def delvewheel_args(search: Sequence[Path]) -> list[str]:
    """``delvewheel repair``'s options (the wheel and ``-w`` come later).

    delvewheel splits each ``--exclude`` and ``--add-path`` value on ``os.pathsep`` of the machine it
    runs on (";" on Windows, where ":" is refused inside a DLL name) and accepts each option more
    than once, so every name and folder is passed as an option of its own: no separator at all.
    """
    args = ["repair", "--analyze-existing", "--ignore-existing", "--no-mangle-all"]
    # Windows' own DLLs too: delvewheel's list is Windows 7's (no ucrtbase.dll, no d3d12.dll), and a
    # copy it grafted would be refused by graft_problems.
    for name in (*EXCLUDES, *sorted(pe.SYSTEM_DLLS)):
        args += ["--exclude", name]
    for folder in search:
        args += ["--add-path", str(folder)]
    return args


def _delvewheel(args: Sequence[str], cwd: Path, epoch: int) -> str:
    # argv[0] fixed and SOURCE_DATE_EPOCH set: the DELVEWHEEL record names no local path.
    code = "import runpy, sys; sys.argv[0] = 'delvewheel'; runpy.run_module('delvewheel', run_name='__main__')"
    cmd = [sys.executable, "-c", code, *args]
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
    except subprocess.TimeoutExpired:
        raise RepairError("delvewheel ran for more than 600 s") from None
    out = done.stdout + done.stderr
    if "No module named delvewheel" in out:
        raise RepairError("delvewheel is not installed: pip install -r requirements/release.txt "
                          "(or pass --no-repair to keep the wheels as built)")
    if done.returncode != 0:
        tail = "\n".join(out.strip().splitlines()[-15:])
        hint = (" (a DLL the libraries import is neither in the wheel, nor part of Windows, nor in the "
                "runtime folders: install the compiler's runtime, or exclude a driver DLL)"
                if "Unable to find library" in out else "")
        raise RepairError(f"delvewheel repair failed with exit code {done.returncode}{hint}:\n{tail}")
    return out


def unpatched_init(data: bytes, libs: str) -> tuple[bytes, ...]:
    """``llama_cpp/__init__.py`` without delvewheel's patch, as it may have been before (the blank
    lines delvewheel adds around its block depend on the file); ``ValueError`` unless there is
    exactly one patch block and it only adds ``<site-packages>/<libs>`` as a DLL directory."""
    blocks = list(_PATCH.finditer(data))
    if len(blocks) != 1:
        raise ValueError(f"expected one delvewheel patch block, found {len(blocks)}")
    block = blocks[0]
    try:
        tree = ast.parse(block.group(2).decode("utf-8"))
    except (SyntaxError, UnicodeDecodeError) as exc:
        raise ValueError(f"the delvewheel patch is not Python ({exc})") from None
    problem = _patch_problem(tree, libs)
    if problem:
        raise ValueError(f"the delvewheel patch {problem}")
    before, after = data[:block.start()], data[block.end():]
    lead, trail = block.group(1) or b"", block.group(3) or b""
    return tuple(dict.fromkeys(before + keep_lead + keep_trail + after
                               for keep_lead in (b"", lead) for keep_trail in (b"", trail)))


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def _patch_problem(tree: ast.Module, libs: str) -> str | None:
    """None when ``tree`` is: def F(): <DLL-directory code>; F(); del F — else what is wrong."""
    body = tree.body
    if len(body) != 3 or not isinstance(body[0], ast.FunctionDef) or not body[0].name.startswith("_delvewheel_patch_"):
        return "is not one function, its call and its deletion"
    name = body[0].name
    call, delete = body[1], body[2]
    if not (isinstance(call, ast.Expr) and isinstance(call.value, ast.Call) and _dotted(call.value.func) == name
            and isinstance(delete, ast.Delete) and [_dotted(t) for t in delete.targets] == [name]):
        return "is not one function, its call and its deletion"
    for node in ast.walk(body[0]):
        if isinstance(node, ast.Call) and _dotted(node.func) not in _PATCH_CALLS:
            return f"calls {_dotted(node.func)}, not only os.add_dll_directory and os.path"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value != libs:
            return f"names {node.value!r}, not {libs!r}"
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(a.name != "os" for a in node.names):
            return "imports more than os"
    if not any(isinstance(n, ast.Constant) and n.value == libs for n in ast.walk(body[0])):
        return f"does not add {libs}"
    return None


def graft_problems(files: Mapping[str, bytes], lib_names: Sequence[str], libs: str,
                   python_dlls: Collection[str]) -> list[tuple[str, str]]:
    """(check, message) for each way a Windows wheel's DLL set is wrong.

    ``files`` maps archive names to contents; ``python_dlls`` are the DLLs CPython ships for the
    wheel's tag (:func:`pe.python_dlls`: the MSVC runtime's ``VCRUNTIME140.dll``). ``graft``: a file in
    ``libs/`` that is not a DLL of the libraries' machine, a driver's DLL, a DLL Windows or CPython
    provides, or one nothing imports. ``dll-dependency``: a DLL of the wheel imports one that is
    neither in it, nor Windows', nor CPython's, nor a driver's.
    """
    python_dlls = {n.lower() for n in python_dlls}
    problems: list[tuple[str, str]] = []
    ours = {f"{PACKAGE}/lib/{n}" for n in lib_names}
    grafts = {n: d for n, d in files.items() if n.startswith(libs + "/")}
    images: dict[str, pe.PeImage] = {}
    for name in sorted(ours | set(grafts)):
        if name not in files or not name.lower().endswith(".dll"):
            continue
        try:
            images[name] = pe.parse_pe(files[name])
        except ValueError as exc:
            check = "graft" if name in grafts else "dll-dependency"
            problems.append((check, f"{name} is not a readable PE image ({exc})"))
    machines = {images[n].machine for n in ours if n in images}
    provided = {n.rsplit("/", 1)[-1].lower(): n for n in images}
    imported: set[str] = set()
    for name, image in sorted(images.items()):
        for dep in pe.loaded_imports(name.rsplit("/", 1)[-1], image):
            low = dep.lower()
            imported.add(low)
            if low in provided or low in python_dlls or pe.is_system_dll(dep) or pe.is_driver_dll(dep):
                continue
            problems.append(("dll-dependency", f"{name} imports {dep}, which is not in the wheel and not part of "
                                               "Windows or CPython: graft it (delvewheel --add-path <folder with "
                                               "it>) or link it statically"))
    for name in sorted(grafts):
        base = name.rsplit("/", 1)[-1]
        if pe.is_driver_dll(base):
            problems.append(("graft", f"{name}: a GPU driver or NVIDIA runtime DLL was grafted; it must come from "
                                      "the system or NVIDIA's wheels (delvewheel --exclude it)"))
        elif not base.lower().endswith(".dll"):
            problems.append(("graft", f"{name}: not a DLL (delvewheel grafts only DLLs)"))
        elif name in images and not images[name].is_dll:
            problems.append(("graft", f"{name}: a program, not a DLL"))
        elif name in images and machines and images[name].machine not in machines:
            problems.append(("graft", f"{name}: built for {images[name].machine}, the libraries for "
                                      f"{', '.join(sorted(machines))}"))
        elif pe.is_system_dll(base):
            problems.append(("graft", f"{name}: part of Windows; a wheel must not carry its own copy"))
        elif base.lower() in python_dlls:
            problems.append(("graft", f"{name}: CPython ships it beside python.exe; a wheel must not carry "
                                      "its own copy"))
        elif base.lower() not in imported:
            problems.append(("graft", f"{name}: no DLL of the wheel imports it (grafted by hand?)"))
    return problems


def _check_repaired(before: Path, after: Path, manifest: NativeManifest, dist_name: str) -> tuple[str, ...]:
    """Only WHEEL, RECORD, the DELVEWHEEL record, the grafts and the __init__ patch may differ."""
    import hashlib

    libs = libs_dir(dist_name)
    old = {e.name: e.data for e in read_entries(before)}
    new = {e.name: e.data for e in read_entries(after)}
    dist_info = next(n.split("/", 1)[0] for n in new if n.split("/", 1)[0].endswith(".dist-info"))
    allowed_new = {f"{dist_info}/{DELVEWHEEL_RECORD}"}
    added = sorted(n for n in set(new) - set(old) if n not in allowed_new and not n.startswith(libs + "/"))
    removed = sorted(set(old) - set(new))
    changed = sorted(n for n in set(old) & set(new) if old[n] != new[n]
                     and not n.endswith(("/WHEEL", "/RECORD")) and n != INIT)
    if added or removed or changed:
        raise RepairError(f"delvewheel changed {before.name} beyond the graft: added {added}, removed {removed}, "
                          f"changed {changed}")
    grafted = tuple(sorted(n.rsplit("/", 1)[-1] for n in new if n.startswith(libs + "/")))
    if grafted:
        try:
            if old[INIT] not in unpatched_init(new[INIT], libs):
                raise ValueError("the rest of the file changed too")
        except ValueError as exc:
            raise RepairError(f"{after.name}: {INIT}: {exc}") from None
    elif new.get(INIT) != old.get(INIT):
        raise RepairError(f"{after.name}: {INIT} was patched although nothing was grafted")
    for lib in manifest.libraries:
        data = new.get(f"{PACKAGE}/lib/{lib.name}")
        if data is None or hashlib.sha256(data).hexdigest() != lib.sha256:
            raise RepairError(f"{after.name}: {PACKAGE}/lib/{lib.name} no longer matches the native manifest "
                              "(delvewheel must run with --no-mangle-all)")
    tag = parse_wheel_name(after.name)
    problems = graft_problems(new, [lib.name for lib in manifest.libraries], libs,
                              pe.python_dlls(tag.abi, tag.platform))
    if problems:
        raise RepairError(f"{after.name}: " + "; ".join(m for _c, m in problems))
    return grafted


def repair(wheels: Sequence[BuiltWheel], manifest: NativeManifest, config: BuildConfig, *,
           jobs: int | None = None) -> WindowsRepair:
    """Graft the runtime into every Windows wheel (in place); other wheels are returned unchanged."""
    todo = [w for w in wheels if is_windows_tag(w.platform_tag)]
    if not todo:
        return WindowsRepair(list(wheels), ())
    args = delvewheel_args(runtime_dirs(config))

    def one(w: BuiltWheel) -> tuple[BuiltWheel, tuple[str, ...]]:
        with tempfile.TemporaryDirectory(prefix="delvewheel-") as tmp:
            out = Path(tmp)
            _delvewheel([*args, "-w", str(out), w.path.name], w.path.parent, w.epoch)
            produced = list(out.glob("*.whl"))
            if len(produced) != 1:
                raise RepairError(f"delvewheel repair {w.path.name} produced {[p.name for p in produced]}")
            grafted = _check_repaired(w.path, produced[0], manifest, parse_wheel_name(w.path.name).name)
            dest = w.path.with_name(produced[0].name)
            rewrite(produced[0], dest, epoch=w.epoch)  # deterministic zip, RECORD rewritten
        if dest != w.path:
            w.path.unlink()
        return w.refreshed(dest, repaired=True), grafted

    with ThreadPoolExecutor(max_workers=jobs or min(len(todo), 4)) as pool:
        done = list(pool.map(one, todo))
    grafts = {g for _w, g in done}
    if len(grafts) != 1:
        raise RepairError(f"the wheels got different grafts: {sorted(grafts)}")
    (grafted,) = grafts
    log.info("delvewheel: grafted %s", ", ".join(grafted) or "nothing")
    repaired = {w.path: r for w, (r, _g) in zip(todo, done)}
    return WindowsRepair([repaired.get(w.path, w) for w in wheels], grafted)
