"""Aggregate generation throughput of the server with 1, 4 and 8 concurrent clients.

    python benchmarks/server.py [--gemma] [--threads N] [--n-gen G] [--requests R] [--clients 1,4,8]
                                [--no-llama-server] [--no-stream]
    python benchmarks/server.py --spec draft-eagle3,draft-dflash,draft-dspark,draft-mtp [--large] [--clients 4]
    python benchmarks/server.py --media [--clients 1,4]      (image chat on a projector model)
    python benchmarks/server.py --embed [--clients 1,4]      (embeddings)

Three servers on loopback, the same model, threads, batch sizes and per-request context:

- ``slots``: ``python -m llama_cpp.server --n_parallel 8`` (continuous batching, this project);
- ``serial``: the same with ``--n_parallel 0``, one request at a time (upstream's server);
- ``llama-server``: llama.cpp's own server built from the same tree (``-np 8 --kv-unified``).

``--agent`` runs the agent workload instead: ``--conversations`` chats (8) of ``--turns`` turns (8) at once,
each turn resending the whole history plus a new user message to ``/v1/chat/completions`` (streaming,
greedy, ``G`` tokens), as agent clients do; it reports the median time to first token at the last turn and
the total time, for this server (``slots``), the same with ``--cache_prompt false`` (``cache-off``) and
llama-server with its defaults, each with one slot per conversation or ``--slots N`` (then conversations
move between slots, and what they reuse comes from the prompt cache the slots share, as llama-server's
``--cache-ram``); it also prints this server's prompt-reuse counters from ``/metrics``.

``--spec TYPES`` runs the speculative workload instead: for each type (``none``, ``draft-eagle3``,
``draft-dflash``, ``draft-dspark``, ``draft-mtp``, ``draft-simple``, ``ngram-simple``...) this server on the
hybrid ``qwen35_mtp`` echo fixture (``--large``: ``qwen35_mtp_large``, about 80 M parameters) with that
type's echo-form draft fixture (``draft-mtp-heads``: ``draft-mtp`` on the ``step35_mtp_heads`` echo fixture,
three chained NextN heads; four and the large trunk with ``--large``), once with ``max(--clients)`` slots and once serial (``--n_parallel 0``, one
request at a time, as before the type ran in slots); it prints each one's aggregate tokens/s for every
client count and the ratio slots/serial.

``--media`` and ``--embed`` compare the same way, slots (``max(--clients)``) against one request at a time:
``--media`` the tiny llama fixture (``--gemma``: Gemma 3 270M) with the synthetic vision projector
(``mmproj_vision``, as wide as the model's input), each client sending
``R`` greedy image chats (``/v1/chat/completions``, a 32x32 PNG of four, ``G`` tokens, whole responses; score:
completion tokens/s); ``--embed`` the BERT embedding fixture, each request four short inputs to
``/v1/embeddings`` (base64 vectors; score: input tokens embedded per second; ``--gemma``: Gemma 3 270M's
per-token rows, a model whose decodes cost more than the HTTP round trip).

Each client streams ``R`` greedy completions of ``G`` tokens back to back (``--no-stream``: whole
responses); the score is the sum of ``usage.completion_tokens`` (the last streamed chunk's, with
``stream_options.include_usage``) over the wall time of the whole round (tokens/s), median over
``--reps`` rounds. All servers run at once and the rounds alternate between them (an idle
server uses no CPU), so a busy machine slows each alike. Prints a table and the ratios slots/llama-server and slots/serial; no asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PROMPTS = ["Write a long story about a lighthouse keeper who", "List the planets of the solar system and describe",
           "Explain how a bicycle works, step by step:", "The history of the printing press began",
           "Here is a recipe for bread. First,", "A letter to a friend about a trip to the mountains:",
           "The rules of chess are as follows:", "In the year 2150, the first city on Mars"]


def native_tools(with_server: bool) -> tuple[Path, dict[str, str], Path, bool]:
    """The tools dir, its environment, the libraries, and whether ``llama-server`` is among the tools.

    ``llama-server`` is a CMake target only when the native build was configured with
    ``LLAMA_BUILD_SERVER=ON``; without it the comparison is skipped with a note.
    """
    from build_tools.errors import NativeBuildError
    from build_tools.inputs.configs import load_matrix
    from build_tools.inputs.lock import load_lock
    from build_tools.stages.native import build as native
    from build_tools.stages.vendor import current_tree

    lock = load_lock()
    plan = native.plan(load_matrix().get(os.environ.get("LLAMA_CPP_TEST_CONFIG", "cpu-host")), lock,
                       current_tree(lock))
    nb = native.build(plan)
    if with_server:
        tools = tuple(dict.fromkeys((*native.REFERENCE_TOOLS, "llama-server")))
        try:
            tools_dir = native.build_reference_tools(nb, plan, tools=tools)
            return tools_dir, native.tool_env(tools_dir), nb.lib_dir, True
        except NativeBuildError as exc:
            print(f"llama-server is not available ({str(exc).splitlines()[0]}); comparing without it")
    tools_dir = native.build_reference_tools(nb, plan)
    return tools_dir, native.tool_env(tools_dir), nb.lib_dir, False


def model_path(gemma: bool) -> Path:
    if gemma:
        from tests.runtime.realmodels import gemma_path

        return gemma_path()
    from build_tools.fixtures import fixture_path

    return fixture_path("llama_spm")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, name: str, cmd: list[str], env: dict[str, str], port: int) -> None:
        self.name = name
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float = 300) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{self.name} exited:\n{self.log.read().decode(errors='replace')[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not become ready")

    def measure(self, clients: int, requests: int, n_gen: int, stream: bool) -> float:
        """One round's tokens/s; a failure names this server and shows its log's end."""
        try:
            return round_trip(self.url, clients, requests, n_gen, stream)[0]
        except Exception as exc:
            self.log.seek(0)
            state = "running" if self.proc.poll() is None else f"exited with {self.proc.returncode}"
            raise RuntimeError(f"{self.name} ({state}) failed with {clients} client(s): {exc}\n"
                               f"{self.log.read().decode(errors='replace')[-3000:]}") from exc

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def ours(name: str, model: Path, args: argparse.Namespace, n_parallel: int, lib_dir: Path,
         extra: tuple[str, ...] = ()) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--model_alias", "m", "--port", str(port),
           "--n_parallel", str(n_parallel), "--n_ctx", str(args.n_ctx), "--n_batch", str(args.n_batch),
           "--n_ubatch", str(args.n_batch), "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
           "--max_queue", "64", "--flash_attn", "false",
           "--interrupt_requests", "false", *extra]  # upstream's default would cut the serial server's streams
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(lib_dir)}
    return Server(name, cmd, env, port)


def llama_server(tools: Path, env: dict[str, str], model: Path, args: argparse.Namespace, n_parallel: int) -> Server:
    port = free_port()
    cmd = [str(tools / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
           "-np", str(n_parallel), "-c", str(args.n_ctx * n_parallel), "-b", str(args.n_batch), "-ub",
           str(args.n_batch), "-t", str(args.threads), "-tb", str(args.threads), "-fa", "off", "--kv-unified",
           "--no-webui", "-a", "m"]
    return Server("llama-server", cmd, env, port)


def _streamed_tokens(r) -> int:
    """``usage.completion_tokens`` of a streamed completion (its last chunk carries ``usage``)."""
    tokens = None
    for line in r.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            usage = json.loads(line[6:]).get("usage")
            if usage:
                tokens = usage["completion_tokens"]
    if tokens is None:
        raise RuntimeError("the stream ended without usage")
    return tokens


RETRIES: dict[str, int] = {}  # per server URL: streams retried after a disconnect before any response


def run_together(n: int, work: Callable[[int, threading.Barrier], None]) -> float:
    """``work(k, barrier)`` in ``n`` threads that start together (each waits at ``barrier`` when ready):
    the seconds from the start to the last one's end; the first exception of any is raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(n + 1)

    def run(k: int) -> None:
        try:
            work(k, barrier)
        except BaseException as exc:  # noqa: BLE001 (raised below, in the caller's thread)
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return dt


