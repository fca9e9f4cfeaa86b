"""llama.cpp's own programs from the MinGW-w64 cross build, run under Wine on the fixture models.

They load the same DLLs the wheels carry (the tools folder links them from the native build's
``lib/``), with the MinGW runtime from the folders delvewheel grafts from: so the DLL set loads,
ggml.dll finds its CPU backend beside it, and the results match the Linux build of the same tree.
Skipped, with the command that makes them, when Wine or the cross-built programs are absent.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path, PureWindowsPath

import pytest

from build_tools.common.paths import cache_root
from build_tools.errors import BuildToolsError
from build_tools.fixtures import fixture_path
from build_tools.inputs.configs import load_matrix
from build_tools.inputs.lock import load_lock
from build_tools.stages.native import build as native
from build_tools.stages.vendor import current_tree
from build_tools.stages.wheels.repair_windows import runtime_dirs

from ..windows_fakes import CONFIG

pytestmark = pytest.mark.windows

PROMPT = "Once upon a time the little cat"
TIMEOUT = 300
POLL = 0.5
GRACE = 20  # seconds a program may take to exit once its output is complete
ATTEMPTS = 4  # common/log.cpp's worker is never joined at exit: a truncated run is repeated
MAKE = f"python -m build_tools native {CONFIG} --tools"


def _wine() -> str | None:
    found = shutil.which("wine64") or shutil.which("wine")
    if found is None and Path("/usr/lib/wine/wine64").is_file():  # Debian's wine64 without the wine wrapper
        found = "/usr/lib/wine/wine64"
    return found


def _finished(name: str) -> native.NativeBuild | None:
    """The cached build of ``name`` with its reference programs, without building anything."""
    lock = load_lock()
    try:
        p = native.plan(load_matrix().get(name), lock, current_tree(lock), install=False)
    except BuildToolsError as exc:
        pytest.skip(f"{name} cannot be planned here ({exc})")
    nb = native.find_finished(p)
    if nb is None or not (nb.tools_dir / ".tools.json").is_file():
        return None
    return nb


@pytest.fixture(scope="module")
def win_tools() -> Path:
    nb = _finished(CONFIG)
    if nb is None:
        pytest.skip(f"the {CONFIG} programs are not built: run `{MAKE}`")
    return nb.tools_dir


def _wineserver(wine: str) -> str | None:
    return shutil.which("wineserver") or next(
        (str(p) for p in (Path(wine).parent / "wineserver", Path("/usr/lib/wine/wineserver64")) if p.is_file()), None)


@pytest.fixture(scope="module")
def wine_env(win_config) -> Iterator[dict[str, str]]:
    wine = _wine()
    if wine is None:
        pytest.skip("Wine is not installed: apt-get install wine64")
    dirs = runtime_dirs(win_config)
    if not dirs:
        pytest.skip("the MinGW-w64 runtime DLLs are not installed: apt-get install g++-mingw-w64-x86-64-posix")
    prefix = cache_root() / "wine" / "prefix"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "WINE": wine, "WINEPREFIX": str(prefix), "WINEDEBUG": "-all",
           "WINEDLLOVERRIDES": "mscoree,mshtml=", "WINEPATH": ";".join(f"Z:{d}" for d in dirs)}
    # Create or update the prefix first, detached: wineboot's services and the wineserver outlive
    # the program that started them, and must not hold a test's output open.
    started = time.monotonic()
    subprocess.run([wine, "wineboot", "-u"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, start_new_session=True, check=False, timeout=TIMEOUT)
    print(f"wineboot: {time.monotonic() - started:.1f} s")
    yield env
    server = _wineserver(wine)
    if server is not None:
        subprocess.run([server, "-k"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False, timeout=60)


def _run(env: dict[str, str], program: Path, *args: object, done) -> subprocess.CompletedProcess[str]:
    """Run ``program`` (under Wine for an .exe) until it exits, or until its output is ``done`` and
    it has had GRACE seconds more to exit: a Wine process can outlive its program's work."""
    cmd = [env["WINE"], str(program), *map(str, args)] if program.suffix == ".exe" else [str(program), *map(str, args)]
    for _ in range(ATTEMPTS):
        started = time.monotonic()
        r, late = _run_once(cmd, env, done)
        print(f"{program.name}: {time.monotonic() - started:.1f} s" + (" (killed after its output was done)" if late else ""))
        if not late and r.returncode != 0:
            raise AssertionError(f"{program.name} failed ({r.returncode}):\n{r.stderr[-3000:]}")
        if done(r):
            return r
    raise AssertionError(f"{program.name} kept printing truncated output:\n{r.stdout[-500:]}\n{r.stderr[-1500:]}")


