"""The real CUDA 13 plugin wheel, from the ``cuda-13.0`` (else ``cuda-13.0-dev``) native build in the
cache: it validates against the cpu-host core wheel (the base libraries are the core's bytes), pip
installs ``llama-cpp-python[cuda13]`` from a local index on 127.0.0.1 holding the core wheel, the
sdist, the plugin and NVIDIA's runtime wheels at the configuration's pins, and in that venv:

* without an NVIDIA driver (this machine, CI): ``backends()`` and ``python -m llama_cpp backends``
  name the plugin's module and ``libcuda.so.1`` as why it did not load,
  ``ensure_backends(require_gpu=True)`` raises ``BackendUnavailableError`` naming both, and the CPU
  serves the fixture model (the release smoke's stages);
* with one (a GPU machine): the plugin's module serves the GPU and the GPU smoke's stages pass,
  every layer offloaded.

NVIDIA's wheels are downloaded once (``pip download``, the pins of ``[config.cuda].packages`` for
the names the plugin requires) into ``<cache>/plugins/wheels`` and served from the local index
from then on, so the test runs offline once they are cached.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import re
import shutil
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from build_tools.common.paths import cache_root
from build_tools.common.pip import pip
from build_tools.errors import NativeBuildError
from build_tools.inputs.configs import BuildConfig, load_matrix
from build_tools.inputs.lock import load_lock
from build_tools.stages import plugins
from build_tools.stages.plugins import fatbin
from build_tools.stages.plugins.build import BASE_LIBRARY
from build_tools.stages.smoke import runner
from build_tools.stages.smoke.workload import FIXTURE_GPU_STAGES, RELEASE_STAGES

from ...native_fakes import fake_native_build
from .plugin_index import ENV, pip_venv, plugin_beside_the_core

# The release build, else the one that fits a 2-core machine (Hopper only, one CPU backend).
CONFIGS = ("cuda-13.0", "cuda-13.0-dev")
DRIVER = "libcuda.so.1"
PLUGIN = "llama-cpp-python-cuda13"


class _NotCached(Exception):
    pass


def _refuse_download(pins, _target) -> None:
    raise _NotCached(" ".join(pins))


def cuda_build():
    """The finished native build of the first of CONFIGS in the cache, or a skip naming what was looked for."""
    from build_tools.stages.native import build as native
    from build_tools.stages.native.cuda_toolkit import provision
    from build_tools.stages.vendor import current_tree

    lock = load_lock()
    tree = current_tree(lock)
    looked = []
    for name in CONFIGS:
        config = load_matrix().get(name)
        assert config.cuda is not None
        try:  # the build's key names the toolkit: only a cached one, never a download here
            provision(config.cuda, installer=_refuse_download)
        except _NotCached as exc:
            looked.append(f"{name}: its CUDA {config.cuda.version} toolkit is not in the cache ({exc})")
            continue
        except NativeBuildError as exc:
            looked.append(f"{name}: {exc}")
            continue
        p = native.plan(config, lock, tree, install=False)
        nb = native.find_finished(p)
        if nb is not None:
            return nb
        looked.append(f"{name}: no native build {p.key[:16]} in the cache")
    pytest.skip(f"no CUDA 13 native build here ({'; '.join(looked)}): nox -s native -- cuda-13.0-dev")


@pytest.fixture(scope="session")
def cuda13_build():
    """The build, found (or skipped) before the core wheels and the sdist are made."""
    return cuda_build()


def runtime_wheels(config: BuildConfig, plugin: Path) -> dict[str, list[Path]]:
    """NVIDIA's wheels the plugin requires, at the versions its module was linked against (the
    configuration's toolkit pins), by project name: downloaded once into the cache."""
    assert config.cuda is not None
    pins = {canonicalize_name(re.split(r"==", p, maxsplit=1)[0]): p for p in config.cuda.packages}
    wanted = []
    for r in runner.requires_dist(plugin):
        req = Requirement(r)
        name = canonicalize_name(req.name)
        if name == "llama-cpp-python":
            continue
        assert name in pins, f"{config.name} pins no version of {name}, which the plugin requires"
        pinned = pins[name].split("==", 1)[1]
        assert req.specifier.contains(pinned, prereleases=True), (pins[name], r)
        wanted.append((name, pinned))
    house = cache_root() / "plugins" / "wheels"
    house.mkdir(parents=True, exist_ok=True)

    def cached(name: str, version: str) -> list[Path]:
        return [w for w in sorted(house.glob("*.whl"))
                if parse_wheel_filename(w.name)[0] == name and str(parse_wheel_filename(w.name)[1]) == version]

    missing = [f"{n}=={v}" for n, v in wanted if not cached(n, v)]
    if missing:
        done = subprocess.run(pip("download", "-q", "--no-deps", "--only-binary=:all:", "--dest", str(house), *missing),
                              capture_output=True, text=True, timeout=1800, check=False)
        assert done.returncode == 0, f"pip download {' '.join(missing)} (needs the package index once):\n{done.stderr}"
    return {name: cached(name, version) for name, version in wanted}