def round_trip(url: str, clients: int, requests: int, n_gen: int, stream: bool) -> tuple[float, int]:
    """One round: ``clients`` threads each sending ``requests`` completions; (tokens/s, tokens)."""
    import httpx

    total = [0] * clients

    def client(k: int, barrier: threading.Barrier) -> None:
        with httpx.Client(timeout=600) as http:
            barrier.wait()
            for i in range(requests):
                prompt = PROMPTS[(k * requests + i) % len(PROMPTS)]
                body = {"model": "m", "prompt": prompt, "max_tokens": n_gen, "temperature": 0,
                        "repeat_penalty": 1.0, "stream": stream}
                if stream:
                    body["stream_options"] = {"include_usage": True}
                    for attempt in (1, 2):
                        try:
                            with http.stream("POST", url + "/v1/completions", json=body) as r:
                                r.raise_for_status()
                                total[k] += _streamed_tokens(r)
                            break
                        except httpx.RemoteProtocolError:
                            # llama-server has been seen closing a stream before its headers
                            # once in a few hundred requests: retried once, counted, printed
                            if attempt == 2:
                                raise
                            RETRIES[url] = RETRIES.get(url, 0) + 1
                else:
                    r = http.post(url + "/v1/completions", json=body)
                    r.raise_for_status()
                    total[k] += r.json()["usage"]["completion_tokens"]

    dt = run_together(clients, client)
    return sum(total) / dt, sum(total)


