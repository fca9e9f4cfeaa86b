"""A bounded load test on loopback: 200 requests from 16 clients, each answered or refused with 429;
memory and file descriptors back where they started."""

from __future__ import annotations

import gc
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from .test_slots import assert_kv_matches_bookkeeping, wait_for

pytestmark = pytest.mark.slow


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# asyncio.to_thread's default executor starts its workers lazily, up to this many per event loop, and
# keeps them (an earlier test's server loop may have left its own)
ASYNCIO_WORKERS = min(32, (os.cpu_count() or 1) + 4)


def threads() -> tuple[int, int]:
    """(threads outside asyncio's default executor, that executor's workers)."""
    names = [t.name for t in threading.enumerate()]
    pool = sum(n.startswith("asyncio_") for n in names)
    return len(names) - pool, pool


def test_200_requests_from_16_clients(start_server, spm_path):
    srv = start_server([{"model": str(spm_path), "model_alias": "m", "n_parallel": 4, "n_ctx": 256,
                         "max_queue": 4}])
    engine = srv.engine("m")

    def one(i: int, http: httpx.Client) -> int:
        body = {"model": "m", "prompt": f"request {i} says", "max_tokens": 8 + i % 17, "temperature": 0.5,
                "seed": i}
        if i % 3 == 0:
            body["stream"] = True
            with http.stream("POST", srv.url + "/v1/completions", json=body) as r:
                if r.status_code == 200:
                    lines = [line for line in r.iter_lines() if line.startswith("data:")]
                    if i % 9 == 0:
                        return 200  # read everything; the others below check the end marker
                    assert lines[-1] == "data: [DONE]"
                return r.status_code
        if i % 7 == 0:  # a client that leaves mid-stream
            with http.stream("POST", srv.url + "/v1/completions", json={**body, "stream": True,
                                                                         "max_tokens": 200}) as r:
                if r.status_code == 200:
                    next(r.iter_lines())
                return r.status_code
        r = http.post(srv.url + "/v1/completions", json=body)
        if r.status_code == 200:
            assert r.json()["usage"]["completion_tokens"] == body["max_tokens"]
        return r.status_code

    def client(k: int) -> list[int]:
        with httpx.Client(timeout=120) as http:
            return [one(i, http) for i in range(k, 200, 16)]

    def run_all() -> list[int]:
        with ThreadPoolExecutor(16) as pool:
            return [s for part in pool.map(client, range(16)) for s in part]

    run_all()  # warm-up: buffers, threads and caches reach their steady size
    assert wait_for(lambda: engine.busy == 0, 60)
    gc.collect()
    rss0, fds0, (threads0, pool0) = rss_kib(), open_fds(), threads()
    statuses = run_all()
    assert len(statuses) == 200
    assert set(statuses) <= {200, 429}, sorted(set(statuses))
    assert statuses.count(200) >= 4
    assert wait_for(lambda: engine.busy == 0, 60)
    assert_kv_matches_bookkeeping(engine)
    gc.collect()
    assert wait_for(lambda: open_fds() <= fds0, 10), (fds0, open_fds())
    assert wait_for(lambda: threads()[0] <= threads0, 10), (threads0, threads())
    assert threads()[1] <= pool0 + ASYNCIO_WORKERS, (pool0, threads())
    assert rss_kib() - rss0 < 8 * 1024, (rss0, rss_kib())
