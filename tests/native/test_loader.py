"""The loader: lazy and silent import, backend report, a fake CUDA backend with no driver, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from build_tools.common.compilers import find_compiler

REPO = Path(__file__).resolve().parents[2]

REPORT = (
    "import json, llama_cpp\n"
    "print(json.dumps([dict(name=b.name, path=b.path and b.path.name, loaded=b.loaded, reason=b.reason,"
    " devices=[d.type for d in b.devices]) for b in llama_cpp.backends()]))\n"
)


def run_py(code: str, lib_dir: Path | str | None, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k not in ("LLAMA_CPP_LIB_PATH", "LLAMA_CPP_REQUIRE_GPU")}
    e["PYTHONPATH"] = str(REPO)
    if lib_dir is not None:
        e["LLAMA_CPP_LIB_PATH"] = str(lib_dir)
    e.update(env)
    cmd = [sys.executable, *(("-c", code) if code else ()), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=e, cwd=str(REPO), timeout=120, check=False)


def _cc(*args: str) -> None:
    subprocess.run([str(find_compiler()), *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def fake_cuda_dir(lib_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the lib dir (symlinks) plus a libggml-cuda.so that NEEDs a libcuda.so.1 that is gone."""
    root = tmp_path_factory.mktemp("fakecuda")
    stub, out = root / "stub", root / "lib"
    stub.mkdir()
    out.mkdir()
    (root / "cuda.c").write_text("void cuInit(void) {}\n")
    _cc("-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub / "libcuda.so.1"), str(root / "cuda.c"))
    (root / "backend.c").write_text("extern void cuInit(void);\nint ggml_backend_fake(void) { cuInit(); return 0; }\n")
    _cc("-shared", "-fPIC", "-o", str(out / "libggml-cuda.so"), str(root / "backend.c"),
        f"-L{stub}", "-l:libcuda.so.1")
    (stub / "libcuda.so.1").unlink()
    stub.rmdir()
    for p in lib_dir.iterdir():
        (out / p.name).symlink_to(p.resolve())
    return out


def test_import_is_silent_and_loads_nothing(lib_dir):
    r = run_py("import llama_cpp", lib_dir)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
    r = run_py("import llama_cpp, llama_cpp.llama_cpp, llama_cpp.mtmd_cpp, llama_cpp.ggml_cpp\n"
               "from llama_cpp._native.loader import loaded_library_paths\nprint(sorted(loaded_library_paths()))", lib_dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]" and r.stderr == ""


def test_backends_report_cpu(lib_dir):
    r = run_py(REPORT, lib_dir)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    cpu = [b for b in rows if b["name"] == "CPU"]
    assert cpu and cpu[0]["loaded"] and cpu[0]["devices"] == ["CPU"]
    assert r.stderr == ""  # nothing logged at WARNING for a healthy install


def test_fake_cuda_backend_without_driver(fake_cuda_dir):
    r = run_py(REPORT, fake_cuda_dir)
    assert r.returncode == 0, r.stderr
    rows = {b["path"]: b for b in json.loads(r.stdout)}
    cuda = rows["libggml-cuda.so"]
    assert cuda["name"] == "CUDA" and cuda["loaded"] is False
    assert cuda["reason"] == "libcuda.so.1 not found (NVIDIA driver not installed)"
    assert rows["libggml-cpu.so"]["loaded"] is True
    assert r.stderr == ""  # a library prints nothing by itself (NullHandler) ...
    logged = run_py("import logging\nlogging.basicConfig()\n" + REPORT, fake_cuda_dir)
    # ... but the warning is logged for an application that configures logging
    assert "CUDA backend not loaded: libcuda.so.1 not found (NVIDIA driver not installed)" in logged.stderr

    cli = run_py("", fake_cuda_dir, "-m", "llama_cpp", "backends")
    assert cli.returncode == 0, cli.stderr
    lines = cli.stdout.splitlines()
    cuda_line = next(line for line in lines if "libggml-cuda.so" in line)
    assert "not loaded" in cuda_line and "libcuda.so.1 not found" in cuda_line
    cpu_line = next(line for line in lines if "libggml-cpu.so" in line)
    assert " loaded " in cpu_line

    gpu = run_py("import llama_cpp.llama_cpp as C\nC.llama_max_devices()", fake_cuda_dir, LLAMA_CPP_REQUIRE_GPU="1")
    assert gpu.returncode != 0
    assert "BackendUnavailableError" in gpu.stderr and "libcuda.so.1 not found" in gpu.stderr
    ensure = run_py("from llama_cpp._native import loader as _loader\n_loader.ensure_backends(require_gpu=True)", fake_cuda_dir)
    assert "BackendUnavailableError" in ensure.stderr


def test_require_gpu_has_a_public_entry_point(fake_cuda_dir):
    # The README's "require_gpu=True" is llama_cpp.ensure_backends(require_gpu=True).
    code = ("import llama_cpp\n"
            "llama_cpp.ensure_backends()\n"  # the CPU serves: no error without require_gpu
            "try:\n"
            "    llama_cpp.ensure_backends(require_gpu=True)\n"
            "except llama_cpp.BackendUnavailableError as exc:\n"
            "    print('refused:', exc)\n")
    r = run_py(code, fake_cuda_dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("refused:"), r.stdout
    assert "CUDA backend not loaded: libcuda.so.1 not found (NVIDIA driver not installed)" in r.stdout
    assert "ensure_backends(require_gpu=True)" in r.stdout  # the message names where to pass it
    assert "ensure_backends" in __import__("llama_cpp").__all__


def test_cli_backends_table_and_json(lib_dir):
    r = run_py("", lib_dir, "-m", "llama_cpp", "backends")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1].split()[:3] == ["BACKEND", "FILE", "STATUS"]
    assert any(line.startswith("CPU") and " loaded " in line for line in r.stdout.splitlines())
    j = run_py("", lib_dir, "-m", "llama_cpp", "backends", "--json")
    doc = json.loads(j.stdout)
    assert doc["lib_dir"] == str(lib_dir.resolve()) and any(b["loaded"] for b in doc["backends"])


def test_require_gpu_on_a_cpu_build(lib_dir):
    r = run_py("import llama_cpp\nllama_cpp.system_info()", lib_dir, LLAMA_CPP_REQUIRE_GPU="1")
    assert r.returncode != 0 and "no GPU backend" in r.stderr


def test_lib_path_errors(tmp_path):
    r = run_py("import llama_cpp\nllama_cpp.system_info()", tmp_path / "nope")
    assert "LibraryNotFoundError" in r.stderr and "is not a directory" in r.stderr
    r = run_py("import llama_cpp\nllama_cpp.system_info()", tmp_path)
    assert "LibraryNotFoundError" in r.stderr and str(tmp_path) in r.stderr and "ggml-base" in r.stderr


def test_cwd_is_never_searched(lib_dir, tmp_path):
    # libraries in the CWD but not in LLAMA_CPP_LIB_PATH: not found
    for p in lib_dir.iterdir():
        (tmp_path / p.name).symlink_to(p.resolve())
    empty = tmp_path / "empty"
    empty.mkdir()
    e = {**os.environ, "PYTHONPATH": str(REPO), "LLAMA_CPP_LIB_PATH": str(empty)}
    r = subprocess.run([sys.executable, "-c", "import llama_cpp\nllama_cpp.system_info()"], cwd=str(tmp_path),
                       capture_output=True, text=True, env=e, timeout=60, check=False)
    assert r.returncode != 0 and "LibraryNotFoundError" in r.stderr


def test_load_is_once_and_thread_safe(lib_dir):
    code = ("import threading, llama_cpp._native.loader as L\nres=[]\n"
            "ts=[threading.Thread(target=lambda: res.append(id(L.load()))) for _ in range(8)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\nprint(len(set(res)), len(res))")
    r = run_py(code, lib_dir)
    assert r.stdout.split() == ["1", "8"], r.stderr


def test_native_logs_reach_logging(lib_dir, tmp_path, caplog):
    import logging

    from llama_cpp import ModelLoadError
    from llama_cpp._internals import LlamaModel

    junk = tmp_path / "junk2.gguf"
    junk.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))  # passes the header guard; no architecture
    with caplog.at_level(logging.DEBUG, logger="llama_cpp.native"), pytest.raises(ModelLoadError):
        LlamaModel(junk)
    native = [r for r in caplog.records if r.name == "llama_cpp.native"]
    assert native and any(r.levelno >= logging.WARNING for r in native)
    assert all(not r.getMessage().endswith("\n") for r in native)