def conversation(url: str, k: int, turns: int, n_gen: int, barrier: threading.Barrier) -> list[float]:
    """One agent conversation: each turn resends the history plus a new user message; the time to the
    first streamed content of each turn."""
    import httpx

    history: list[dict[str, str]] = [{"role": "system", "content": "You are a helpful assistant."}]
    ttft = []
    with httpx.Client(timeout=600) as http:
        barrier.wait()
        for turn in range(turns):
            history.append({"role": "user", "content": PROMPTS[(k + turn) % len(PROMPTS)]})
            body = {"model": "m", "messages": history, "max_tokens": n_gen, "temperature": 0, "stream": True}
            for attempt in (1, 2):
                t0 = time.perf_counter()
                first = None
                reply = []
                try:
                    with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
                        r.raise_for_status()
                        for line in r.iter_lines():
                            if not line.startswith("data: ") or line == "data: [DONE]":
                                continue
                            for choice in json.loads(line[6:]).get("choices") or []:
                                text = (choice.get("delta") or {}).get("content")
                                if text:
                                    first = first or time.perf_counter()
                                    reply.append(text)
                    break
                except httpx.RemoteProtocolError:
                    # a disconnect before any response (seen from llama-server, see round_trip): retried once
                    if attempt == 2 or reply:
                        raise
                    RETRIES[url] = RETRIES.get(url, 0) + 1
            ttft.append((first or time.perf_counter()) - t0)
            history.append({"role": "assistant", "content": "".join(reply)})
    return ttft


def agent_round(url: str, conversations: int, turns: int, n_gen: int) -> tuple[float, float]:
    """(median time to first token at the last turn, total seconds) of ``conversations`` at once."""
    out: list[list[float]] = [[] for _ in range(conversations)]

    def run(k: int, barrier: threading.Barrier) -> None:
        out[k] = conversation(url, k, turns, n_gen, barrier)

    dt = run_together(conversations, run)
    return statistics.median(c[-1] for c in out), dt


