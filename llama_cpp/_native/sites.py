"""Where native files are looked for: the library directory (``$LLAMA_CPP_LIB_PATH`` or the
package's ``lib/``) and the site folders that may hold NVIDIA's runtime wheels.

The bottom of :mod:`llama_cpp._native`: the loader, the CUDA runtime preload and the Windows DLL
search all read their paths here, so none of them imports another for a constant.
"""

from __future__ import annotations

import os
import site
import sys
from collections.abc import Iterable
from pathlib import Path

ENV_LIB_PATH = "LLAMA_CPP_LIB_PATH"

PACKAGE_LIB_DIR = Path(__file__).resolve().parent.parent / "lib"
"""The ``lib/`` folder inside the installed package (a wheel's libraries)."""


def site_dirs(extra: Iterable[str | os.PathLike[str]] = ()) -> list[Path]:
    """Folders that may hold the ``nvidia`` namespace package of NVIDIA's runtime wheels, in search
    order (``extra``, ``sys.path``, site-packages, the user's site-packages), each real folder once."""
    candidates: list[str] = [os.fspath(p) for p in extra]
    candidates += [p for p in sys.path if p]
    try:
        candidates += site.getsitepackages()
    except AttributeError:  # some virtualenv builds of site.py lack it
        pass
    try:
        user = site.getusersitepackages()
    except AttributeError:
        user = None
    if isinstance(user, str):
        candidates.append(user)
    out: list[Path] = []
    seen: set[str] = set()
    for c in candidates:
        real = os.path.realpath(c)
        if real in seen or not os.path.isdir(os.path.join(real, "nvidia")):
            continue
        seen.add(real)
        out.append(Path(c))
    return out
