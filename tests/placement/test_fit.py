"""``fit_params`` gives ``llama-fit-params``' results (same llama.cpp, same fixture, same targets), and
``Llama(fit=True)`` loads with them.

On a machine without a GPU llama.cpp fits the context to the host's total memory less the target
margin, so margins close to the total simulate a small free memory."""

from __future__ import annotations

import re

import pytest

from llama_cpp import Llama, LlamaEmbedding
from llama_cpp._native import loader
from llama_cpp._placement.fit import FitResult, fit_params

MiB = 1024 * 1024


def host_total_mib() -> int:
    cpu = next(d for b in loader.backends() for d in b.devices if d.type == "CPU")
    return cpu.memory_total // MiB


def tool_fit(run_tool, moe_path, margin_mib: int, n_ctx_min: int) -> str | None:
    """llama-fit-params' printed arguments, None when it finds no fit (exit status 1)."""
    try:
        out = run_tool("llama-fit-params", "-m", moe_path, "-c", 0, "-fitt", margin_mib, "-fitc", n_ctx_min)
    except AssertionError as exc:
        if "failed (1)" in str(exc):
            return None
        raise
    return out.stdout.decode().strip()


# room left for the fixture, in MiB: all of it at 65536 tokens (about 100 MiB), less, or too little
@pytest.mark.parametrize("room", [200, 90, 60, 30, 5])
def test_fit_params_gives_the_tools_numbers(run_tool, moe_path, room):
    margin = host_total_mib() - room
    expected = tool_fit(run_tool, moe_path, margin, 1024)
    got = fit_params(moe_path, margins=margin * MiB, n_ctx_min=1024)
    if expected is None:
        assert got.status == "failure"
    else:
        assert got.status == "success"
        assert got.cli_args() == expected


# fit_target: llama.cpp's -fitt (MiB per device), as a Llama / LlamaEmbedding setting
@pytest.mark.parametrize("room", [200, 60, 30])
def test_fit_target_gives_the_tools_numbers(run_tool, moe_path, room):
    margin = host_total_mib() - room

    def tool_n_ctx(*ctx_args: object) -> int:
        out = run_tool("llama-fit-params", "-m", moe_path, "-c", 0, "-fitt", margin, "-fitc", 1024, "-fa", "off",
                       *ctx_args)
        return int(re.match(r"-c (\d+) ", out.stdout.decode()).group(1))

    # Llama's context defaults: batches of 512, one sequence, flash attention off
    expected = tool_n_ctx("-b", 512, "-ub", 512)
    assert 1024 <= expected < 65536
    for target in (margin, str(margin), [margin]):  # an int, -fitt's text, one per device
        with Llama(str(moe_path), n_ctx=0, fit=True, fit_target=target, fit_ctx=1024, verbose=False) as llm:
            assert llm.n_ctx() == expected
    # LlamaEmbedding's: n_ubatch = n_batch, a unified KV cache; the context at most one batch
    with LlamaEmbedding(str(moe_path), n_ctx=0, n_batch=4096, n_seq_max=1, fit=True, fit_target=margin,
                        fit_ctx=1024) as emb:
        assert emb.n_ctx() == min(4096, tool_n_ctx("-b", 4096, "-ub", 4096, "-np", 1))


@pytest.mark.parametrize(("kw", "error", "words"), [
    ({"fit": True, "fit_target": -1}, ValueError, "fit_target must be MiB >= 0 per device"),
    ({"fit": True, "fit_target": "1G"}, ValueError, "fit_target must be MiB per device, e.g. '1024'"),
    ({"fit": True, "fit_target": 1.5}, TypeError, "fit_target must be MiB"),
    ({"fit": True, "fit_ctx": -5}, ValueError, "fit_ctx must be an int >= 0"),
    ({"fit_target": 512}, ValueError, "pass fit=True with them"),
])
def test_fit_target_checked(moe_path, kw, error, words):
    with pytest.raises(error, match=re.escape(words)):
        Llama(str(moe_path), n_ctx=0, verbose=False, **kw)


def test_fit_reduces_the_context_then_loads_with_it(moe_path):
    margin = (host_total_mib() - 60) * MiB
    got = fit_params(moe_path, margins=margin, n_ctx_min=1024)
    assert got.status == "success" and 1024 <= got.n_ctx < 65536
    full = fit_params(moe_path, margins=0)
    assert full == FitResult("success", 65536, -1)


