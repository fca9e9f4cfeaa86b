"""``devices``, ``cpu_moe``, ``n_cpu_moe`` and ``override_tensor``: checked before loading, and the
expert tensors land where asked (llama.cpp's own load log), with the same greedy output.

On a machine without a GPU the devices to place on are RPC servers on 127.0.0.1 (see conftest)."""

from __future__ import annotations

import logging
import re

import pytest

from llama_cpp import Llama
from llama_cpp._placement import placement as P

from ._moe import EXPERT_TENSORS, N_LAYER

PROMPT, N_GEN = "hello world", 16


def greedy(llm: Llama) -> str:
    return llm(PROMPT, max_tokens=N_GEN, temperature=0.0)["choices"][0]["text"]


@pytest.fixture(scope="module")
def plain_text(moe_path) -> str:
    with Llama(str(moe_path), n_ctx=256, verbose=False) as llm:
        return greedy(llm)


def load_log(caplog, moe_path, **kw) -> tuple[str, str]:
    """Greedy text and llama.cpp's log of the load (DEBUG: the per-tensor override lines)."""
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="llama_cpp.native"):
        with Llama(str(moe_path), n_ctx=256, verbose=False, **kw) as llm:
            text = greedy(llm)
    return text, "\n".join(r.getMessage() for r in caplog.records if r.name == "llama_cpp.native")


def overridden(log: str) -> dict[str, str]:
    """tensor name -> buffer type, from llama.cpp's 'buffer type overridden to' lines."""
    return dict(re.findall(r"tensor (\S+) \(.*?\) buffer type overridden to (\S+)", log))


def experts(layers) -> set[str]:
    return {f"blk.{i}.{t}.weight" for i in layers for t in EXPERT_TENSORS}


# -- checked before loading ---------------------------------------------------------------------

@pytest.mark.parametrize(("kw", "words"), [
    ({"devices": ["NoSuchGPU0"]}, ["unknown device 'NoSuchGPU0'", "devices to offload to"]),
    ({"devices": ["CPU"]}, ["unknown device 'CPU'", "the CPU is always used"]),
    ({"devices": ["none", "CUDA0"]}, ["'none'"]),
    ({"override_tensor": "exps=NOPE"}, ["unknown buffer type 'NOPE'", "available: CPU"]),
    ({"override_tensor": "ffn_(up=CPU"}, ["'ffn_(up' is not a valid regular expression"]),
    ({"override_tensor": "exps"}, ["'exps' is not 'tensor name pattern=buffer type'"]),
    ({"n_cpu_moe": -1}, ["n_cpu_moe must be an int >= 0"]),
    ({"rpc_servers": "localhost"}, ["'localhost' is not 'host:port'"]),
])
def test_bad_placement_is_a_value_error_naming_it(moe_path, kw, words):
    with pytest.raises(ValueError) as err:
        Llama(str(moe_path), n_ctx=64, verbose=False, **kw)
    for w in words:
        assert w in str(err.value)


def test_cpu_moe_type_checked(moe_path):
    with pytest.raises(TypeError, match="cpu_moe must be a bool"):
        Llama(str(moe_path), n_ctx=64, verbose=False, cpu_moe="yes")


def test_patterns_are_llama_cpps():
    assert P.cpu_moe_overrides(True, 0) == [(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU")]
    assert P.cpu_moe_overrides(False, 2) == [(r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"),
                                             (r"blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU")]
    assert P.parse_override_tensor("a=CPU,b=RPC0[h:1]") == [("a", "CPU"), ("b", "RPC0[h:1]")]
    assert P.parse_override_tensor({"a": "CPU"}) == [("a", "CPU")]
    assert P.parse_override_tensor(["a=CPU,b=CPU", "c=X"]) == [("a", "CPU"), ("b", "CPU"), ("c", "X")]  # as -ot
    assert P.parse_override_tensor({r"x{1,2}": "CPU"}) == [(r"x{1,2}", "CPU")]  # a pattern with a comma


# -- where the experts go -----------------------------------------------------------------------

def test_plain_offload_puts_experts_on_the_remote_devices(moe_path, rpc_pair, plain_text, caplog):
    text, log = load_log(caplog, moe_path, rpc_servers=",".join(rpc_pair), n_gpu_layers=-1)
    assert text == plain_text
    assert overridden(log) == {}
    assert re.search(r"RPC\d\[127\.0\.0\.1:\d+\] model buffer size", log)


@pytest.mark.parametrize(("kw", "on_cpu"), [
    ({"cpu_moe": True}, range(N_LAYER)),
    ({"n_cpu_moe": 2}, range(2)),
    ({"override_tensor": r"blk\.3\.ffn_.*_exps=CPU"}, [3]),
])
def test_experts_stay_on_the_cpu_where_asked(moe_path, rpc_pair, plain_text, caplog, kw, on_cpu):
    text, log = load_log(caplog, moe_path, rpc_servers=",".join(rpc_pair), n_gpu_layers=-1, **kw)
    assert text == plain_text
    assert overridden(log) == dict.fromkeys(experts(on_cpu), "CPU")


def test_override_to_a_remote_buffer_type(moe_path, rpc_pair, plain_text, caplog):
    # every layer on the CPU, the experts of layer 1 on the second server's device
    buft = f"RPC0[{rpc_pair[1]}]"
    text, log = load_log(caplog, moe_path, rpc_servers=",".join(rpc_pair), n_gpu_layers=0,
                         override_tensor=rf"blk\.1\.ffn_.*_exps={buft}")
    assert text == plain_text
    assert overridden(log) == dict.fromkeys(experts([1]), buft)


def test_devices_none_keeps_everything_local(moe_path, rpc_pair, plain_text, caplog):
    text, log = load_log(caplog, moe_path, rpc_servers=",".join(rpc_pair), n_gpu_layers=-1, devices=["none"])
    assert text == plain_text
    assert not re.search(r"RPC\d\[\S+\] model buffer size", log)
    assert "CPU_Mapped model buffer size" in log
