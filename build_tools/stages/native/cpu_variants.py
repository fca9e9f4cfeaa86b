"""The CPU variants a ``GGML_CPU_ALL_VARIANTS`` build must carry, read from ggml's own CMake list
(``validate``'s ``cpu-variants`` check)."""

from __future__ import annotations

import re
from pathlib import Path

from ...errors import ManifestError
from .manifest import NativeManifest

GGML_CPU_LISTS = "ggml/src/CMakeLists.txt"  # where ggml names its CPU variants, relative to the llama.cpp tree
_CMAKE_CALL = re.compile(r"^\s*(if|elseif|else|endif|ggml_add_cpu_backend_variant|message)\s*\((.*)\)\s*(#.*)?$",
                         re.IGNORECASE)
_CPU_VARIANT_LIB = re.compile(r"^(?:lib)?ggml-cpu-(.+)\.(?:so|dll|dylib)$")
_MSVC_COMPILERS = ("cl", "clang-cl")  # CMake sets MSVC for cl and for compilers simulating its command line


def ggml_system_arch(machine: str) -> str:
    """ggml's ``GGML_SYSTEM_ARCH`` for a target processor (``ggml_get_system_arch`` in ggml/cmake/common.cmake)."""
    m = machine.lower()
    if re.fullmatch(r"aarch64|arm.*", m):
        return "ARM"
    if re.fullmatch(r"x86_64|i686|amd64", m):
        return "x86"
    if re.search(r"ppc|power", m):
        return "PowerPC"
    return m


def _cmake_condition(expr: str, env: dict[str, str | bool]) -> bool:
    """The few condition forms ggml's variant list uses: ``X``, ``NOT X``, ``X STREQUAL "v"``,
    ``X MATCHES "re"``; anything else is an error (the list changed shape: extend this on purpose)."""
    words = re.findall(r'"[^"]*"|\S+', expr.strip())
    negate = bool(words) and words[0] == "NOT"
    words = words[1:] if negate else words

    def value(name: str) -> str | bool:
        if name not in env:
            raise ManifestError(f"{GGML_CPU_LISTS}: the CPU variant list tests {name!r}, which the variant "
                                "check does not know: teach build_tools/stages/native/cpu_variants.py its value")
        return env[name]

    if len(words) == 1:
        got = bool(value(words[0]))
    elif len(words) == 3 and words[1] in ("STREQUAL", "MATCHES") and words[2].startswith('"'):
        left, right = str(value(words[0])), words[2].strip('"')
        got = left == right if words[1] == "STREQUAL" else re.search(right, left) is not None
    else:
        raise ManifestError(f"{GGML_CPU_LISTS}: cannot evaluate the condition ({expr.strip()}) of the CPU variant "
                            "list: teach build_tools/stages/native/cpu_variants.py this form")
    return got != negate