def _driver_present() -> bool:
    try:
        ctypes.CDLL(DRIVER)
    except OSError:
        return False
    return True


def _run(py: Path, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(py), "-I", *args], capture_output=True, text=True, timeout=timeout, env=ENV,
                          cwd=cwd, check=False)


def _fat_binary(images: list[tuple[int, int, bytes]]) -> bytes:
    """A fat binary as nvcc writes one: (kind 1 PTX / 2 ELF, architecture, payload) images."""
    body = b""
    for kind, arch, payload in images:
        padded = payload + b"\0" * (-len(payload) % 8)
        header = bytearray(64)
        struct.pack_into("<HHIQI", header, 0, kind, 0x0101, 64, len(padded), len(payload))
        struct.pack_into("<I", header, 28, arch)
        struct.pack_into("<Q", header, 56, 4 * len(payload))  # as if compressed 4:1
        body += bytes(header) + padded
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _elf(sections: dict[str, bytes]) -> bytes:
    """A 64-bit little-endian ELF shared object with these sections (and .shstrtab) only."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n in [*sections, ".shstrtab"])
    data, offsets = b"", []
    for body in [*sections.values(), names]:
        offsets.append(64 + len(data))
        data += body + b"\0" * (-len(body) % 8)
    shoff = 64 + len(data)
    headers = bytes(64)  # the null section
    name_off = 1
    for (name, body), off in zip([*sections.items(), (".shstrtab", names)], offsets):
        headers += struct.pack("<IIQQQQIIQQ", name_off, 1 if name != ".shstrtab" else 3, 0, 0, off, len(body), 0, 0,
                               8, 0)
        name_off += len(name) + 1
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    head = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 56, 0, 64, len(sections) + 2,
                                len(sections) + 1)
    return head + data + headers


def _cuda_module() -> bytes:
    """Two translation units' device code: SASS for sm_75/sm_90, PTX for compute_100."""
    tu1 = _fat_binary([(2, 75, b"a" * 1000), (2, 90, b"b" * 800), (1, 100, b"c" * 300)])
    tu2 = _fat_binary([(2, 75, b"d" * 500), (2, 90, b"e" * 404)])
    return _elf({".text": b"\x90" * 64, fatbin.SECTION: tu1 + b"\0" * 8 + tu2})


def test_device_code_per_target():
    code = fatbin.device_code(_cuda_module())
    assert code == {"sm_75": 64 + 1000 + 64 + 504, "sm_90": 64 + 800 + 64 + 408, "compute_100": 64 + 304}
    assert list(code) == ["sm_75", "sm_90", "compute_100"]  # SASS by architecture, then PTX
    assert fatbin.describe({"sm_90": 28_123_456}) == "sm_90 28.1 MB"
    assert fatbin.device_code(_elf({".text": b""})) == {}  # a module without device code
    with pytest.raises(ValueError, match="not a 64-bit"):
        fatbin.device_code(b"MZ not elf")


