"""The GitHub workflows: valid YAML, the intended job graph, least privilege, every action pinned."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from build_tools.common.interpreters import VERSIONS
from build_tools.inputs.configs import load_matrix
from build_tools.inputs.matrix import ci_matrices
from build_tools.stages.wheels import PYTHON_TAGS

yaml = pytest.importorskip("yaml")

WORKFLOWS = Path(__file__).resolve().parents[3] / ".github" / "workflows"
PINNED = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@[0-9a-f]{40}$")


def _load(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    assert isinstance(data, dict) and "jobs" in data
    return data


def _needs(job: dict) -> set[str]:
    n = job.get("needs", [])
    return {n} if isinstance(n, str) else set(n)


def _uses(data: dict) -> list[str]:
    return [step["uses"] for job in data["jobs"].values() for step in job.get("steps", []) if "uses" in step] + \
        [job["uses"] for job in data["jobs"].values() if "uses" in job]


@pytest.mark.parametrize("name", ["release.yml", "ci.yml"])
def test_every_action_is_pinned_to_a_commit(name):
    uses = _uses(_load(name))
    assert uses
    for u in uses:
        assert PINNED.match(u), f"{name}: {u} is not pinned to a 40-hex commit SHA"
    text = (WORKFLOWS / name).read_text()
    for line in text.splitlines():
        if "uses:" in line and "@" in line:
            assert re.search(r"# v\d", line), f"{name}: say which release a SHA is: {line.strip()}"


@pytest.mark.parametrize("name", ["release.yml", "ci.yml"])
def test_no_permissions_by_default(name):
    data = _load(name)
    assert data["permissions"] == {}
    for job_name, job in data["jobs"].items():
        perms = job.get("permissions", {})
        assert isinstance(perms, dict), job_name
        if job_name not in ("publish", "pypi", "pages"):
            assert set(perms.values()) <= {"read"}, f"{job_name} asks for {perms}"


def test_release_job_graph():
    jobs = _load("release.yml")["jobs"]
    assert set(jobs) == {"matrix", "native", "wheels", "smoke", "publish", "pypi", "pages"}
    assert _needs(jobs["matrix"]) == set()
    assert _needs(jobs["native"]) == {"matrix"}
    assert _needs(jobs["wheels"]) == {"matrix", "native"}
    assert _needs(jobs["smoke"]) == {"matrix", "wheels"}
    assert _needs(jobs["publish"]) == {"matrix", "native", "wheels", "smoke"}
    assert _needs(jobs["pypi"]) == {"publish"}
    assert _needs(jobs["pages"]) == {"publish"}
    smoke_run = " ".join(s.get("run", "") for s in jobs["smoke"]["steps"])
    assert "--strict" in smoke_run and "build_tools smoke" in smoke_run
    assert "refs/tags/v" in jobs["publish"]["if"]


def test_matrices_come_from_build_tools_matrix():
    """Every matrix is ``fromJSON`` of the matrix job's outputs; no configuration or Python list in YAML."""
    jobs = _load("release.yml")["jobs"]
    runs = " ".join(s.get("run", "") for s in jobs["matrix"]["steps"])
    assert "build_tools matrix" in runs
    outputs = jobs["matrix"]["outputs"]
    for name in ("native", "wheels", "smoke"):
        matrix = jobs[name]["strategy"]["matrix"]
        assert isinstance(matrix, str) and matrix.startswith("${{ fromJSON(needs.matrix.outputs."), name
        assert matrix.removeprefix("${{ fromJSON(needs.matrix.outputs.").split(")")[0] in outputs
    gate = next(s for s in jobs["publish"]["steps"] if "--merge-reports" in s.get("run", ""))
    for where, text in [*((n, yaml.safe_dump(jobs[n])) for n in ("native", "wheels", "smoke")), ("gate", gate["run"])]:
        # a step for one backend names the backend, not a configuration (the vulkan one shares its name)
        text = re.sub(r"matrix\.backend == '[a-z]+'", "matrix.backend == BACKEND", text)
        for config in load_matrix().configs.values():
            assert not re.search(rf"(?<![\w.-]){re.escape(config.name)}(?![\w.-])", text), \
                f"release.yml {where} names {config.name}: take it from the matrix job"
        assert not re.search(r"\b3\.1[0-4]\b", text), f"release.yml {where} lists Python versions"
    assert gate["env"]["CONFIGS"] == "${{ needs.matrix.outputs.names }}"


