"""Show which compute backends loaded (and why the others did not) and the devices they serve."""

from __future__ import annotations

import argparse
import json

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--system-info", action="store_true", help="also print llama.cpp's system info")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def run(args: argparse.Namespace) -> int:
    from .._native import loader as _loader

    statuses = _loader.backends()
    if args.json:
        doc = {
            "lib_dir": str(_loader.lib_dir()),
            "backends": [
                {"name": s.name, "path": str(s.path) if s.path else None, "plugin": s.plugin, "loaded": s.loaded,
                 "reason": s.reason, "devices": [d.__dict__ for d in s.devices]}
                for s in statuses
            ],
        }
        print(json.dumps(doc, indent=2))
        return 0
    print(f"libraries: {_loader.lib_dir()}")
    rows = [("BACKEND", "FILE", "STATUS", "DETAIL")]
    for s in statuses:
        detail = s.reason or "; ".join(
            f"{d.name} ({d.type}, {d.description}, {_gib(d.memory_free)} free / {_gib(d.memory_total)})"
            for d in s.devices) or ("remote devices come with rpc_servers= (python -m llama_cpp rpc-server serves "
                                    "them)" if s.name == "RPC" else "no devices")
        if s.plugin:  # a plugin wheel's module, or a plugin that could not be used: named by its wheel
            path = f"{s.path.name} ({s.plugin})" if s.path else f"({s.plugin})"
        else:
            path = s.path.name if s.path else ("(remote)" if s.name.startswith("RPC[") else "(built in)")
        rows.append((s.name, path, "loaded" if s.loaded else "not loaded", detail))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3])
    if args.system_info:
        print()
        print(_loader.system_info())
    return 0
