"""``python -m llama_cpp rpc-server``: serve this machine's devices to llama.cpp's RPC clients."""

from __future__ import annotations

import argparse
import os
import sys
import threading

HELP = ("serve this machine's devices over llama.cpp's RPC protocol (ggml's own server; unauthenticated: "
        "binds 127.0.0.1 unless --host says otherwise)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", "-H", default="127.0.0.1", help="address to bind (default 127.0.0.1; the server is "
                   "unauthenticated: never expose it to an open network)")
    p.add_argument("--port", "-p", type=int, default=50052, help="port to listen on (default 50052)")
    p.add_argument("--device", "-d", action="append", default=[],
                   help="device to serve (repeatable or comma-separated; default: every GPU, else the CPU)")
    p.add_argument("--cache-dir", help="keep tensors sent by clients here, so a reload sends only their hashes")
    p.add_argument("--threads", "-t", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                   help="threads of the CPU device")


def run(args: argparse.Namespace) -> int:
    from .._placement import rpc

    if not 0 < args.port < 65536:
        raise SystemExit(f"error: --port {args.port} is not a TCP port")
    devices = [d.strip() for item in args.device for d in item.split(",") if d.strip()] or None
    if args.cache_dir:
        os.makedirs(args.cache_dir, exist_ok=True)
    try:
        rpc.server_devices(devices)  # an unknown --device fails here, with the names this machine has
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # ggml's server blocks in C for good: it runs in a daemon thread so that Ctrl-C or SIGTERM end the process
    done = threading.Event()
    failed: list[BaseException] = []

    def serve() -> None:
        try:
            rpc.start_server(args.host, args.port, devices=devices, cache_dir=args.cache_dir, n_threads=args.threads)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=serve, name="rpc-server", daemon=True).start()
    try:
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        return 0
    if failed:
        raise failed[0]
    print(f"error: the RPC server on {args.host}:{args.port} stopped (port in use, or the address cannot be "
          "bound)", file=sys.stderr)
    return 1