def reuse_metrics(url: str) -> list[tuple[str, float]]:
    """This server's prompt-reuse counters from ``/metrics``."""
    import httpx

    names = ("prompt_tokens_total", "prompt_tokens_cached_total", "prompt_cache_restored_total",
             "prompt_cache_restored_tokens_total", "prompt_cache_evicted_total", "prompt_cache_bytes")
    out = []
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        name = line.split("{")[0].removeprefix("llamacpp:")
        if name in names:
            out.append((name, float(line.rsplit(" ", 1)[1])))
    return out


def agent_main(args: argparse.Namespace, model: Path, tools: Path, env: dict[str, str], lib_dir: Path,
               have_server: bool) -> None:
    n = args.conversations
    n_slots = args.slots or n
    makers = [lambda: ours("slots", model, args, n_slots, lib_dir),
              lambda: ours("cache-off", model, args, n_slots, lib_dir, ("--cache_prompt", "false"))]
    if have_server:
        makers.append(lambda: llama_server(tools, env, model, args, n_slots))
    servers = [make() for make in makers]
    results: dict[str, tuple[float, float]] = {}
    try:
        for srv in servers:
            srv.wait_ready()
        runs: dict[str, list[tuple[float, float]]] = {srv.name: [] for srv in servers}
        for _ in range(args.reps):  # rounds alternate between the servers, so load from elsewhere hits all alike
            for srv in servers:
                runs[srv.name].append(agent_round(srv.url, n, args.turns, args.n_gen))
        for srv in servers:
            r = runs[srv.name]
            results[srv.name] = (statistics.median(x[0] for x in r), statistics.median(x[1] for x in r))
            print(f"  {srv.name:>12}: last-turn TTFT {results[srv.name][0] * 1000:8.1f} ms, "
                  f"total {results[srv.name][1]:7.2f} s", flush=True)
        print("slots' prompt reuse (/metrics): " + ", ".join(f"{k} {v:g}" for k, v in reuse_metrics(servers[0].url)))
    finally:
        for srv in servers:
            srv.stop()
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    for srv in servers:
        if RETRIES.get(srv.url):
            print(f"{srv.name}: {RETRIES[srv.url]} stream(s) retried after a disconnect before any response")
    for ref in ("llama-server", "cache-off"):
        if ref in results:
            print(f"slots vs {ref}: TTFT {results[ref][0] / results['slots'][0]:.2f}x faster, "
                  f"total {results[ref][1] / results['slots'][1]:.2f}x faster")
    if args.json:
        args.json.write_text(json.dumps({"model": model.name, "threads": args.threads, "agent": {
            "conversations": n, "slots": n_slots, "turns": args.turns, "n_gen": args.n_gen,
            "results": {k: {"last_turn_ttft_s": v[0], "total_s": v[1]} for k, v in results.items()}}}, indent=2))


#: the draft fixture of each speculative type (echo forms: the draft agrees with the echo target)
SPEC_DRAFTS: dict[str, tuple[str, dict[str, str]] | None] = {
    "draft-eagle3": ("eagle3_draft", {"form": "echo"}), "draft-dflash": ("dflash_draft", {"form": "first"}),
    "draft-dspark": ("dflash_draft", {"form": "first", "markov": "chain"}),
    "draft-simple": ("qwen35_mtp", {"form": "echo"}), "draft-mtp": None, "none": None}


def spec_args(kind: str, large: bool) -> tuple[str, ...]:
    """The server arguments that make it speculate with ``kind`` on the (large) echo fixture."""
    from build_tools.fixtures import fixture_path

    if kind == "none":
        return ()
    out = ["--spec_type", "draft-mtp" if kind == "draft-mtp-heads" else kind, "--draft_n_max", "4"]
    draft = SPEC_DRAFTS.get(kind)
    if draft is not None:
        name, kw = draft
        if name == "qwen35_mtp":
            name = "qwen35_mtp_large" if large else name
        else:
            kw = {**kw, "target": "qwen35_mtp_large"} if large else kw
        out += ["--draft_model_path", str(fixture_path(name, **kw))]
    return tuple(out)


