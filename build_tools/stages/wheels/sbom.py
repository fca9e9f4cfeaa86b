"""A CycloneDX SBOM for each wheel (PEP 770: ``<dist-info>/sboms/llama-cpp-python.cdx.json``).

It records what the wheel carries and where it came from: the llama.cpp commit and source,
the toolchain, every packaged library with its SHA-256, and the system libraries those
libraries need but the wheel deliberately does not carry (``scope: excluded``).
The document is a pure function of its inputs (timestamp from ``SOURCE_DATE_EPOCH``, serial
number derived from the content), so it never breaks reproducibility.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ... import RECIPE_VERSION
from ..native.manifest import NativeManifest

SPEC_VERSION = "1.6"
SBOM_NAME = "llama-cpp-python.cdx.json"
_NAMESPACE = uuid.UUID("8b0e2c1e-5d8a-4f57-9a43-4c1f0f6a7b10")


def _props(items: dict[str, Any]) -> list[dict[str, str]]:
    return [{"name": k, "value": str(v)} for k, v in sorted(items.items()) if v not in (None, "")]


def excluded_libraries(manifest: NativeManifest) -> list[str]:
    """Libraries the packaged ones need that are not packaged (system / driver / NVIDIA wheels)."""
    packaged = {lib.soname or lib.name for lib in manifest.libraries} | {lib.name for lib in manifest.libraries}
    return sorted({n for lib in manifest.libraries for n in lib.needed} - packaged)


def build_sbom(*, name: str, version: str, manifest: NativeManifest, wheel_tag: str, epoch: int,
               lib_prefix: str = "llama_cpp/lib/") -> dict[str, Any]:
    src = manifest.source
    commit = str(src.get("commit", ""))
    build_number = src.get("build_number")
    root_ref = f"pkg:pypi/{name}@{version}"
    llama_ref = f"pkg:github/ggml-org/llama.cpp@{commit}" if commit else "llama.cpp"
    components: list[dict[str, Any]] = [{
        "type": "library",
        "bom-ref": llama_ref,
        "name": "llama.cpp",
        "version": f"b{build_number}" if build_number is not None else commit,
        "licenses": [{"license": {"id": "MIT"}}],
        "externalReferences": [{"type": "vcs", "url": "https://github.com/ggml-org/llama.cpp",
                                "comment": f"commit {commit}"}],
        "properties": _props({
            "llama.cpp:commit": commit,
            "llama.cpp:build_number": build_number,
            "llama.cpp:source": src.get("source"),
            "llama.cpp:tree_sha256": src.get("tree_sha256"),
        }),
    }]
    file_refs = []
    for lib in manifest.libraries:
        ref = f"file:{lib_prefix}{lib.name}"
        file_refs.append(ref)
        components.append({
            "type": "file",
            "bom-ref": ref,
            "name": f"{lib_prefix}{lib.name}",
            "hashes": [{"alg": "SHA-256", "content": lib.sha256}],
            "properties": _props({
                "elf:soname": lib.soname,
                "elf:needed": ",".join(lib.needed),
                "elf:runpath": ":".join(lib.runpath),
                "file:size": lib.size,
            }),
        })
    excluded = excluded_libraries(manifest)
    for soname in excluded:
        components.append({
            "type": "library",
            "bom-ref": f"system:{soname}",
            "name": soname,
            "scope": "excluded",
            "description": "needed at run time, not packaged: provided by the system, the driver or a dependency wheel",
        })
    toolchain = manifest.toolchain.get("versions", {})
    body = {
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "version": 1,
        "metadata": {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)),
            "tools": {"components": [{"type": "application", "name": "llama-cpp-python build_tools",
                                      "version": RECIPE_VERSION}]},
            "component": {"type": "library", "bom-ref": root_ref, "name": name, "version": version,
                          "purl": root_ref},
            "properties": _props({
                "build:config": manifest.config_name,
                "build:native_key": manifest.key,
                "build:wheel_tag": wheel_tag,
                "build:backends": ",".join(manifest.backends),
                **{f"toolchain:{k}": v for k, v in toolchain.items()},
            }),
        },
        "components": components,
        "dependencies": [
            {"ref": root_ref, "dependsOn": [llama_ref, *file_refs]},
            *({"ref": r, "dependsOn": [f"system:{n}" for n in lib.needed if n in excluded]}
              for r, lib in zip(file_refs, manifest.libraries)),
        ],
    }
    serial = uuid.uuid5(_NAMESPACE, json.dumps(body, sort_keys=True))
    return {"bomFormat": body.pop("bomFormat"), "specVersion": body.pop("specVersion"),
            "serialNumber": f"urn:uuid:{serial}", **body}


def render(sbom: dict[str, Any]) -> bytes:
    return (json.dumps(sbom, indent=2, sort_keys=False) + "\n").encode("utf-8")