def test_llama_fit_true_fits_n_ctx_zero(moe_path):
    with Llama(str(moe_path), n_ctx=0, fit=True, verbose=False) as llm:
        assert llm.n_ctx() == fit_params(moe_path).n_ctx
    with Llama(str(moe_path), n_ctx=1024, fit=True, verbose=False) as llm:
        assert llm.n_ctx() == 1024  # a context size given is kept, as with llama.cpp's --fit


def test_fit_errors(moe_path, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(64))
    from llama_cpp._errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="could not load"):
        fit_params(bad)
    with pytest.raises(ValueError, match="unknown device: NoSuchGPU"):
        fit_params(moe_path, devices=["NoSuchGPU"])
    with pytest.raises(ValueError, match="margins"):
        fit_params(moe_path, margins=-1)


@pytest.fixture(scope="module")
def big_moe(tmp_path_factory):
    from ._moe import moe_model

    # experts of about 12 MiB a layer, so that margins of a few MiB move layers and experts
    return moe_model(tmp_path_factory.mktemp("moebig") / "moe-big.gguf", n_embd=256, n_ff=512, n_expert=8,
                     n_ctx_train=4096)


@pytest.fixture(scope="module")
def fit_servers(start_rpc_server):
    """Two servers for llama-fit-params and two for this process (ggml's server serves one client at a time)."""
    return [start_rpc_server()[0] for _ in range(2)], [start_rpc_server()[0] for _ in range(2)]


# room left on each of two RPC devices, in MiB: everything fits; layers split and a partial layer
# overflows to the other device; experts move to the CPU; every layer's experts on the CPU
@pytest.mark.parametrize("room", [200, 50, 30, 10])
def test_fit_over_two_rpc_servers_gives_the_tools_numbers(run_tool, fit_servers, big_moe, room):
    from llama_cpp._placement.placement import resolve

    tool_eps, our_eps = fit_servers

    placement = resolve(rpc_servers=our_eps)
    free = min(d.memory_free for b in loader.backends() for d in b.devices if d.name in placement.device_names)
    margin = free // MiB - room
    try:
        out = run_tool("llama-fit-params", "-m", big_moe, "-c", 0, "--rpc", ",".join(tool_eps), "-fitt", margin,
                       "-fitc", 1024)
        expected = out.stdout.decode().strip()
    except AssertionError as exc:
        assert "failed (1)" in str(exc)
        expected = None
    got = fit_params(big_moe, margins=margin * MiB, n_ctx_min=1024, devices=placement.device_names)
    if expected is None:
        assert got.status == "failure"
        return
    for tool_ep, our_ep in zip(tool_eps, our_eps):  # the buffer types are named after the endpoints
        expected = expected.replace(tool_ep, our_ep)
    assert got.status == "success" and got.cli_args() == expected
    if room <= 30:
        assert got.n_cpu_moe >= 2  # experts moved to the CPU, as -ot per-layer patterns


def test_llama_fit_true_applies_layers_split_and_expert_overrides(fit_servers, big_moe, caplog):
    import logging

    from llama_cpp._placement import load

    _tool_eps, our_eps = fit_servers
    with Llama(str(big_moe), n_ctx=1024, verbose=False) as llm:
        plain = llm("hello world", max_tokens=12, temperature=0.0)["choices"][0]["text"]
    expected_devices = load.resolve(rpc_servers=our_eps).device_names
    free = min(d.memory_free for b in loader.backends() if b.name.startswith("RPC[") for d in b.devices)
    margin_mib = free // MiB - 10  # small room, through fit_target (llama.cpp's -fitt)
    expected = fit_params(big_moe, margins=margin_mib * MiB, n_ctx_min=1024, devices=expected_devices)
    assert expected.n_cpu_moe == 4
    with caplog.at_level(logging.DEBUG, logger="llama_cpp.native"):
        with Llama(str(big_moe), n_ctx=0, fit=True, fit_target=margin_mib, fit_ctx=1024, rpc_servers=our_eps,
                   verbose=False) as llm:
            assert llm.n_ctx() == expected.n_ctx
            text = llm("hello world", max_tokens=12, temperature=0.0)["choices"][0]["text"]
    assert text == plain
    log = "\n".join(r.getMessage() for r in caplog.records)
    on_cpu = set(re.findall(r"tensor (blk\.\d+\.ffn_\w+_exps\.weight) \(.*?\) buffer type overridden to CPU", log))
    assert len(on_cpu) == 4 * 3  # every layer's three expert tensors, as the fit chose
    assert f"offloaded {expected.n_gpu_layers}/5 layers to GPU" in log and expected.n_gpu_layers > 0
    for ep in our_eps:  # the rest of each layer on the servers, split as the fit chose
        assert re.search(rf"RPC\d\[{re.escape(ep)}\] model buffer size", log)