def spec_main(args: argparse.Namespace, clients: list[int], lib_dir: Path) -> None:
    """Aggregate tokens/s of each speculative type in slots against the same served one at a time."""
    from build_tools.fixtures import fixture_path

    base = fixture_path("qwen35_mtp_large" if args.large else "qwen35_mtp", form="echo")
    heads = fixture_path("step35_mtp_heads", form="echo", **({"heads": 4, "size": "large"} if args.large else {}))
    kinds = [k.strip() for k in args.spec.split(",") if k.strip()]
    n_parallel = max(clients)
    print(f"speculative workload: model {base.name} ({heads.name} for draft-mtp-heads), threads {args.threads}, {args.n_gen} tokens per request, "
          f"{args.requests} requests per client, median of {args.reps}, load average {os.getloadavg()[0]:.2f}")
    results: dict[str, dict[str, dict[int, float]]] = {}
    for kind in kinds:
        extra = spec_args(kind, args.large)
        model = heads if kind == "draft-mtp-heads" else base
        servers = [ours("slots", model, args, n_parallel, lib_dir, extra), ours("serial", model, args, 0, lib_dir, extra)]
        try:
            for srv in servers:
                srv.wait_ready()
                srv.measure(1, 1, 8, not args.no_stream)  # warm-up
            rates = {srv.name: {c: [] for c in clients} for srv in servers}
            for c in clients:
                for _ in range(args.reps):
                    for srv in servers:  # interleaved: load from elsewhere hits both alike
                        rates[srv.name][c].append(srv.measure(c, args.requests, args.n_gen, not args.no_stream))
                for srv in servers:
                    results.setdefault(kind, {}).setdefault(srv.name, {})[c] = statistics.median(rates[srv.name][c])
                r = results[kind]
                print(f"  {kind:>14} {c} client(s): slots {r['slots'][c]:8.1f} tok/s, serial {r['serial'][c]:8.1f} "
                      f"tok/s, slots/serial {r['slots'][c] / r['serial'][c]:5.2f}x", flush=True)
        finally:
            for srv in servers:
                srv.stop()
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    print("\ntype            clients   slots tok/s  serial tok/s  slots/serial")
    for kind, r in results.items():
        for c in clients:
            print(f"{kind:<15} {c:>7} {r['slots'][c]:13.1f} {r['serial'][c]:13.1f} {r['slots'][c] / r['serial'][c]:12.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"model": base.name, "threads": args.threads, "n_gen": args.n_gen,
                                         "speculative": results}, indent=2))


def _image_chat(http, url: str, k: int, i: int, n_gen: int) -> int:
    """One greedy image chat (a PNG of four by client and request, then a prompt: Gemma with the untrained
    projector ends at once when the image comes last); its completion tokens."""
    import base64

    from build_tools.fixtures import png_bytes

    png = base64.b64encode(png_bytes(seed=(k + i) % 4)).decode()
    body = {"model": "m", "max_tokens": n_gen, "temperature": 0, "repeat_penalty": 1.0, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + png}},
                                     {"type": "text", "text": PROMPTS[(k + i) % len(PROMPTS)]}]}]}
    r = http.post(url + "/v1/chat/completions", json=body)
    r.raise_for_status()
    return r.json()["usage"]["completion_tokens"]


def _embedding(http, url: str, k: int, i: int, n_gen: int) -> int:
    """One embedding request of four inputs; the tokens it embedded."""
    inputs = [PROMPTS[(k + i + j) % len(PROMPTS)] for j in range(4)]
    r = http.post(url + "/v1/embeddings", json={"model": "m", "input": inputs, "encoding_format": "base64"})
    r.raise_for_status()
    return r.json()["usage"]["prompt_tokens"]