def test_cuda_plugin_requires_nvidia_runtime_and_names_device_code_over_the_limit(native_build, built, repo,
                                                                                 tmp_path, monkeypatch):
    core = next(w for w in built.wheels if w.python_tag.startswith("cp"))
    config = load_matrix().get("cuda-13.0-dev")
    libs = {lib.name: (native_build.root / lib.path).read_bytes()
            for lib in native_build.manifest.libraries if BASE_LIBRARY.match(lib.name)}
    nb = fake_native_build(tmp_path / "native", config, {**libs, "libggml-cuda.so": _cuda_module()}, ["cuda"])
    p = plugins.build(config, nb.manifest, nb.root, tmp_path / "out", platform_tag=core.platform_tag, repo=repo)
    version = core.version.split("+", 1)[0]
    assert p.filename == f"llama_cpp_python_cuda13-{version}-py3-none-{core.platform_tag}.whl"
    with zipfile.ZipFile(p.path) as zf:
        meta = zf.read(f"llama_cpp_python_cuda13-{version}.dist-info/METADATA").decode()
        eps = zf.read(f"llama_cpp_python_cuda13-{version}.dist-info/entry_points.txt").decode()
    requires = [line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Requires-Dist: ")]
    assert requires == [f"llama-cpp-python=={version}", *config.cuda.runtime_requires]
    assert eps == "[llama_cpp.backends]\ncuda = llama_cpp_backend_cuda13\n"
    report = plugins.check(p.path, core.path)
    assert report.ok, report.render()
    assert plugins.device_code(p.path) == "sm_75 0.0 MB, sm_90 0.0 MB, compute_100 0.0 MB"  # read from the wheel

    plugin_check = importlib.import_module("build_tools.stages.plugins.check")  # the package's `check` is the function
    monkeypatch.setattr(plugin_check, "PYPI_FILE_LIMIT_MB", p.size / 2e6)  # as if the module were 2x the limit
    report = plugins.check(p.path, core.path)
    assert [c for c, _m in report.failures] == ["size"], report.render()
    assert "device code per target, as stored: sm_75 0.0 MB, sm_90 0.0 MB, compute_100 0.0 MB" in report.failures[0][1]
    assert "split the plugin" in report.failures[0][1]


@pytest.mark.slow
def test_the_real_cuda13_plugin_from_a_local_index_names_the_missing_driver(
        cuda13_build, built, repo, tmp_path, smoke_interpreter, sdist_file, serve_index):
    nb = cuda13_build
    pb = plugin_beside_the_core(nb, built, repo, tmp_path / "plugin", smoke_interpreter)
    models, wheel, config, p = pb.models, pb.wheel, pb.config, pb.plugin
    assert (p.name, p.key, p.family) == (PLUGIN, "cuda13", "cuda")
    report = plugins.check(p.path, wheel.path)  # base libraries byte for byte the core's, under PyPI's limit
    assert report.ok, report.render()
    nvidia = runtime_wheels(config, p.path)
    index_url = serve_index({"llama-cpp-python": [wheel.path, sdist_file], PLUGIN: [p.path], **nvidia})
    py = pip_venv(smoke_interpreter, index_url, "llama-cpp-python[cuda13]", tmp_path / "venv", wheel.path,
                  timeout=900 * runner.load_factor())

    listed = _run(py, "-m", "pip", "list", "--format", "json", cwd=tmp_path)
    versions = {canonicalize_name(d["name"]): d["version"] for d in json.loads(listed.stdout)}
    assert versions["llama-cpp-python"] == versions[PLUGIN] == wheel.version, versions
    for name, files in nvidia.items():  # NVIDIA's runtime came with the extra, at the pins
        assert versions.get(name) == str(parse_wheel_filename(files[0].name)[1]), (name, versions)

    driver = _driver_present()
    probe = ("import json, llama_cpp; print(json.dumps([[s.name, s.path and s.path.name, s.loaded, s.reason, "
             "s.plugin, len(s.devices)] for s in llama_cpp.backends()]))")
    done = _run(py, "-c", probe, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    mine = [s for s in got if s[4] == PLUGIN]
    assert len(mine) == 1 and mine[0][:2] == ["CUDA", "libggml-cuda.so"], got
    assert got.index(mine[0]) > max(i for i, s in enumerate(got) if s[4] is None)  # after the core's backends
    cli = _run(py, "-m", "llama_cpp", "backends", cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    cli_line = next((line for line in cli.stdout.splitlines() if f"libggml-cuda.so ({PLUGIN})" in line), "")
    ensure = _run(py, "-c", "import llama_cpp; llama_cpp.ensure_backends(require_gpu=True)", cwd=tmp_path)
    if driver:
        assert mine[0][2] is True and mine[0][5] >= 1, got
        assert " loaded " in cli_line, cli.stdout
        assert ensure.returncode == 0, ensure.stderr
        stages, flags = FIXTURE_GPU_STAGES, ["--require-gpu"]
    else:
        assert mine[0][2] is False and mine[0][3] == f"{DRIVER} not found (NVIDIA driver not installed)", got
        assert "not loaded" in cli_line and f"{DRIVER} not found" in cli_line, cli.stdout
        assert ensure.returncode != 0
        assert "BackendUnavailableError" in ensure.stderr, ensure.stderr
        assert f"CUDA backend (plugin {PLUGIN}) not loaded: {DRIVER} not found" in ensure.stderr, ensure.stderr
        stages, flags = RELEASE_STAGES, []

    out, empty = tmp_path / "report.json", tmp_path / "empty"
    empty.mkdir()
    script = tmp_path / "workload.py"
    shutil.copyfile(runner.WORKLOAD, script)
    done = subprocess.run([str(py), "-I", str(script), "--out", str(out), "--stages", ",".join(stages),
                           "--version", wheel.version, *flags, *models.workload_args()],
                          env=ENV, capture_output=True, text=True, timeout=1200 * runner.load_factor(), cwd=empty,
                          check=False)
    ran = json.loads(out.read_text())["stages"] if out.is_file() else {}
    assert done.returncode == 0, json.dumps(ran, indent=1) + done.stderr[-3000:]
    assert list(ran) == list(stages)
    if driver:
        assert "libggml-cuda.so from the installed plugins" in ran["libraries"]["detail"], ran["libraries"]
        for stage in ("generation", "embedding", "mtp"):  # every layer ran on the plugin's CUDA device
            assert re.search(r"layers \((\d+), \1\)", ran[stage]["detail"]), ran[stage]
    else:  # the CPU serves: the release smoke's check of a CUDA backend without its driver
        assert f"CUDA not loaded: {DRIVER} not found" in ran["libraries"]["detail"], ran["libraries"]
        assert "the CPU serves" in ran["libraries"]["detail"], ran["libraries"]
