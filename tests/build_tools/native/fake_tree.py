"""A tiny CMake project shaped like llama.cpp's library targets, for fast native-build tests."""

from __future__ import annotations

from pathlib import Path

from build_tools.common.hashing import tree_hash
from build_tools.stages.vendor import VendoredTree

CMAKE = """
cmake_minimum_required(VERSION 3.18)
project(fake C)
set(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_library(ggml-base SHARED base.c)
set_target_properties(ggml-base PROPERTIES VERSION 0.1.0 SOVERSION 0)
add_library(ggml-cpu MODULE cpu.c)
target_link_libraries(ggml-cpu PRIVATE ggml-base)
add_library(llama SHARED llama.c)
set_target_properties(llama PROPERTIES VERSION 0.5.0 SOVERSION 0)
target_link_libraries(llama PRIVATE ggml-base)
add_dependencies(llama ggml-cpu)
if(DEFINED ENV{FAKE_SLOW_BUILD})
  add_custom_target(slow COMMAND ${CMAKE_COMMAND} -E sleep 60)
  add_dependencies(llama slow)
endif()
add_library(mtmd SHARED mtmd.c)
set_target_properties(mtmd PROPERTIES VERSION 0.5.0 SOVERSION 0)
target_link_libraries(mtmd PRIVATE llama)
add_library(llama-common SHARED common.c)
set_target_properties(llama-common PROPERTIES VERSION 0.5.0 SOVERSION 0)
target_link_libraries(llama-common PRIVATE llama)
add_library(llama-cpp-ext SHARED ext.c)
target_link_libraries(llama-cpp-ext PRIVATE llama-common)
add_library(llama-completion-impl SHARED impl.c)
"""


def make_fake_tree(root: Path, flavour: str = "a") -> VendoredTree:
    root.mkdir(parents=True, exist_ok=True)
    (root / "CMakeLists.txt").write_text(CMAKE)
    (root / "base.c").write_text(
        f'const char *ggml_base_flavour(void) {{ return "{flavour}"; }}\n'
        "const char *ggml_base_source(void) { return __FILE__; }\n"  # as assert messages do
    )
    (root / "cpu.c").write_text("int ggml_cpu_probe(void) { return 1; }\n")
    (root / "llama.c").write_text(
        "const char *ggml_base_flavour(void);\nint llama_fake(void) { return ggml_base_flavour()[0]; }\n"
    )
    (root / "mtmd.c").write_text("int llama_fake(void);\nint mtmd_fake(void) { return llama_fake(); }\n")
    (root / "common.c").write_text("int llama_fake(void);\nint common_fake(void) { return llama_fake(); }\n")
    (root / "ext.c").write_text("int common_fake(void);\nint llama_cpp_ext_api_version(void) { return common_fake(); }\n")
    (root / "impl.c").write_text("int tool_impl(void) { return 0; }\n")  # a tools-only library
    return VendoredTree(root, tree_hash(root), f"path:{root}", "0" * 40, 1)
