"""The platform stand-ins the wheel and repair tests use: fake PE DLLs (Windows), fake Mach-O dylibs (macOS)."""

from ..macos_fakes import mac_config, mac_native, mac_repo, mac_wheels  # noqa: F401 - fixtures
from ..windows_fakes import fake_native, win_config, win_repo  # noqa: F401 - fixtures