def test_log_router_joins_continuations():
    import logging

    from llama_cpp._native.log_routing import NativeLogRouter
    from llama_cpp.ggml_cpp import GGML_LOG_LEVEL_CONT, GGML_LOG_LEVEL_DEBUG, GGML_LOG_LEVEL_INFO, GGML_LOG_LEVEL_WARN

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    r = NativeLogRouter("llama_cpp.native.test")
    r.logger.addHandler(Keep())
    r.logger.setLevel(logging.INFO)
    r.logger.propagate = False
    r.handle(GGML_LOG_LEVEL_INFO, "loading")
    for _ in range(3):
        r.handle(GGML_LOG_LEVEL_CONT, ".")
    r.handle(GGML_LOG_LEVEL_CONT, " done\n")
    r.handle(GGML_LOG_LEVEL_DEBUG, "hidden\n")
    r.handle(GGML_LOG_LEVEL_CONT, "hidden too\n")
    r.handle(GGML_LOG_LEVEL_WARN, "no newline")
    r.handle(GGML_LOG_LEVEL_INFO, "next\n")
    assert [(x.levelno, x.getMessage()) for x in records] == [
        (logging.INFO, "loading... done"), (logging.WARNING, "no newline"), (logging.INFO, "next")]


def test_explain_dlerror():
    from llama_cpp._native.loader import explain_dlerror

    assert explain_dlerror("libcuda.so.1: cannot open shared object file: No such file or directory") == \
        "libcuda.so.1 not found (NVIDIA driver not installed)"
    assert "CUDA runtime" in explain_dlerror("libcublas.so.12: cannot open shared object file: No such file")
    assert explain_dlerror("/x/libggml-cuda.so: undefined symbol: ggml_foo").startswith("undefined symbol ggml_foo")


def test_public_names_resolve():
    import llama_cpp

    assert set(llama_cpp._LAZY) <= set(llama_cpp.__all__)
    for name in llama_cpp.__all__:
        assert getattr(llama_cpp, name) is not None, name


def test_vulkan_without_a_driver_is_worded_apart_from_a_missing_loader():
    from llama_cpp._native.loader import _LOAD_FAILED, explain_dlerror, loaded_status

    no_loader = explain_dlerror("libvulkan.so.1: cannot open shared object file: No such file or directory")
    assert no_loader == "libvulkan.so.1 not found (Vulkan loader not installed)"
    # the loader is there but finds no ICD (instance refused), or the backend registers no device
    for no_driver in (_LOAD_FAILED["vulkan"], loaded_status("vulkan", "Vulkan", None, []).reason or ""):
        assert "no driver" in no_driver and "libvulkan" not in no_driver and "not found" not in no_driver, no_driver
    assert "GGML_VK_VISIBLE_DEVICES" in (loaded_status("vulkan", "Vulkan", None, []).reason or "")
