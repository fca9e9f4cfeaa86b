"""Every exception the release tooling raises; each message names the problem and the fix.

``exit_code`` is what ``python -m build_tools`` exits with: 2 for a bad or missing input (fix the
command line or run the step before), 1 for a gate or check that refused, 3 for a tool or step
that failed while running.
"""


class BuildToolsError(Exception):
    """Base class for every failure of a release step."""

    exit_code = 3


# Inputs: the command line, the lock, the matrix, the files a step reads (exit 2).


class InputError(BuildToolsError):
    """A step was given something it cannot use."""

    exit_code = 2


class MissingInputError(InputError):
    """A file or folder a step reads does not exist (usually: run the step before it)."""


class LockError(InputError, ValueError):
    """The source lock file is malformed."""


class ConfigError(InputError, ValueError):
    """The build matrix (configs.toml) is malformed or names an unknown configuration."""


class ManifestError(InputError):
    """A native manifest is missing, malformed, or disagrees with the files on disk."""


class InterpreterError(InputError):
    """A required interpreter is missing (``--strict``)."""


# Gates and checks that refused (exit 1).


class RefusedError(BuildToolsError):
    """A check ran and said no."""

    exit_code = 1


class HashMismatchError(RefusedError):
    """A downloaded archive or tree does not have the pinned hash."""


class ReleaseError(RefusedError):
    """A release gate refused (validation or smoke failed)."""


class PublishError(RefusedError):
    """A file is not cleared for release, or writing the index failed."""


# Tools and steps that failed while running (exit 3).


class ToolNotFoundError(BuildToolsError):
    """An executable a step runs (cmake, a compiler, pip, auditwheel, gh, ...) is not installed."""


class ToolTimeoutError(BuildToolsError):
    """A tool ran past its time limit."""


class VendorError(BuildToolsError):
    """Fetching or unpacking the pinned llama.cpp source failed."""


class NativeBuildError(BuildToolsError):
    """Configuring or compiling the native libraries failed."""


class WheelError(BuildToolsError):
    """A wheel archive is malformed or cannot be written."""


class WheelBuildError(BuildToolsError):
    """Wheel assembly failed (bad metadata, missing sources, or an unwritable output)."""


class RepairError(BuildToolsError):
    """auditwheel is missing, failed, or changed what it must not change."""


class HeaderError(BuildToolsError, RuntimeError):
    """The headers could not be preprocessed or parsed."""


class SmokeError(BuildToolsError):
    """A smoke run could not complete (venv, install, download); a wheel that fails the workload is a result."""

    exit_code = 1


class SmokeInputError(SmokeError):
    """The smoke step was given something it cannot use: an unknown stage, an unreadable report, a bad bundle."""

    exit_code = 2
