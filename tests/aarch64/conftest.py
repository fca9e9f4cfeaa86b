"""What the aarch64 tests find in the cache: the arm64 userland (with qemu registered) and the
cross-built native libraries; each is a skip naming the command that makes it when absent."""

from __future__ import annotations

import pytest

from build_tools.stages.smoke import emulated


def cached_userland() -> emulated.Userland | None:
    """The newest finished arm64 bookworm userland, if qemu-aarch64 is registered with binfmt_misc."""
    root = emulated.cache_root() / "userland"
    done = sorted(root.glob(f"arm64-bookworm-*/{emulated._DONE}")) if root.is_dir() else []
    if not done or not (emulated.BINFMT / "qemu-aarch64").exists():
        return None
    return emulated.Userland(done[-1].parent, "bookworm", done[-1].read_text().strip())


@pytest.fixture(scope="session")
def userland() -> emulated.Userland:
    u = cached_userland()
    if u is None:
        pytest.skip("no cached arm64 userland with qemu registered (nox -s release -- cpu-aarch64 makes it; "
                    "or, as root: python -c 'from build_tools.stages.smoke import emulated; emulated.ensure()')")
    return u