def _run_once(cmd: list[str], env: dict[str, str], done) -> tuple[subprocess.CompletedProcess[str], bool]:
    # Files, not pipes: a pipe stays open while any process that inherited it lives on.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        def result(code: int) -> subprocess.CompletedProcess[str]:
            texts = []
            for f in (out, err):
                f.seek(0)
                texts.append(f.read().decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n"))
            return subprocess.CompletedProcess(cmd, code, *texts)

        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                start_new_session=True)
        deadline, finished_at = time.monotonic() + TIMEOUT, None
        try:
            while True:
                try:
                    return result(proc.wait(timeout=POLL)), False
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if finished_at is None and done(result(0)):
                    finished_at = now
                if finished_at is not None and now - finished_at > GRACE:
                    return result(0), True
                if now > deadline:
                    raise AssertionError(f"{cmd[-1]} ran past {TIMEOUT} s:\n{result(0).stderr[-3000:]}")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _reference() -> str:
    """The Linux build with the same CPU backends: every variant (the same one is picked on this
    machine), or cpu-host's AVX2 backend, which cpu-windows-dev pins too."""
    return "cpu" if load_matrix().get(CONFIG).cpu_variants == "all" else "cpu-host"


def _linux_tools() -> Path:
    nb = _finished(_reference())
    if nb is None:
        pytest.skip(f"the Linux reference ({_reference()}) programs are not built: run "
                    f"`python -m build_tools native {_reference()} --tools`")
    return nb.tools_dir


def _completion(env, tools: Path, suffix: str) -> str:
    r = _run(env, tools / f"llama-completion{suffix}", "-m", fixture_path("llama_spm"), "-p", PROMPT, "-n", "24",
             "--temp", "0", "--seed", "1", "-t", "2", "-c", "256", "-no-cnv", "--no-warmup",
             done=lambda r: "graphs reused" in r.stderr)
    return r.stdout


def _embeddings(env, tools: Path, suffix: str) -> list[list[float]]:
    def rows(r) -> list[list[float]] | None:
        try:
            return json.JSONDecoder().raw_decode(r.stdout[r.stdout.index("["):])[0]
        except ValueError:
            return None

    r = _run(env, tools / f"llama-embedding{suffix}", "-m", fixture_path("embedding_model"), "-p",
             "hello world\nthe quick brown fox", "-t", "1", "-c", "512", "--embd-normalize", "2",
             "--embd-output-format", "array", done=lambda r: rows(r) is not None)
    return rows(r)


def test_programs_load_the_dll_set_and_the_cpu_backend(win_tools, wine_env):
    r = _run(wine_env, win_tools / "llama-completion.exe", "--version", done=lambda r: "version" in r.stderr + r.stdout)
    assert "11312" in r.stderr + r.stdout, r.stderr  # the pinned build number, from the locked git stand-in
    out = _run(wine_env, win_tools / "llama-simple.exe", "-m", fixture_path("llama_spm"), "-n", "8", PROMPT,
               done=lambda r: "decoded" in r.stderr)
    loaded = re.search(r"load_backend: loaded CPU backend from (.+)", out.stderr)
    assert loaded is not None, out.stderr[-2000:]
    dll = PureWindowsPath(loaded.group(1).strip()).name
    print(f"CPU backend: {dll}")
    assert re.fullmatch(r"ggml-cpu(-[a-z0-9]+)?\.dll", dll) and (win_tools / dll).is_file()
    assert out.stdout.startswith(PROMPT) or PROMPT in out.stdout


def test_completion_under_wine_equals_linux(win_tools, wine_env):
    windows = _completion(wine_env, win_tools, ".exe")
    assert PROMPT in windows and len(windows) > len(PROMPT) + 8, windows
    linux_tools = _linux_tools()
    env = native.tool_env(linux_tools)
    assert windows == _completion({**env, "WINE": ""}, linux_tools, "")


def test_embeddings_under_wine_match_linux(win_tools, wine_env):
    windows = _embeddings(wine_env, win_tools, ".exe")
    assert [len(r) for r in windows] == [64, 64]
    for row in windows:
        assert abs(sum(x * x for x in row) - 1.0) < 1e-4
    linux_tools = _linux_tools()
    linux = _embeddings({**native.tool_env(linux_tools), "WINE": ""}, linux_tools, "")
    assert max(abs(a - b) for wr, lr in zip(windows, linux) for a, b in zip(wr, lr)) < 1e-5
