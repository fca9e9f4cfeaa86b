"""Which manylinux tag ``auditwheel show`` output leads to (CPU wheels and CUDA wheels)."""

from __future__ import annotations

from pathlib import Path

from build_tools.stages.wheels import repair

CPU_SHOW = '''
x.whl is consistent with the following platform tag: "manylinux_2_34_x86_64".
The wheel references external versioned symbols in these system-provided shared libraries: libc.so.6
'''
CUDA_SHOW = '''
x+cu130.whl is
consistent with the following platform tag: "linux_x86_64".

The wheel references external versioned symbols in these
system-provided shared libraries: libcudart.so.13 with versions {'libcudart.so.13'}

This constrains the platform tag to "manylinux_2_35_x86_64". In order
to achieve a more compatible tag, you would need to recompile a new
'''


def test_cpu_wheel_takes_the_consistent_tag(monkeypatch):
    monkeypatch.setattr(repair, "_run", lambda cmd, what: CPU_SHOW)
    assert repair.show_platform(Path("x.whl")) == "manylinux_2_34_x86_64"


def test_cuda_wheel_takes_the_symbol_version_limit(monkeypatch):
    # The CUDA runtime and driver are external (excluded by repair), so `show` calls the wheel
    # "linux_x86_64" as it is; the tag repair can apply is the one the symbol versions allow.
    monkeypatch.setattr(repair, "_run", lambda cmd, what: CUDA_SHOW)
    assert repair.show_platform(Path("x+cu130.whl")) == "manylinux_2_35_x86_64"


def test_a_foreign_architecture_tag_is_applied_with_auto(monkeypatch):
    # auditwheel names only the running machine's policies; `auto` applies show's tag to a cross-built wheel.
    monkeypatch.setattr(repair, "_machine", lambda: "x86_64")
    assert repair.plat_argument("manylinux_2_34_x86_64") == "manylinux_2_34_x86_64"
    assert repair.plat_argument("manylinux_2_34_aarch64") == "auto"
    monkeypatch.setattr(repair, "_machine", lambda: "aarch64")
    assert repair.plat_argument("manylinux_2_34_aarch64") == "manylinux_2_34_aarch64"
