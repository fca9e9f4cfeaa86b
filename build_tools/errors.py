"""Exceptions raised by the release tooling; each message names the problem and the fix."""


class BuildToolsError(Exception):
    """Base class for every failure of a release step."""


class LockError(BuildToolsError, ValueError):
    """The source lock file is malformed."""


class ConfigError(BuildToolsError, ValueError):
    """The build matrix (configs.toml) is malformed or names an unknown configuration."""


class VendorError(BuildToolsError):
    """Fetching or verifying the pinned llama.cpp source failed."""


class HashMismatchError(VendorError):
    """A downloaded archive or tree does not have the pinned hash."""


class NativeBuildError(BuildToolsError):
    """Configuring or compiling the native libraries failed."""


class ManifestError(BuildToolsError):
    """A native manifest is missing, malformed, or disagrees with the files on disk."""


class SmokeError(BuildToolsError):
    """A smoke run could not complete (venv, install, download); a wheel that fails the workload is a result."""

    exit_code = 1


class SmokeInputError(SmokeError):
    """The smoke step was given something it cannot use: an unknown stage, an unreadable report, a bad bundle."""

    exit_code = 2
