"""The Windows stand-ins the native-step tests use (MinGW configuration, source snapshot)."""

from ..windows_fakes import win_config, win_repo  # noqa: F401 - fixtures
