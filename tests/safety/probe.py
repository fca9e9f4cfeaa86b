"""Run Python code in a fresh interpreter (a crash or hang there fails the test, not the suite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_python(code: str, *args: str, timeout: float = 60, env: dict[str, str] | None = None) -> Any:
    """Run ``code`` (which prints one JSON document last) and return that document; fail on a crash."""
    proc = subprocess.run([sys.executable, "-c", code, *args], check=False, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=dict(env or os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
