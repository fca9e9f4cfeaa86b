"""What the emulated aarch64 smoke tests find in the cache: the arm64 userlands (with qemu registered);
each is a skip naming the command that makes it when absent."""

from __future__ import annotations

import pytest

from build_tools.stages.smoke import emulated


def cached_userland(suite: str = "bookworm") -> emulated.Userland | None:
    """The newest finished arm64 userland of ``suite``, if qemu-aarch64 is registered with binfmt_misc."""
    root = emulated.cache_root() / "userland"
    done = sorted(root.glob(f"arm64-{suite}-*/{emulated._DONE}")) if root.is_dir() else []
    if not done or not (emulated.BINFMT / "qemu-aarch64").exists():
        return None
    return emulated.Userland(done[-1].parent, suite, done[-1].read_text().strip())


_MAKE = ("nox -s release -- cpu-aarch64-dev (or -- cpu-aarch64) makes them; or, as root: python -c 'from build_tools.stages.smoke "
         "import emulated; emulated.ensure(\"SUITE\")'")


@pytest.fixture(scope="session")
def userland() -> emulated.Userland:
    u = cached_userland()
    if u is None:
        pytest.skip(f"no cached arm64 bookworm userland with qemu registered ({_MAKE.replace('SUITE', 'bookworm')})")
    return u


@pytest.fixture(scope="session")
def userlands() -> tuple[emulated.Userland, ...]:
    """Every suite's cached userland (the release smoke uses them all)."""
    found = {s: cached_userland(s) for s in emulated.SUITES}
    missing = [s for s, u in found.items() if u is None]
    if missing:
        pytest.skip(f"no cached arm64 {', '.join(missing)} userland with qemu registered "
                    f"({_MAKE.replace('SUITE', missing[0])})")
    return tuple(found[s] for s in emulated.SUITES)
