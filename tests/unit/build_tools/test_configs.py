"""The build matrix: the committed one resolves; strict validation names the offending key."""

from __future__ import annotations

import copy
import sys

import pytest

from build_tools.common.paths import CONFIGS_FILE
from build_tools.errors import ConfigError
from build_tools.inputs.configs import load_matrix, parse_matrix
from build_tools.inputs.lock import load_lock
from build_tools.stages.native.build import cmake_defines

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


@pytest.fixture()
def raw() -> dict:
    return tomllib.loads(CONFIGS_FILE.read_text())


def test_committed_matrix():
    m = load_matrix()
    assert m.default == "cpu"
    for name in ("cpu", "cpu-host", "cuda-13.0", "cuda-12.8", "cuda-13.0-dev", "cuda-12.8-dev"):
        assert name in m.configs
    cpu, host = m.get("cpu"), m.get("cpu-host")
    assert cpu.cpu_variants == "all" and host.cpu_variants == "single"
    assert dict(host.cmake)["GGML_AVX2"] == "ON" and dict(host.cmake)["GGML_OPENMP"] == "OFF"  # inherited
    cu13 = m.get("cuda-13.0")
    assert cu13.cuda and cu13.cuda.major == 13 and cu13.local_version == "cu130"
    assert m.get("cuda-13.0-dev").cuda.architectures == ("90-real",)


def test_cmake_defines_cover_every_backend():
    m, lock = load_matrix(), load_lock()
    cpu = cmake_defines(m.get("cpu"), lock)
    assert cpu["GGML_BACKEND_DL"] == "ON" and cpu["GGML_CPU_ALL_VARIANTS"] == "ON" and cpu["GGML_NATIVE"] == "OFF"
    assert cpu["LLAMA_BUILD_NUMBER"] == "11312" and cpu["LLAMA_BUILD_COMMIT"] == "0c1e570"
    assert cpu["CMAKE_INSTALL_RPATH"] == "$ORIGIN" and cpu["GGML_CUDA"] == "OFF"
    host = cmake_defines(m.get("cpu-host"), lock)
    assert host["GGML_CPU_ALL_VARIANTS"] == "OFF" and host["GGML_AVX2"] == "ON"
    for name in ("cuda-13.0", "cuda-12.8"):
        cuda = cmake_defines(m.get(name), lock)
        assert cuda["GGML_CUDA"] == "ON"
        assert cuda["CMAKE_CUDA_ARCHITECTURES"] == ";".join(m.get(name).cuda.architectures)
        assert cuda["GGML_CPU_ALL_VARIANTS"] == "ON"  # the CPU side matches the cpu configuration
        assert "GGML_CUDA_FA_QUANTS" in cuda
    vk = cmake_defines(m.get("vulkan"), lock)
    assert vk["GGML_VULKAN"] == "ON" and vk["GGML_CUDA"] == "OFF" and vk["GGML_CPU_ALL_VARIANTS"] == "ON"
    # the other configurations' content keys did not move when Vulkan arrived
    assert all("GGML_VULKAN" not in cmake_defines(c, lock) for c in m.configs.values() if c.backend != "vulkan")


def test_vulkan_configuration():
    vk = load_matrix().get("vulkan")
    assert vk.backend == "vulkan" and vk.variant == "vulkan" and vk.local_version == "vulkan" and vk.release
    assert vk.vulkan is not None and "glslc" in vk.vulkan.apt and "mesa-vulkan-drivers" in vk.vulkan.smoke_apt
    assert vk.vulkan.packages("apt") == vk.vulkan.apt and vk.vulkan.packages("dnf", smoke=True) == vk.vulkan.smoke_dnf
    assert vk.to_json()["vulkan"]["apt"] == list(vk.vulkan.apt)
    assert "vulkan" not in load_matrix().get("cpu").to_json()


