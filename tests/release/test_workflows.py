"""The GitHub workflows: valid YAML, the intended job graph, least privilege, every action pinned."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from build_tools.common.interpreters import VERSIONS
from build_tools.inputs.configs import load_matrix
from build_tools.inputs.matrix import ci_matrices
from build_tools.stages.wheels import PYTHON_TAGS

yaml = pytest.importorskip("yaml")

WORKFLOWS = Path(__file__).resolve().parents[2] / ".github" / "workflows"
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
        if job_name not in ("publish", "pypi"):
            assert set(perms.values()) <= {"read"}, f"{job_name} asks for {perms}"


def test_release_job_graph():
    jobs = _load("release.yml")["jobs"]
    assert set(jobs) == {"matrix", "native", "wheels", "smoke", "publish", "pypi"}
    assert _needs(jobs["matrix"]) == set()
    assert _needs(jobs["native"]) == {"matrix"}
    assert _needs(jobs["wheels"]) == {"matrix", "native"}
    assert _needs(jobs["smoke"]) == {"matrix", "wheels"}
    assert _needs(jobs["publish"]) == {"matrix", "native", "wheels", "smoke"}
    assert _needs(jobs["pypi"]) == {"publish"}
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
    cache = next(s for s in steps if s.get("uses", "").startswith("actions/cache@"))
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
