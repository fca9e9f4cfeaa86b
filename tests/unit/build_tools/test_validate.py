"""validate's ``cpu-variants`` check: a GGML_CPU_ALL_VARIANTS build carries every CPU variant that
ggml's own CMake list builds for its target (x86 and arm alike), read from the vendored tree."""

from __future__ import annotations

import hashlib

import pytest

from build_tools.common.paths import VENDOR_DIR
from build_tools.errors import ManifestError
from build_tools.stages.native.cpu_variants import GGML_CPU_LISTS, cpu_variant_problems, expected_cpu_variants
from build_tools.stages.native.manifest import LibraryRecord, NativeManifest

LISTS = VENDOR_DIR / GGML_CPU_LISTS


@pytest.fixture(scope="module")
def ggml_lists() -> str:
    if not LISTS.is_file():
        pytest.skip("the pinned llama.cpp is not vendored: python -m build_tools vendor")
    return LISTS.read_text(encoding="utf-8")


def _manifest(libs: list[str], *, all_variants: bool = True, cross: dict | None = None, cc: str = "/usr/bin/cc",
              system: str = "Linux", machine: str = "x86_64") -> NativeManifest:
    records = tuple(LibraryRecord(f"lib/{n}", hashlib.sha256(n.encode()).hexdigest(), 1) for n in libs)
    config = {"name": "test", **({"cross": cross} if cross else {})}
    return NativeManifest(config=config, key="k" * 64, key_inputs={}, source={},
                          toolchain={"cc": cc, "versions": {"system": system, "machine": machine}},
                          cmake={"configure": [f"-DGGML_CPU_ALL_VARIANTS={'ON' if all_variants else 'OFF'}",
                                               f"-DCMAKE_C_COMPILER={cc}"], "build": []},
                          libraries=records, backends=("cpu",))


ARM = {"system_name": "Linux", "system_processor": "aarch64", "triple": "aarch64-linux-gnu"}
CORE = ["libggml-base.so.0", "libggml.so.0", "libllama.so.0", "libmtmd.so.0"]


def test_arm_variants_come_from_ggmls_list(ggml_lists):
    got = expected_cpu_variants(ggml_lists, system="Linux", machine="aarch64", msvc=False)
    # every architecture level ggml names for Linux arm64, armv8.0 to armv9.2
    assert got[0] == "armv8.0_1" and got[-1] == "armv9.2_2" and len(got) == len(set(got)) >= 8
    assert {"armv8.2_3", "armv8.6_2", "armv9.2_1"} <= set(got)
    assert not any(v.startswith(("android_", "apple_")) for v in got)


def test_x86_variants_follow_msvc_and_apple_branches(ggml_lists):
    linux = expected_cpu_variants(ggml_lists, system="Linux", machine="x86_64", msvc=False)
    msvc = expected_cpu_variants(ggml_lists, system="Windows", machine="AMD64", msvc=True)
    assert linux[0] == "x64" and {"haswell", "zen4", "sapphirerapids"} <= set(linux)
    assert set(msvc) < set(linux) and not {"sapphirerapids", "zen4", "cooperlake"} & set(msvc)
    mac = expected_cpu_variants(ggml_lists, system="Darwin", machine="arm64", msvc=False)
    assert mac and all(v.startswith("apple_") for v in mac)


def test_an_unknown_condition_or_target_is_an_error():
    text = "if (GGML_CPU_ALL_VARIANTS)\n  if (SOMETHING_NEW)\n    ggml_add_cpu_backend_variant(x)\n  endif()\nendif()\n"
    with pytest.raises(ManifestError, match="SOMETHING_NEW"):
        expected_cpu_variants(text, system="Linux", machine="x86_64", msvc=False)
    with pytest.raises(ManifestError, match="no 'if \\(GGML_CPU_ALL_VARIANTS\\)'"):
        expected_cpu_variants("ggml_add_cpu_backend_variant(x)\n", system="Linux", machine="x86_64", msvc=False)


def test_a_missing_or_extra_arm_variant_is_named(ggml_lists, tmp_path):
    want = expected_cpu_variants(ggml_lists, system="Linux", machine="aarch64", msvc=False)
    full = CORE + [f"libggml-cpu-{v}.so" for v in want]
    assert cpu_variant_problems(_manifest(full, cross=ARM), VENDOR_DIR) == []
    lacking = [n for n in full if n != "libggml-cpu-armv9.2_2.so"]
    problems = cpu_variant_problems(_manifest(lacking, cross=ARM), VENDOR_DIR)
    assert len(problems) == 1 and "armv9.2_2 is missing" in problems[0] and "Linux aarch64" in problems[0]
    extra = cpu_variant_problems(_manifest(full + ["libggml-cpu-haswell.so"], cross=ARM), VENDOR_DIR)
    assert len(extra) == 1 and "haswell is not in ggml's" in extra[0]
    # a single-backend build is not checked; a build without the vendored tree says how to get it
    assert cpu_variant_problems(_manifest(CORE + ["libggml-cpu.so"], all_variants=False), VENDOR_DIR) == []
    assert "python -m build_tools vendor" in cpu_variant_problems(_manifest(lacking, cross=ARM), tmp_path)[0]


def test_windows_variant_names_under_msvc_and_mingw(ggml_lists):
    msvc = expected_cpu_variants(ggml_lists, system="Windows", machine="AMD64", msvc=True)
    dlls = ["ggml-base.dll", "ggml.dll", "llama.dll"] + [f"ggml-cpu-{v}.dll" for v in msvc]
    m = _manifest(dlls, cc="C:/LLVM/bin/clang-cl.exe", system="Windows", machine="AMD64")
    assert cpu_variant_problems(m, VENDOR_DIR) == []
    # the same DLLs from a GNU-style clang: ggml also builds the AMX and BF16 variants there
    gnu = cpu_variant_problems(_manifest(dlls, cc="clang", system="Windows", machine="AMD64"), VENDOR_DIR)
    assert any("sapphirerapids is missing" in p for p in gnu)
