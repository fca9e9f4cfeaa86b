"""Backend plugin wheels, on a stand-in backend: the packaging, validate's refusals, and the loader's
discovery in a fresh venv (core wheel + plugin installed by pip through the core's extra).

The stand-in: a native build described as a Vulkan configuration's, whose base libraries are the
cpu-host build's and whose ``libggml-vulkan.so`` is that build's CPU backend module under the
Vulkan name (a real ggml backend module that loads here, without a Vulkan driver). The real case
(:func:`test_the_real_vulkan_plugin_from_a_local_index_offloads_every_layer_on_lavapipe`) builds the
plugin from the Vulkan native build in the cache (.ci/run's vulkan tier makes it) with the same
functions and runs the Vulkan smoke's GPU stages on lavapipe in the venv pip made.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from build_tools.inputs.configs import load_matrix
from build_tools.stages import plugins
from build_tools.stages.plugins.build import BASE_LIBRARY
from build_tools.stages.smoke import runner
from build_tools.stages.smoke.workload import FIXTURE_GPU_STAGES
from build_tools.stages.wheels import build as wheels

from ...native_fakes import fake_native_build
from ..vulkan_builds import lavapipe_env, vulkan_build
from .plugin_index import ENV, pip_venv, plugin_beside_the_core


def _cpu_module(native_build) -> str:
    mods = sorted(lib.name for lib in native_build.manifest.libraries if lib.name.startswith("libggml-cpu"))
    if not mods:
        pytest.skip("the cpu-host build has no CPU backend module (not a GGML_BACKEND_DL build)")
    return mods[0]


def _stand_in(native_build, root: Path, *, edit_base: bool = False):
    """A 'vulkan' native build: the cpu-host base libraries + its CPU module named libggml-vulkan.so."""
    config = load_matrix().get("vulkan-dev")
    libs = {}
    for lib in native_build.manifest.libraries:
        data = (native_build.root / lib.path).read_bytes()
        if BASE_LIBRARY.match(lib.name):
            if edit_base and lib.name.startswith("libggml-base"):
                data = data + b"\0"  # another build of the base library
            libs[lib.name] = data
    libs["libggml-vulkan.so"] = (native_build.root / native_build.manifest.library(_cpu_module(native_build)).path
                                 ).read_bytes()
    return config, fake_native_build(root, config, libs, ["vulkan"])


@pytest.fixture(scope="module")
def core_wheel(built):
    return next(w for w in built.wheels if w.python_tag.startswith("cp"))


def _plugin(native_build, core_wheel, root: Path, repo: Path, **kw):
    config, nb = _stand_in(native_build, root / "native", **kw)
    return plugins.build(config, nb.manifest, nb.root, root / "out", platform_tag=core_wheel.platform_tag, repo=repo)


def test_plugin_wheel_holds_only_the_module(native_build, core_wheel, repo, tmp_path):
    p = _plugin(native_build, core_wheel, tmp_path, repo)
    version = wheels.read_project(repo).version
    assert p.filename == f"llama_cpp_python_vulkan-{version}-py3-none-{core_wheel.platform_tag}.whl"
    with zipfile.ZipFile(p.path) as zf:
        names = sorted(n for n in zf.namelist() if ".dist-info/" not in n)
        meta = zf.read(f"llama_cpp_python_vulkan-{version}.dist-info/METADATA").decode()
        eps = zf.read(f"llama_cpp_python_vulkan-{version}.dist-info/entry_points.txt").decode()
    assert names == ["llama_cpp_backend_vulkan/__init__.py", "llama_cpp_backend_vulkan/lib/libggml-vulkan.so",
                     "llama_cpp_backend_vulkan/plugin.json"]
    assert f"Requires-Dist: llama-cpp-python=={version}\n" in meta
    assert eps == "[llama_cpp.backends]\nvulkan = llama_cpp_backend_vulkan\n"
    report = plugins.check(p.path, core_wheel.path)
    assert report.ok, report.render()
    # the core wheel declares the extra that installs it
    with zipfile.ZipFile(core_wheel.path) as zf:
        core_meta = zf.read(next(n for n in zf.namelist() if n.endswith("METADATA"))).decode()
    for key in ("vulkan", "cuda12", "cuda13"):
        assert f"Provides-Extra: {key}\n" in core_meta
        assert f'Requires-Dist: llama-cpp-python-{key}=={version}; extra == "{key}"\n' in core_meta


def test_validate_refuses_other_base_libraries(native_build, core_wheel, repo, tmp_path):
    p = _plugin(native_build, core_wheel, tmp_path, repo, edit_base=True)
    report = plugins.check(p.path, core_wheel.path)
    assert [c for c, _m in report.failures] == ["base-libraries"], report.render()
    assert "libggml-base" in report.failures[0][1]


def test_validate_refuses_a_plugin_of_another_version(native_build, core_wheel, repo, tmp_path):
    other = tmp_path / "repo"
    shutil.copytree(repo, other)
    v = other / "llama_cpp" / "_version.py"
    v.write_text(v.read_text().replace('__version__ = "', '__version__ = "9.'))
    pyproject = other / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("==0.", "==9.0."))
    p = _plugin(native_build, core_wheel, tmp_path, other)
    report = plugins.check(p.path, core_wheel.path)
    assert {c for c, _m in report.failures} == {"version"}, report.render()


def test_validate_refuses_a_driver_or_extra_file(native_build, core_wheel, repo, tmp_path):
    from build_tools.stages.wheels.inwheel import rewrite

    p = _plugin(native_build, core_wheel, tmp_path, repo)
    out = rewrite(p.path, tmp_path / "edited", replace={"llama_cpp_backend_vulkan/lib/libvulkan.so.1": b"x",
                                                          "llama_cpp_backend_vulkan/extra.py": b""})
    report = plugins.check(out, core_wheel.path)
    assert {c for c, _m in report.failures} == {"driver-library", "module"}, report.render()


def test_a_plugin_over_the_file_limit_is_withheld_and_nothing_else_is(native_build, core_wheel, repo, tmp_path,
                                                                      monkeypatch, capsys):
    """The release gate: a plugin refused only for PyPI's per-file limit leaves the PyPI set (moved to
    dist/<config>/withheld/) without failing the release; any other refusal still fails it."""
    import argparse
    import sys

    from build_tools.commands import plugins as command

    check_module = sys.modules["build_tools.stages.plugins.check"]  # the package re-exports its check()

    dist = tmp_path / "dist"
    good = _plugin(native_build, core_wheel, tmp_path / "a", repo)
    (dist / "vulkan-dev" / "plugins").mkdir(parents=True)
    shutil.copy2(good.path, dist / "vulkan-dev" / "plugins" / good.filename)
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args(["vulkan-dev", "--dist", str(dist), "--core", str(core_wheel.path), "--check-only",
                              "--withhold-oversize"])
    assert command.run(args) == 0  # under the limit: checked and kept
    assert (dist / "vulkan-dev" / "plugins" / good.filename).is_file()
    monkeypatch.setattr(check_module, "PYPI_FILE_LIMIT_MB", good.path.stat().st_size / 2e6)
    assert command.run(args) == 0
    assert not list((dist / "vulkan-dev" / "plugins").glob("*.whl"))
    assert (dist / "vulkan-dev" / "withheld" / good.filename).is_file()
    assert "WITHHELD from PyPI" in capsys.readouterr().out
    # over the limit and with other base libraries: still a failure, and the wheel stays where it was
    bad = _plugin(native_build, core_wheel, tmp_path / "b", repo, edit_base=True)
    shutil.copy2(bad.path, dist / "vulkan-dev" / "plugins" / bad.filename)
    assert command.run(args) == 1
    assert (dist / "vulkan-dev" / "plugins" / bad.filename).is_file()
    # without the flag the size alone fails the run
    strict = parser.parse_args(["vulkan-dev", "--dist", str(dist), "--core", str(core_wheel.path), "--check-only"])
    shutil.move(dist / "vulkan-dev" / "withheld" / good.filename, dist / "vulkan-dev" / "plugins" / bad.filename)
    assert command.run(strict) == 1


@pytest.mark.slow
def test_pip_installs_the_extra_and_the_loader_names_the_plugin(native_build, built, core_wheel, repo, tmp_path,
                                                                 smoke_interpreter, sdist_file, serve_index):
    """pip install "llama-cpp-python[vulkan]" from a local index (core wheel, sdist, plugin): the plugin
    comes with the extra, the loader loads its module after the CPU variants and backends() names it;
    without the extra nothing names it; a plugin of another version is reported with the pip command
    that fixes it."""
    wheel = next((w for w in built.wheels if w.python_tag == smoke_interpreter.tag), None)
    if wheel is None:
        pytest.skip(f"no wheel for {smoke_interpreter.tag}")
    p = _plugin(native_build, core_wheel, tmp_path, repo)
    probe = ("import json, llama_cpp; print(json.dumps([[s.name, s.path and s.path.name, s.loaded, s.reason, "
             "s.plugin] for s in llama_cpp.backends()]))")
    env = ENV
    index_url = serve_index({"llama-cpp-python": [wheel.path, sdist_file], "llama-cpp-python-vulkan": [p.path]})

    def venv(name: str, spec: str) -> Path:
        return pip_venv(smoke_interpreter, index_url, spec, tmp_path / name, wheel.path)

    def statuses(py: Path) -> list:
        done = subprocess.run([str(py), "-I", "-c", probe], capture_output=True, text=True, timeout=120, env=env,
                              cwd=tmp_path, check=False)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    with_plugin = venv("with", "llama-cpp-python[vulkan]")
    got = statuses(with_plugin)
    mine = [s for s in got if s[4] == "llama-cpp-python-vulkan"]
    assert mine and mine[0][1] == "libggml-vulkan.so" and mine[0][2] is True, got
    assert [s[4] for s in got if s[4] is None and s[0] == "CPU"]  # the core's CPU backends come first
    assert got.index(mine[0]) > max(i for i, s in enumerate(got) if s[4] is None)
    cli = subprocess.run([str(with_plugin), "-I", "-m", "llama_cpp", "backends", "--json"], capture_output=True,
                         text=True, timeout=120, env=env, cwd=tmp_path, check=False)
    assert cli.returncode == 0, cli.stderr
    assert [b["plugin"] for b in json.loads(cli.stdout)["backends"]] == [s[4] for s in got]
    table = subprocess.run([str(with_plugin), "-I", "-m", "llama_cpp", "backends"], capture_output=True, text=True,
                           timeout=120, env=env, cwd=tmp_path, check=False)
    assert re.search(r"libggml-vulkan\.so \(llama-cpp-python-vulkan\) +loaded", table.stdout), table.stdout

    plain = venv("plain", "llama-cpp-python")
    assert not [s for s in statuses(plain) if s[4] or "vulkan" in (s[1] or "")]

    # the plugin of another version, forced in: reported by name with the fix, not loaded
    site = next((with_plugin.parent.parent / "lib").glob("python3*/site-packages"))
    meta = next(site.glob("llama_cpp_python_vulkan-*.dist-info")) / "METADATA"
    meta.write_text(meta.read_text().replace("\nVersion: ", "\nVersion: 9.", 1))
    got = statuses(with_plugin)
    mine = [s for s in got if s[4] == "llama-cpp-python-vulkan"]
    assert len(mine) == 1 and mine[0][2] is False and "pip install llama-cpp-python-vulkan==" in mine[0][3], got
    done = subprocess.run([str(with_plugin), "-I", "-c", "import llama_cpp; llama_cpp.ensure_backends(require_gpu=True)"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=False)
    assert done.returncode != 0 and "plugin llama-cpp-python-vulkan" in done.stderr, done.stderr


def test_plugin_key_of_each_gpu_configuration():
    m = load_matrix()
    keys = {name: plugins.plugin_key(c) for name, c in m.configs.items()}
    assert keys["cuda-13.0"] == "cuda13" and keys["cuda-12.8"] == "cuda12" and keys["vulkan"] == "vulkan"
    assert keys["cpu"] is None


@pytest.mark.slow
def test_the_real_vulkan_plugin_from_a_local_index_offloads_every_layer_on_lavapipe(
        built, repo, tmp_path, smoke_interpreter, sdist_file, serve_index):
    """Issue 30's done-when on the real backend: the plugin wheel made from the Vulkan native build
    validates against the core wheel (its base libraries are the core's bytes), pip installs
    "llama-cpp-python[vulkan]" from a local index holding the core wheel, the sdist and the plugin, and
    in that venv the Vulkan smoke's GPU stages pass on lavapipe: every layer offloaded to the plugin's
    module, greedy tokens, logits and embeddings equal to a CPU-only process's."""
    vk = vulkan_build()
    env = {**ENV, **lavapipe_env()}
    pb = plugin_beside_the_core(vk, built, repo, tmp_path / "plugin", smoke_interpreter)
    models, wheel, p = pb.models, pb.wheel, pb.plugin
    report = plugins.check(p.path, wheel.path)
    assert report.ok, report.render()
    index_url = serve_index({"llama-cpp-python": [wheel.path, sdist_file], "llama-cpp-python-vulkan": [p.path]})
    py = pip_venv(smoke_interpreter, index_url, "llama-cpp-python[vulkan]", tmp_path / "venv", wheel.path)

    out, empty = tmp_path / "report.json", tmp_path / "empty"
    empty.mkdir()
    script = tmp_path / "workload.py"
    shutil.copyfile(runner.WORKLOAD, script)
    done = subprocess.run([str(py), "-I", str(script), "--out", str(out), "--stages", ",".join(FIXTURE_GPU_STAGES),
                           "--version", wheel.version, "--require-gpu", *models.workload_args()],
                          env=env, capture_output=True, text=True, timeout=1200 * runner.load_factor(), cwd=empty,
                          check=False)
    stages = json.loads(out.read_text())["stages"] if out.is_file() else {}
    assert done.returncode == 0, json.dumps(stages, indent=1) + done.stderr[-3000:]
    assert list(stages) == list(FIXTURE_GPU_STAGES)
    assert "libggml-vulkan.so from the installed plugins" in stages["libraries"]["detail"], stages["libraries"]
    assert "llvmpipe" in stages["backends"]["detail"].lower(), stages["backends"]
    for stage in ("generation", "embedding", "mtp"):  # every layer ran on the plugin's Vulkan device
        assert re.search(r"layers \((\d+), \1\)", stages[stage]["detail"]), stages[stage]
    assert "CPU (reference process)" in stages["generation"]["detail"]