def _n_embd(model: Path) -> int:
    """A GGUF model's ``<arch>.embedding_length``."""
    import gguf

    reader = gguf.GGUFReader(str(model), "r")
    arch = reader.get_field("general.architecture").contents()
    return int(reader.get_field(f"{arch}.embedding_length").contents())


def work_round(url: str, clients: int, requests: int, n_gen: int, send) -> float:
    """One round of ``clients`` threads each making ``requests`` calls of ``send``: units (its return) per second."""
    import httpx

    total = [0] * clients

    def client(k: int, barrier: threading.Barrier) -> None:
        with httpx.Client(timeout=600) as http:
            barrier.wait()
            for i in range(requests):
                total[k] += send(http, url, k, i, n_gen)

    return sum(total) / run_together(clients, client)


def slots_vs_serial_main(args: argparse.Namespace, clients: list[int], lib_dir: Path, kind: str) -> None:
    """``--media`` / ``--embed``: aggregate throughput in slots against the same model one request at a time."""
    from build_tools.fixtures import fixture_path

    if kind == "media":  # with --gemma, the synthetic projector made as wide as Gemma's input
        model = model_path(args.gemma)
        proj = fixture_path("mmproj_vision", **({"n_embd_text": _n_embd(model)} if args.gemma else {}))
        extra, send, unit = ("--clip_model_path", str(proj)), _image_chat, "generated tok/s"
    else:  # with --gemma, Gemma 3 270M's per-token rows (pooling none): a model whose decodes cost something
        model = model_path(True) if args.gemma else fixture_path("embedding_model")
        extra, send, unit = ("--embedding", "true"), _embedding, "embedded tok/s"
    n_parallel = max(clients)
    print(f"{kind} workload: model {model.name} {' '.join(extra)}, threads {args.threads}, {args.n_gen} tokens per "
          f"chat, {args.requests} requests per client, median of {args.reps}, load average {os.getloadavg()[0]:.2f}")
    servers = [ours("slots", model, args, n_parallel, lib_dir, extra), ours("serial", model, args, 0, lib_dir, extra)]
    results: dict[str, dict[int, float]] = {}
    try:
        for srv in servers:
            srv.wait_ready()
            work_round(srv.url, 1, 1, 8, send)  # warm-up
        for c in clients:
            rates: dict[str, list[float]] = {srv.name: [] for srv in servers}
            for _ in range(args.reps):
                for srv in servers:  # interleaved: load from elsewhere hits both alike
                    rates[srv.name].append(work_round(srv.url, c, args.requests, args.n_gen, send))
            for srv in servers:
                results.setdefault(srv.name, {})[c] = statistics.median(rates[srv.name])
            print(f"  {c} client(s): slots {results['slots'][c]:9.1f}, serial {results['serial'][c]:9.1f} {unit}, "
                  f"slots/serial {results['slots'][c] / results['serial'][c]:5.2f}x", flush=True)
    finally:
        for srv in servers:
            srv.stop()
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"model": model.name, "workload": kind, "unit": unit, "threads": args.threads,
                                         "n_gen": args.n_gen, "results": results}, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gemma", action="store_true", help="Gemma 3 270M (the realmodels package) instead of the fixture")
    ap.add_argument("--threads", type=int, default=max((os.cpu_count() or 2), 1))
    ap.add_argument("--n-gen", type=int, default=64)
    ap.add_argument("--n-ctx", type=int, default=512, help="context per request (slot)")
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--requests", type=int, default=2, help="requests per client per round")
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-stream", action="store_true", help="whole responses instead of streaming clients")
    ap.add_argument("--no-llama-server", action="store_true", help="skip llama.cpp's server (no tool build)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--agent", action="store_true", help="the agent workload: conversations resending their history")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--slots", type=int, default=0, help="--agent: slots of every server (default: one per "
                    "conversation; fewer move conversations between slots, through the shared prompt cache)")
    ap.add_argument("--spec", help="the speculative workload: comma-separated types (see above)")
    ap.add_argument("--large", action="store_true", help="--spec: the qwen35_mtp_large fixtures")
    ap.add_argument("--media", action="store_true", help="image chat on a projector model, slots against serial")
    ap.add_argument("--embed", action="store_true", help="embeddings, batched against one request at a time")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the servers (finally) when terminated
    if args.media or args.embed:
        tools, env, lib_dir, _ = native_tools(with_server=False)
        slots_vs_serial_main(args, [int(c) for c in args.clients.split(",")], lib_dir,
                             "media" if args.media else "embed")
        return
    if args.spec:
        tools, env, lib_dir, _ = native_tools(with_server=False)
        spec_main(args, [int(c) for c in args.clients.split(",")], lib_dir)
        return
    if args.agent:
        tools, env, lib_dir, have_server = native_tools(with_server=not args.no_llama_server)
        model = model_path(args.gemma)
        print(f"agent workload: model {model.name}, threads {args.threads}, {args.conversations} conversations x "
              f"{args.turns} turns, {args.n_gen} tokens per turn, n_ctx {args.n_ctx} per slot, median of {args.reps}, "
              f"load average {os.getloadavg()[0]:.2f}")
        agent_main(args, model, tools, env, lib_dir, have_server)
        return
    clients = [int(c) for c in args.clients.split(",")]
    n_parallel = max(clients)
    tools, env, lib_dir, have_server = native_tools(with_server=not args.no_llama_server)
    model = model_path(args.gemma)
    print(f"model {model.name}, threads {args.threads}, {args.n_gen} tokens per request, "
          f"{args.requests} requests per client, median of {args.reps}, "
          f"{'streaming' if not args.no_stream else 'whole responses'}, load average {os.getloadavg()[0]:.2f}")

    makers = [("slots", lambda: ours("slots", model, args, n_parallel, lib_dir)),
              ("serial", lambda: ours("serial", model, args, 0, lib_dir))]
    if have_server:
        makers.append(("llama-server", lambda: llama_server(tools, env, model, args, n_parallel)))
    results: dict[str, dict[int, float]] = {}
    servers = [make() for _, make in makers]
    try:
        for srv in servers:
            srv.wait_ready()
            srv.measure(1, 1, 8, not args.no_stream)  # warm-up
        # rounds interleave the servers (idle ones use no CPU), so load from elsewhere hits all alike
        rates: dict[str, dict[int, list[float]]] = {srv.name: {c: [] for c in clients} for srv in servers}
        for c in clients:
            for _ in range(args.reps):
                for srv in servers:
                    rates[srv.name][c].append(srv.measure(c, args.requests, args.n_gen, not args.no_stream))
            for srv in servers:
                results.setdefault(srv.name, {})[c] = statistics.median(rates[srv.name][c])
                print(f"  {srv.name:>12} {c} client(s): {results[srv.name][c]:8.1f} tok/s", flush=True)
    finally:
        for srv in servers:
            srv.stop()

    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    for srv in servers:
        if RETRIES.get(srv.url):
            print(f"{srv.name}: {RETRIES[srv.url]} stream(s) retried after a disconnect before any response")
    print("\nclients " + "".join(f"{n:>14}" for n in results) + "   slots/llama-server   slots/serial")
    for c in clients:
        row = "".join(f"{results[n][c]:14.1f}" for n in results)
        vs_ref = (f"{results['slots'][c] / results['llama-server'][c]:19.2f}x" if "llama-server" in results
                  else " " * 20)
        print(f"{c:>7} {row} {vs_ref} {results['slots'][c] / results['serial'][c]:13.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"model": model.name, "threads": args.threads, "n_gen": args.n_gen,
                                         "results": results}, indent=2))


if __name__ == "__main__":
    main()
