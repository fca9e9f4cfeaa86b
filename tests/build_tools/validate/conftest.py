"""The platform stand-ins validate is tried on: fake PE DLLs and their wheels (Windows), fake Mach-O dylibs (macOS)."""

from ..macos_fakes import mac_config, mac_native, mac_repo, mac_wheels  # noqa: F401 - fixtures
from ..windows_fakes import fake_native, fake_wheels, win_config, win_repo  # noqa: F401 - fixtures
