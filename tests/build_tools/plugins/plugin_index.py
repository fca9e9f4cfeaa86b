"""A local "PyPI" for the plugin tests: a PEP 503 index on 127.0.0.1 serving chosen files, and a
fresh venv that pip fills from it alone (no index, find-links or constraint of this machine's pip
configuration), the core's own dependencies from the smoke's cached wheelhouse."""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from build_tools.inputs.configs import BuildConfig, load_matrix
from build_tools.inputs.lock import load_lock
from build_tools.stages import plugins, sdist
from build_tools.stages.smoke import runner
from build_tools.stages.smoke.models import fixture_models

# pip and the programs run in the venv see none of this process's package or library settings, nor
# the machine's pip configuration files (an extra index there would offer other NVIDIA wheels).
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_CPP_", "PIP_", "PYTHON", "VK_", "GGML_VK"))},
       "PIP_CONFIG_FILE": os.devnull}


@pytest.fixture(scope="module")
def sdist_file(repo, tmp_path_factory) -> Path:
    """The sdist of the same sources, which the local index serves beside the wheels."""
    from build_tools.common.paths import VENDOR_DIR

    return sdist.build(load_lock(), tmp_path_factory.mktemp("sdist"), repo=repo, tree=VENDOR_DIR).path


@pytest.fixture
def serve_index(tmp_path):
    """serve_index({project: [files]}): a PEP 503 "PyPI" on 127.0.0.1 serving them; returns its /simple/ URL."""
    servers = []

    def serve(files: dict[str, list[Path]]) -> str:
        root = tmp_path / f"pypi{len(servers)}"
        for project, paths in files.items():
            (root / "simple" / project).mkdir(parents=True)
            links = []
            for f in paths:
                dest = root / "simple" / project / f.name
                try:
                    os.link(f, dest)  # NVIDIA's wheels are hundreds of MB
                except OSError:
                    shutil.copyfile(f, dest)
                digest = hashlib.sha256(f.read_bytes()).hexdigest()
                links.append(f'<a href="{f.name}#sha256={digest}">{f.name}</a>')
            (root / "simple" / project / "index.html").write_text("\n".join(links) + "\n")
        handler = functools.partial(_QuietHandler, directory=str(root))
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}/simple/"

    yield serve
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


def pip_venv(interp, index_url: str, spec: str, venv: Path, core_wheel: Path, *, timeout: float = 300) -> Path:
    """A fresh venv of ``interp`` with ``spec`` installed from ``index_url`` (the core's dependencies
    from the smoke's wheelhouse); its python."""
    subprocess.run([str(interp.path), "-m", "venv", str(venv)], check=True, timeout=180, env=ENV)
    py = venv / "bin" / "python"
    deps = runner.dependency_wheelhouse(py, interp, runner.requires_dist(core_wheel), timeout=300)
    done = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           "--index-url", index_url, "--find-links", str(deps), spec],
                          capture_output=True, text=True, timeout=timeout, env=ENV, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return py


@dataclass(frozen=True)
class PluginBuild:
    """A plugin built from a native build, beside the core wheel of the smoke's interpreter."""

    models: Any  # the fixture models the smoke runs
    wheel: Any  # the core wheel
    config: BuildConfig
    plugin: Any  # plugins.build's result


def plugin_beside_the_core(nb: Any, built: Any, repo: Path, out: Path, interpreter: Any) -> PluginBuild:
    """Build ``nb``'s plugin for the core wheel of ``interpreter`` (skips without fixture models or that wheel)."""
    models = fixture_models()
    if models.reason:
        pytest.skip(models.reason)
    wheel = next((w for w in built.wheels if w.python_tag == interpreter.tag), None)
    if wheel is None:
        pytest.skip(f"no wheel for {interpreter.tag}")
    config = load_matrix().get(nb.config.name)
    p = plugins.build(config, nb.manifest, nb.root, out, platform_tag=wheel.platform_tag, repo=repo)
    return PluginBuild(models, wheel, config, p)