def test_matrix_command_reads_configs_toml():
    matrices = ci_matrices()
    release = [c.name for c in load_matrix().configs.values() if c.release]
    assert [row["config"] for row in matrices["configs"]["include"]] == release
    assert [(r["config"], r["python"]) for r in matrices["smoke"]["include"]] == \
        [(c, v) for c in release for v in VERSIONS]
    assert matrices["names"].split() == release
    assert [f"cp{v.replace('.', '')}" for v in matrices["python"]] == list(PYTHON_TAGS)
    assert "cpu-host" not in release and "cpu" in release


def test_each_configuration_runs_on_its_own_machine():
    """aarch64 builds, repairs and smoke-tests natively on GitHub's arm64 runners, in the arm64 manylinux image."""
    from build_tools.inputs import matrix as ci

    matrices = ci_matrices()
    rows = {r["config"]: r for r in matrices["configs"]["include"]}
    assert rows["cpu"]["runner"] == "ubuntu-24.04" and rows["cpu"]["container"].endswith("manylinux_2_28_x86_64")
    assert rows["cpu-aarch64"]["runner"] == "ubuntu-24.04-arm"
    assert rows["cpu-aarch64"]["container"] == "quay.io/pypa/manylinux_2_28_aarch64"
    for r in matrices["smoke"]["include"]:
        assert r["runner"] == rows[r["config"]]["runner"]
    jobs = _load("release.yml")["jobs"]
    for name in ("native", "wheels", "smoke"):
        assert jobs[name]["runs-on"] == "${{ matrix.runner }}", name
    for name in ("native", "wheels"):
        assert jobs[name]["container"] == "${{ matrix.container }}", name
    assert "container" not in jobs["smoke"]  # a user's machine: setup-python's interpreter, no image
    cache = next(s for s in jobs["native"]["steps"] if s.get("uses", "").startswith("actions/cache@"))
    assert "matrix.runner" in cache["with"]["key"]  # an arm64 build never restores an x86-64 one
    import dataclasses

    from build_tools.errors import ConfigError
    from build_tools.inputs.configs import CrossSpec

    riscv = dataclasses.replace(load_matrix().get("cpu-aarch64"), name="cpu-riscv",
                                cross=CrossSpec(triple="riscv64-linux-gnu", system_processor="riscv64", apt=("g++",)))
    with pytest.raises(ConfigError, match="no runner for Linux riscv64"):
        ci.runner(riscv)


def test_trusted_publishing_and_attestations():
    jobs = _load("release.yml")["jobs"]
    pypi = jobs["pypi"]
    assert pypi["permissions"] == {"id-token": "write"}
    assert pypi["environment"]["name"] == "pypi"
    step = next(s for s in pypi["steps"] if s.get("uses", "").startswith("pypa/gh-action-pypi-publish@"))
    assert "password" not in step.get("with", {})  # OIDC, no stored token
    publish = jobs["publish"]
    assert publish["permissions"]["attestations"] == "write" and publish["permissions"]["id-token"] == "write"
    assert any(s.get("uses", "").startswith("actions/attest-build-provenance@") for s in publish["steps"])
    gate = " ".join(s.get("run", "") for s in publish["steps"])
    assert "--merge-reports" in gate and "build_tools publish" in gate


def test_native_is_cached_by_content_key_and_handed_over_as_artifact():
    jobs = _load("release.yml")["jobs"]
    steps = jobs["native"]["steps"]
    assert any("--print-key" in s.get("run", "") for s in steps)
    caches = [s for s in steps if s.get("uses", "").startswith("actions/cache@")]
    cache = next(s for s in caches if "steps.key.outputs.dir" in s["with"]["path"])
    assert "steps.key.outputs.key" in cache["with"]["key"]
    assert any(s.get("uses", "").startswith("actions/upload-artifact@") for s in steps)
    wheel_runs = " ".join(s.get("run", "") for s in jobs["wheels"]["steps"])
    assert "--native-root" in wheel_runs and "build_tools validate" in wheel_runs