def _first(raw: dict, name: str) -> dict:
    return next(c for c in raw["config"] if c["name"] == name)


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda d: d.update(colour="red"), "unknown key 'colour'"),
        (lambda d: _first(d, "cpu").update(optimise=True), "unknown key 'optimise'"),
        (lambda d: _first(d, "cpu").update(backend="rocm"), "backend: 'rocm'"),
        (lambda d: _first(d, "cpu").update(cpu_variants="some"), "cpu_variants"),
        (lambda d: _first(d, "cpu").update(wheel_size_budget_mb=-1), "wheel_size_budget_mb"),
        (lambda d: _first(d, "cpu").update(wheel_size_budget_mb="big"), "wheel_size_budget_mb"),
        (lambda d: _first(d, "cpu").update(local_version="CU 13"), "local_version"),
        (lambda d: _first(d, "cpu").update(cmake={"GGML_BACKEND_DL": False}), "cmake.GGML_BACKEND_DL"),
        (lambda d: _first(d, "cpu").update(cmake={"bad name": 1}), "is not a CMake variable name"),
        (lambda d: _first(d, "cpu").update(cmake={"X": [1]}), "cmake.X"),
        (lambda d: d["config"].append(copy.deepcopy(_first(d, "cpu"))), "duplicate configuration name 'cpu'"),
        (lambda d: _first(d, "cpu-host").update(extends="gpu"), "extends: 'gpu'"),
        (lambda d: _first(d, "cpu").update(extends="cpu-host"), "cycle"),
        (lambda d: _first(d, "cuda-13.0")["cuda"].update(architectures=["sm_90"]), "architectures[0]"),
        (lambda d: _first(d, "cuda-13.0")["cuda"].update(architectures=[]), "at least one architecture"),
        (lambda d: _first(d, "cuda-13.0")["cuda"].update(toolkit="conda"), "toolkit"),
        (lambda d: _first(d, "cuda-13.0")["cuda"].update(packages=["nvidia-cublas>=13"]), "exact pin"),
        (lambda d: _first(d, "cuda-13.0")["cuda"].update(version="13"), "MAJOR.MINOR"),
        (lambda d: _first(d, "cuda-13.0")["cuda"].update(nvcc="x"), "unknown key 'nvcc'"),
        (lambda d: _first(d, "cuda-13.0").pop("cuda"), "needs a [config.cuda] table"),
        (lambda d: _first(d, "cpu").update(cuda={"version": "13.0"}), "only allowed with backend = 'cuda'"),
        (lambda d: _first(d, "vulkan").pop("vulkan"), "needs a [config.vulkan] table"),
        (lambda d: _first(d, "cpu").update(vulkan={"apt": ["glslc"]}), "only allowed with backend = 'vulkan'"),
        (lambda d: _first(d, "vulkan")["vulkan"].update(apt=["glslc; rm -rf /"]), "is not a package name"),
        (lambda d: _first(d, "vulkan")["vulkan"].update(apt=[], dnf=[]), "name the packages"),
        (lambda d: _first(d, "vulkan")["vulkan"].update(pip=["x"]), "unknown key 'pip'"),
        (lambda d: _first(d, "vulkan").update(cmake={"GGML_VULKAN": False}), "cmake.GGML_VULKAN"),
        (lambda d: d.update(default="gpu"), "default: 'gpu'"),
        (lambda d: d.update(schema_version=9), "schema_version"),
    ],
)
def test_bad_matrix_names_the_key(raw, mutate, needle):
    data = copy.deepcopy(raw)
    mutate(data)
    with pytest.raises(ConfigError) as info:
        parse_matrix(data)
    assert needle in str(info.value)


def test_unknown_configuration_lists_the_known_ones():
    with pytest.raises(ConfigError, match="unknown configuration 'gpu'.*cpu-host"):
        load_matrix().get("gpu")


def test_invalid_toml(tmp_path):
    p = tmp_path / "configs.toml"
    p.write_text("[[config]\nname=")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_matrix(p)