def expected_cpu_variants(cmake_lists: str, *, system: str, machine: str, msvc: bool) -> tuple[str, ...]:
    """The CPU variants ``GGML_CPU_ALL_VARIANTS=ON`` builds for a target, read from ggml's own list.

    Evaluates the ``if (GGML_CPU_ALL_VARIANTS)`` block of ``ggml/src/CMakeLists.txt`` for the target
    (``system`` as CMAKE_SYSTEM_NAME, ``machine`` as CMAKE_SYSTEM_PROCESSOR) and returns the
    ``ggml_add_cpu_backend_variant`` names in order; a ``FATAL_ERROR`` reached there is an error.
    """
    env: dict[str, str | bool] = {
        "GGML_CPU_ALL_VARIANTS": True, "GGML_BACKEND_DL": True, "GGML_CPU_ARM_ARCH": False, "GGML_CPU": True,
        "GGML_SYSTEM_ARCH": ggml_system_arch(machine), "CMAKE_SYSTEM_NAME": system, "MSVC": msvc,
        "APPLE": system == "Darwin", "GGML_CXX_SUPPORTS_POWER11": False,
    }
    # Statements joined across continuation lines, so a call is one logical line.
    lines, depth, buf = [], 0, ""
    for raw in cmake_lists.splitlines():
        if raw.lstrip().startswith("#"):
            continue
        buf = f"{buf} {raw.strip()}" if buf else raw
        depth = buf.count("(") - buf.count(")")
        if depth <= 0:
            lines.append(buf)
            buf = ""
    start = next((n for n, line in enumerate(lines) if re.match(r"^\s*if\s*\(\s*GGML_CPU_ALL_VARIANTS\s*\)", line)), None)
    if start is None:
        raise ManifestError(f"{GGML_CPU_LISTS}: no 'if (GGML_CPU_ALL_VARIANTS)' block: ggml's CPU variant list moved")
    variants: list[str] = []
    # Per open if: (this branch is active, some branch was taken, the enclosing block is active)
    stack: list[tuple[bool, bool, bool]] = []
    for line in lines[start:]:
        m = _CMAKE_CALL.match(line)
        if not m:
            continue
        cmd, args = m.group(1).lower(), m.group(2)
        outer = stack[-1][0] if stack else True
        if cmd == "if":
            active = outer and _cmake_condition(args, env)
            stack.append((active, active, outer))
        elif cmd in ("elseif", "else"):
            if not stack:
                raise ManifestError(f"{GGML_CPU_LISTS}: unbalanced {cmd}() in the CPU variant list")
            _, taken, enclosing = stack.pop()
            active = enclosing and not taken and (cmd == "else" or _cmake_condition(args, env))
            stack.append((active, taken or active, enclosing))
        elif cmd == "endif":
            stack.pop()
            if not stack:
                break
        elif not outer:
            continue
        elif cmd == "ggml_add_cpu_backend_variant":
            variants.append(args.split()[0])
        elif args.split()[:1] == ["FATAL_ERROR"]:
            raise ManifestError(f"ggml builds no CPU variants for {system} {machine}: {args.strip()}")
    return tuple(variants)


def cpu_variant_problems(manifest: NativeManifest, source_root: Path) -> list[str]:
    """For a ``GGML_CPU_ALL_VARIANTS=ON`` build: each CPU variant of ggml's list for the build's
    target that the manifest lacks, or that it has beyond the list (empty otherwise)."""
    configure = manifest.cmake.get("configure", [])
    if "-DGGML_CPU_ALL_VARIANTS=ON" not in configure:
        return []
    lists = source_root / GGML_CPU_LISTS
    if not lists.is_file():
        return [f"{lists} is missing: vendor the pinned llama.cpp (python -m build_tools vendor) to check the CPU variants"]
    versions = manifest.toolchain.get("versions", {})
    cross = manifest.config.get("cross") or {}
    system = cross.get("system_name") or versions.get("system") or "Linux"
    machine = cross.get("system_processor") or versions.get("machine") or "x86_64"
    cc = next((a.split("=", 1)[1] for a in configure if a.startswith("-DCMAKE_C_COMPILER=")),
              manifest.toolchain.get("cc") or "")
    msvc = Path(str(cc).replace("\\", "/")).name.lower().removesuffix(".exe") in _MSVC_COMPILERS
    want = expected_cpu_variants(lists.read_text(encoding="utf-8"), system=system, machine=machine, msvc=msvc)
    have = {m.group(1) for lib in manifest.libraries if (m := _CPU_VARIANT_LIB.match(lib.name))}
    where = f"{system} {machine}{' (MSVC)' if msvc else ''}"
    problems = [f"CPU variant {v} is missing: ggml's GGML_CPU_ALL_VARIANTS list builds it for {where} "
                "(a variant that failed to build or was not installed; rebuild the native step)"
                for v in want if v not in have]
    problems += [f"CPU variant {v} is not in ggml's GGML_CPU_ALL_VARIANTS list for {where} ({GGML_CPU_LISTS})"
                 for v in sorted(have - set(want))]
    return problems