def test_checkout_does_not_persist_credentials():
    for name in ("release.yml", "ci.yml"):
        for job in _load(name)["jobs"].values():
            for s in job.get("steps", []):
                if s.get("uses", "").startswith("actions/checkout@"):
                    assert s["with"]["persist-credentials"] is False


def test_python_lists_that_cannot_read_the_one_list_agree_with_it():
    """pyproject's classifiers (wheel METADATA) and ci.yml's setup-python list are checked, not generated."""
    import tomllib

    pyproject = tomllib.loads((WORKFLOWS.parents[1] / "pyproject.toml").read_text())
    classified = [c.rsplit(" :: ", 1)[1] for c in pyproject["project"]["classifiers"]
                  if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert classified == list(VERSIONS)
    setup = next(s for s in _load("ci.yml")["jobs"]["tests"]["steps"] if s.get("uses", "").startswith(
        "actions/setup-python@"))
    assert sorted(str(setup["with"]["python-version"]).split(), key=lambda v: tuple(map(int, v.split(".")))) \
        == list(VERSIONS)


PLATFORM_JOBS = ("native", "wheels", "smoke")


# Released since cuda_toolkit.py provisions Windows toolkits (the WINDOWS layout); the helper below
# still forces release = true, so their rows stay checked should one be held back again.
WINDOWS_CUDA = ("cuda-12.8-windows", "cuda-13.0-windows")


def _released_windows_cuda():
    import dataclasses

    m = load_matrix()
    configs = {n: (dataclasses.replace(c, release=True) if n in WINDOWS_CUDA else c) for n, c in m.configs.items()}
    return dataclasses.replace(m, configs=configs)


def _rows() -> dict[str, dict]:
    return {r["config"]: r for r in ci_matrices(_released_windows_cuda())["configs"]["include"]}


def test_windows_cuda_is_released_with_its_toolkit():
    from build_tools.stages.native import cuda_toolkit

    names = ci_matrices()["names"].split()
    assert set(WINDOWS_CUDA) <= set(names)
    assert cuda_toolkit.WINDOWS.nvcc(Path("root")).name == "nvcc.exe"  # the layout they are built with


def test_windows_and_macos_rows_run_on_their_runner_without_a_container():
    """Every release configuration's row follows RUNNERS by its target; Windows and macOS name no image
    and get setup-python's interpreter for the tool, Linux rows keep their manylinux image's."""
    from build_tools.inputs import matrix as ci

    rows = _rows()
    for config in _released_windows_cuda().configs.values():
        if not config.release:
            continue
        row = rows[config.name]
        assert (row["runner"], row["container"]) == ci.RUNNERS[config.target], config.name
        assert row["tool_python"] == ("" if row["container"] else ci.TOOL_PYTHON), config.name
    for name in ("cpu-windows-msvc", "cuda-12.8-windows", "cuda-13.0-windows"):
        assert rows[name]["runner"] == "windows-2022" and rows[name]["container"] == ""
        assert (rows[name]["cc"], rows[name]["cxx"]) == ("clang", "clang++")
    assert rows["metal"]["runner"] == "macos-14" and rows["metal"]["container"] == "" and rows["metal"]["cc"] == ""
    assert rows["cpu"]["cc"] == "" and rows["cpu"]["tool_python"] == ""
    # CUDA 12's nvcc from NVIDIA's archives on Windows; CUDA 13 from its PyPI wheels (no system toolkit)
    assert rows["cuda-12.8-windows"]["windows_cuda"] == ci.WINDOWS_CUDA["12.8"]
    assert "cuda_nvcc" in rows["cuda-12.8-windows"]["windows_cuda_components"].split()
    assert rows["cuda-13.0-windows"]["windows_cuda"] == "" and rows["cuda-12.8"]["windows_cuda"] == ""
    smoke = [(r["config"], r["python"], r["runner"]) for r in ci_matrices()["smoke"]["include"]]
    for name in ("cpu-windows-msvc", "metal"):
        assert [(c, v) for c, v, _r in smoke if c == name] == [(name, v) for v in VERSIONS]


def test_a_windows_configuration_without_a_cuda_release_is_refused(monkeypatch):
    from build_tools.errors import ConfigError
    from build_tools.inputs import matrix as ci

    monkeypatch.setattr(ci, "WINDOWS_CUDA", {})
    with pytest.raises(ConfigError, match="no Windows CUDA 12.8 release"):
        ci.ci_matrices(_released_windows_cuda())
    monkeypatch.undo()
    monkeypatch.delitem(ci.RUNNERS, ("Darwin", "arm64"))
    with pytest.raises(ConfigError, match="metal: the release workflow has no runner for Darwin arm64"):
        ci.ci_matrices()


def test_platform_jobs_run_bash_everywhere_and_say_so_where_they_do_not():
    """Git Bash on Windows: the jobs that run there default to bash; a step in another shell is a
    Windows-only step (its ``if`` says so)."""
    jobs = _load("release.yml")["jobs"]
    for name in PLATFORM_JOBS:
        job = jobs[name]
        assert job["defaults"]["run"]["shell"] == "bash", name
        for step in job["steps"]:
            if "run" in step and step.get("shell", "bash") != "bash":
                assert "runner.os == 'Windows'" in step.get("if", ""), (name, step.get("name"))


def test_platform_jobs_get_their_interpreter_from_the_row():
    jobs = _load("release.yml")["jobs"]
    for name in ("native", "wheels"):
        job = jobs[name]
        setup = [s for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python@")]
        assert len(setup) == 1 and setup[0]["if"] == "matrix.tool_python != ''", name
        assert setup[0]["with"]["python-version"] == "${{ matrix.tool_python }}", name
        assert job["env"]["PYTHON"] == "${{ matrix.container != '' && 'python3.12' || 'python' }}", name
        for step in job["steps"]:
            run = step.get("run", "")
            assert not re.search(r"(?<![\w\"$])python3?(\.\d+)? -m", run), (name, run)  # always "$PYTHON"
        assert job["container"] == "${{ matrix.container }}"
    smoke = jobs["smoke"]
    setup = next(s for s in smoke["steps"] if s.get("uses", "").startswith("actions/setup-python@"))
    assert setup["with"]["python-version"] == "${{ matrix.python }}" and "if" not in setup


def test_windows_steps_set_up_msvc_and_cuda_only_on_windows():
    steps = _load("release.yml")["jobs"]["native"]["steps"]
    msvc = next(s for s in steps if "vcvars64" in s.get("run", ""))
    assert msvc["if"] == "runner.os == 'Windows'" and msvc["shell"] == "cmd"
    assert msvc["env"] == {"ROW_CC": "${{ matrix.cc }}", "ROW_CXX": "${{ matrix.cxx }}"}
    assert "GITHUB_ENV" in msvc["run"] and "CUDAHOSTCXX=cl" in msvc["run"]
    dnf = next(s for s in steps if "dnf install" in s.get("run", ""))
    assert dnf["if"] == "matrix.system_cuda != '' && runner.os == 'Linux'"
    win_cuda = next(s for s in steps if "redistrib_" in s.get("run", ""))
    assert win_cuda["if"] == "matrix.windows_cuda != ''"
    assert win_cuda["env"]["CUDA_RELEASE"] == "${{ matrix.windows_cuda }}"
    assert "sha256sum -c" in win_cuda["run"] and "CUDA_HOME=" in win_cuda["run"]
    # the native build travels as a tar Python writes and reads, whatever the runner's path syntax
    pack = next(s for s in steps if "tarfile" in s.get("run", ""))
    assert pack["env"]["NATIVE_DIR"] == "${{ steps.key.outputs.dir }}"
    unpack = " ".join(s.get("run", "") for s in _load("release.yml")["jobs"]["wheels"]["steps"])
    assert "-m tarfile -e" in unpack and "tar -C" not in unpack


def test_the_publish_gate_covers_every_platform():
    """The gate loops over ``names`` (every release configuration, Windows and macOS too) and needs
    every smoke cell; PyPI gets the wheels without a local version (the cpu variant: Windows and macOS too)."""
    names = ci_matrices()["names"].split()
    for name in ("cpu-windows-msvc", "metal"):
        assert name in names
    assert set(WINDOWS_CUDA) <= set(ci_matrices(_released_windows_cuda())["names"].split())
    jobs = _load("release.yml")["jobs"]
    assert {"smoke", "wheels"} <= _needs(jobs["publish"])
    m = load_matrix()
    assert {m.get(n).variant for n in ("cpu-windows-msvc", "metal")} == {"cpu"}
    pypi = next(s for s in jobs["publish"]["steps"] if "pypi/" in s.get("run", ""))
    assert 'release-assets/llama_cpp_python-"$version"-*.whl' in pypi["run"]  # no local version: not +cu130


def test_vulkan_glslc_comes_from_pinned_sources_in_the_manylinux_image():
    """AlmaLinux 8 (manylinux_2_28) packages no glslc: the native step builds it from the sources
    pinned in vulkan_toolchain.py, cached by them, before the content key is computed."""
    rows = [r for r in ci_matrices(load_matrix())["configs"]["include"] if r["backend"] == "vulkan"]
    assert rows and all("manylinux_2_28" in r["container"] for r in rows)
    steps = _load("release.yml")["jobs"]["native"]["steps"]
    runs = " ".join(s.get("run", "") for s in steps)
    assert not re.search(r"(dnf|yum)[^\n]*install[^\n]*glslc", runs)  # no package to install there
    names = [s.get("name", "") for s in steps]
    glslc = next(s for s in steps if "toolchains/glslc-" in s.get("with", {}).get("path", ""))
    assert glslc["uses"].startswith("actions/cache@") and glslc["if"] == "matrix.backend == 'vulkan'"
    assert "hashFiles('build_tools/stages/native/vulkan_toolchain.py')" in glslc["with"]["key"]
    assert steps.index(glslc) < names.index("Content key")


def _publish_step() -> dict:
    steps = _load("release.yml")["jobs"]["publish"]["steps"]
    return next(s for s in steps if "build_tools publish" in s.get("run", ""))


def test_the_hosted_index_is_merged_then_deployed():
    """Each release fetches what Pages serves, merges into it (never rewriting an entry) and deploys the
    result; the sdist goes to PyPI beside the cpu wheels."""
    jobs = _load("release.yml")["jobs"]
    publish = " ".join(s.get("run", "") for s in jobs["publish"]["steps"])
    assert "build_tools publish" in publish and "--merge-from" in publish and "build_tools sdist" in publish
    assert "dist/sdist/llama_cpp_python-" in publish
    upload = next(s for s in jobs["publish"]["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "dist/index/"
    pages = jobs["pages"]
    assert pages["permissions"] == {"pages": "write", "id-token": "write"}
    assert [s.get("uses", "").split("@")[0] for s in pages["steps"]][:2] == ["actions/deploy-pages",
                                                                             "actions/download-artifact"]
    assert pages["steps"][1]["with"] == {"name": "index", "path": "merged"}


def test_tag_runs_share_one_concurrency_group():
    """Two releases at once would both merge into the same published index, and the later deploy would
    drop the other's entries: tag runs queue behind each other; pull requests keep a group each."""
    group = _load("release.yml")["concurrency"]["group"]
    assert "startsWith(github.ref, 'refs/tags/') && 'tags'" in group and "|| github.ref" in group


SERVED = "The site serves this release's merge (every variant's lists as merged; retried while the CDN catches up)"


def test_the_pages_job_checks_the_deployed_site_serves_the_merge(tmp_path):
    import functools
    import http.server
    import threading

    step = next(s for s in _load("release.yml")["jobs"]["pages"]["steps"] if s.get("name") == SERVED)
    merged = {"whl/cpu/release-manifest.json": '{"files": [1, 2]}', "whl/cpu/SHA256SUMS": "ab  x.whl\n",
              "whl/cu130/release-manifest.json": '{"files": [3]}', "whl/cu130/SHA256SUMS": "cd  y.whl\n"}
    for rel, text in merged.items():
        for top in ("work/merged", "site"):
            (tmp_path / top / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / top / rel).write_text(text)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "site"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {**os.environ, **step["env"], "PAGE_URL": f"http://127.0.0.1:{server.server_address[1]}/",
           "TRIES": "2", "WAIT_S": "0"}
    try:
        run = functools.partial(subprocess.run, ["bash", "-e", "-c", step["run"]], cwd=tmp_path / "work", env=env,
                                capture_output=True, text=True, timeout=60, check=False)
        done = run()
        assert done.returncode == 0, done.stdout + done.stderr
        # another release deployed over this one: an entry of ours is missing from what is served
        (tmp_path / "site/whl/cpu/release-manifest.json").write_text('{"files": [1]}')
        done = run()
        assert done.returncode != 0 and "whl/cpu/release-manifest.json" in done.stdout
    finally:
        server.shutdown()
        server.server_close()


def test_new_entries_link_to_this_tags_release_assets_uploaded_and_checked_before_pages():
    """The links and the upload name one tag and one repository; publish uploads and checks the
    assets (names, URLs) in the step that writes the index, before the Pages artifact exists."""
    step = _publish_step()
    env, run = step["env"], step["run"]
    assert env["TAG"] == "${{ github.ref_name }}"
    assert env["ASSETS_URL"] == "https://github.com/${{ github.repository }}/releases/download/${{ github.ref_name }}/"
    assert env["GH_TOKEN"] == "${{ github.token }}"
    for flag in ('--link-base "$ASSETS_URL"', '--github-release "$TAG"', "--assets release-assets",
                 '--merge-from "$INDEX_URL"'):
        assert flag in run
    steps = _load("release.yml")["jobs"]["publish"]["steps"]
    pages = next(i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert steps.index(step) < pages
    assert not any("gh release" in s.get("run", "") for s in steps)  # one upload, the checked one
    attest = next(s for s in steps if s.get("uses", "").startswith("actions/attest-build-provenance@"))
    assert attest["with"]["subject-path"] == "release-assets/*.whl"


def _run_step(name: str, tmp_path: Path, files: dict[str, str]) -> subprocess.CompletedProcess:
    step = next(s for s in _load("release.yml")["jobs"]["publish"]["steps"] if s.get("name") == name)
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return subprocess.run(["bash", "-e", "-c", step["run"]], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)


PAGES_ONLY = "The Pages site holds the index pages only (its links point at the release assets)"


def test_the_pages_artifact_refuses_anything_but_the_index_pages(tmp_path):
    pages = {"dist/index/whl/index.html": "", "dist/index/whl/cu130/index.html": "",
             "dist/index/whl/cu130/llama-cpp-python/index.html": "", "dist/index/whl/cu130/SHA256SUMS": "",
             "dist/index/whl/cu130/release-manifest.json": ""}
    done = _run_step(PAGES_ONLY, tmp_path / "ok", pages)
    assert done.returncode == 0, done.stdout + done.stderr
    wheel = "dist/index/whl/cu130/llama-cpp-python/llama_cpp_python-0.4.0+cu130-cp312-cp312-linux_x86_64.whl"
    done = _run_step(PAGES_ONLY, tmp_path / "stray", {**pages, wheel: "w"})
    assert done.returncode != 0 and "llama_cpp_python-0.4.0+cu130" in done.stdout


def test_plugin_wheels_are_built_beside_the_wheels_and_checked_before_publishing():
    jobs = _load("release.yml")["jobs"]
    wheels = " ".join(s.get("run", "") for s in jobs["wheels"]["steps"])
    assert "build_tools plugins" in wheels and "--no-check" in wheels
    publish_steps = jobs["publish"]["steps"]
    runs = [s.get("run", "") for s in publish_steps]
    check = next(i for i, r in enumerate(runs) if "build_tools plugins" in r and "--check-only" in r)
    assert "build_tools publish" in runs[check]
    assert runs[check].index("--check-only") < runs[check].index("build_tools publish")
    assert any("plugins/*.whl" in r and "pypi/" in r for r in runs)
