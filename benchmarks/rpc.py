"""Generation over llama.cpp's RPC backend: ``Llama(rpc_servers=...)`` vs ``llama-bench --rpc`` built from
the same source, with the model split over two loopback ``rpc-server`` processes, and vs local only.
``Llama(rpc_servers=...)`` holds its model in a worker process (one pipe round trip per call and per
streamed token); the ``rpc_isolation=False`` row is the same model loaded in this process.

    python benchmarks/rpc.py [--model M.gguf] [--threads N] [--n-prompt P] [--n-gen G] [--reps R] [--ngl L]
    python benchmarks/rpc.py --server [--gemma] [--clients 1,4] [--n-gen G] [--reps R] [--no-llama-server]

``--server`` measures what the server's default costs: aggregate streamed tokens/s of
``python -m llama_cpp.server`` with the model over two loopback RPC servers, served from a worker process
one request at a time (the default) against ``--rpc_isolation false`` in the server process, in slots
(one per client of the largest count, batched) and serial (``--n_parallel 0``), at each client count
(``benchmarks/server.py``'s streaming clients, two requests each a round; rounds interleaved), and against
llama.cpp's own ``llama-server -np N --kv-unified --rpc ...`` from the same tree (when the native build has
it). Each server has its own pair of RPC servers. ``--gemma``: Gemma 3 270M instead of the tiny fixture.

The servers are this package's ``python -m llama_cpp rpc-server`` (ggml's own server). ggml's server
serves one client at a time and a process keeps its RPC connections, so llama-bench and ``Llama`` get
a pair of servers each, started alike. Same model, threads, layers (``-ngl``) and split (``-ts 1,1``) on
both sides. llama-bench: pp = one batch of P prompt tokens, tg = G single-token decodes. Ours
(``generation.ours``): prompt = ``Llama.eval`` of P tokens from an empty cache (median of 3); generation =
greedy ``generate`` tokens/s after a short prompt. Prints medians over interleaved repetitions and the ratios (no assertions).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.generation import default_model, native_tools, ours  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_servers(n: int, threads: int) -> tuple[list[str], list[subprocess.Popen]]:
    from llama_cpp._errors import ModelLoadError
    from llama_cpp._placement import rpc

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    eps, procs = [], []
    for _ in range(n):
        port = _free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "llama_cpp", "rpc-server", "--port", str(port),
                                       "--threads", str(threads)], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        eps.append(f"127.0.0.1:{port}")
    for ep in eps:
        for _ in range(300):
            try:
                rpc.probe(ep, timeout=2.0)
                break
            except ModelLoadError:
                time.sleep(0.1)
    return eps, procs


def llama_bench(tools: Path, env: dict[str, str], model: Path, threads: int, n_prompt: int, n_gen: int,
                rpc: list[str] | None, ngl: int) -> tuple[float, float]:
    cmd = [str(tools / "llama-bench"), "-m", str(model), "-p", str(n_prompt), "-n", str(n_gen), "-t", str(threads),
           "-r", "1", "-fa", "0", "-o", "json", "-ngl", str(ngl)]
    if rpc:
        cmd += ["-rpc", ",".join(rpc), "-ts", "/".join("1" for _ in rpc)]
    rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] > 0)
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] > 0)
    return pp, tg


def server_main(a: argparse.Namespace) -> int:
    """The server's RPC model in a worker (serial) against in-process slots: aggregate tokens/s."""
    from benchmarks import server as bs

    tools, env, lib_dir, have_server = bs.native_tools(not a.no_llama_server)
    model = a.model or (bs.model_path(True) if a.gemma else bs.model_path(False))
    clients = [int(c) for c in a.clients.split(",")]
    opts = argparse.Namespace(n_ctx=512, n_batch=512, threads=a.threads)
    eps_w, procs_w = start_servers(2, a.threads)
    eps_s, procs_s = start_servers(2, a.threads)
    eps_p, procs_p = start_servers(2, a.threads)
    procs = procs_w + procs_s + procs_p
    rpc = ("--n_gpu_layers", str(a.ngl), "--tensor_split", "1", "1")
    servers = [bs.ours("worker (default)", model, opts, max(clients), lib_dir, ("--rpc_servers", ",".join(eps_w), *rpc)),
               bs.ours("in-process slots", model, opts, max(clients), lib_dir,
                       ("--rpc_servers", ",".join(eps_s), "--rpc_isolation", "false", *rpc)),
               bs.ours("in-process serial", model, opts, 0, lib_dir,
                       ("--rpc_servers", ",".join(eps_p), "--rpc_isolation", "false", *rpc))]
    if have_server:  # llama.cpp's own server, the same slots over its own pair of RPC servers
        eps_l, procs_l = start_servers(2, a.threads)
        procs += procs_l
        port = bs.free_port()
        cmd = [str(tools / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
               "-np", str(max(clients)), "-c", str(opts.n_ctx * max(clients)), "-b", str(opts.n_batch), "-ub",
               str(opts.n_batch), "-t", str(a.threads), "-tb", str(a.threads), "-fa", "off", "--kv-unified",
               "--no-webui", "-a", "m", "--rpc", ",".join(eps_l), "-ngl", str(a.ngl), "-ts", "1,1"]
        servers.append(bs.Server("llama-server --rpc", cmd, env, port))
    res: dict[tuple[str, int], list[float]] = {}
    try:
        for srv in servers:
            srv.wait_ready()
        for _ in range(a.reps):
            for c in clients:
                for srv in servers:
                    res.setdefault((srv.name, c), []).append(srv.measure(c, 2, a.n_gen, True))
    finally:
        for srv in servers:
            srv.stop()
        for p in procs:
            p.kill()
            p.wait()
    print(f"model {model.name}  threads {a.threads}  gen {a.n_gen}  ngl {a.ngl}  split 1,1 over 2 loopback RPC "
          f"servers  {max(clients)} slots  reps {a.reps}  (aggregate streamed tokens/s, median)")
    print(f"{'clients':>8s}" + "".join(f"{s.name:>20s}" for s in servers) + f"{'slots/worker':>14s}"
          f"{'slots/serial':>14s}" + (f"{'slots/llama-server':>20s}" if have_server else ""))
    for c in clients:
        med = [statistics.median(res[(srv.name, c)]) for srv in servers]
        w, s, p = med[:3]
        print(f"{c:8d}" + "".join(f"{m:20.1f}" for m in med) + f"{s / w:14.3f}{s / p:14.3f}"
              + (f"{s / med[3]:20.3f}" if have_server else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a GGUF (default: the tiny llama fixture)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-prompt", type=int, default=128)
    ap.add_argument("--n-gen", type=int, default=64)
    ap.add_argument("--ngl", type=int, default=99, help="layers on the RPC devices (the rest stay local)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--server", action="store_true", help="the server: worker process (default) vs in-process slots")
    ap.add_argument("--clients", default="1,4", help="--server: concurrent streaming clients per round")
    ap.add_argument("--gemma", action="store_true", help="--server: Gemma 3 270M instead of the tiny fixture")
    ap.add_argument("--no-llama-server", action="store_true", help="--server: leave out llama.cpp's llama-server")
    a = ap.parse_args(argv)
    if a.server:
        return server_main(a)
    tools, env = native_tools()
    model = a.model or default_model(False)
    from llama_cpp import Llama

    with Llama(model, vocab_only=True, verbose=False) as v:
        prompt_tokens = v.tokenize(b" the cat sat on the mat and looked at the house" * 64)[: a.n_prompt]
    bench_eps, procs_b = start_servers(2, a.threads)
    our_eps, procs_o = start_servers(2, a.threads)
    res: dict[str, list[float]] = {k: [] for k in ("pp", "tg", "inproc_pp", "inproc_tg", "bench_pp", "bench_tg",
                                                   "local_pp", "local_tg")}
    try:
        for _ in range(a.reps):  # interleaved, so machine-load drift hits all sides alike
            pp, tg = ours(model, a.threads, prompt_tokens, a.n_gen, rpc_servers=",".join(our_eps),
                          n_gpu_layers=a.ngl, tensor_split=[1.0, 1.0])
            res["pp"].append(pp)
            res["tg"].append(tg)
            ipp, itg = ours(model, a.threads, prompt_tokens, a.n_gen, rpc_servers=",".join(our_eps),
                            n_gpu_layers=a.ngl, tensor_split=[1.0, 1.0], rpc_isolation=False)
            res["inproc_pp"].append(ipp)
            res["inproc_tg"].append(itg)
            bpp, btg = llama_bench(tools, env, model, a.threads, len(prompt_tokens), a.n_gen, bench_eps, a.ngl)
            res["bench_pp"].append(bpp)
            res["bench_tg"].append(btg)
            lpp, ltg = ours(model, a.threads, prompt_tokens, a.n_gen)
            res["local_pp"].append(lpp)
            res["local_tg"].append(ltg)
    finally:
        for p in procs_b + procs_o:
            p.kill()
            p.wait()
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"model {model.name}  threads {a.threads}  prompt {len(prompt_tokens)}  gen {a.n_gen}  ngl {a.ngl}  "
          f"split 1,1 over 2 loopback RPC servers  reps {a.reps}")
    print(f"{'':28s}{'prompt tok/s':>14s}{'gen tok/s':>12s}")
    print(f"{'Llama(rpc_servers=2)':28s}{med['pp']:14.1f}{med['tg']:12.1f}")
    print(f"{'  rpc_isolation=False':28s}{med['inproc_pp']:14.1f}{med['inproc_tg']:12.1f}")
    print(f"{'llama-bench --rpc (2)':28s}{med['bench_pp']:14.1f}{med['bench_tg']:12.1f}")
    print(f"{'Llama, local only':28s}{med['local_pp']:14.1f}{med['local_tg']:12.1f}")
    print(f"ratio vs llama-bench --rpc: prompt {med['pp'] / med['bench_pp']:.3f}  gen {med['tg'] / med['bench_tg']:.3f}")
    print(f"worker vs in-process:       prompt {med['pp'] / med['inproc_pp']:.3f}  gen {med['tg'] / med['inproc_tg']:.3f}")
    print(f"ratio vs local only:        prompt {med['pp'] / med['local_pp']:.3f}  gen {med['tg'] / med['local_tg']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
