"""``Llama.from_pretrained``'s download through ``huggingface_hub`` (an optional dependency).

A plain file name is fetched directly (so a populated cache works offline, ``HF_HUB_OFFLINE=1``);
a glob pattern is matched against the repository's file list, or, when that cannot be listed
(offline), against the files of the cached snapshot. Exactly one file must match.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import Any

_GLOB = set("*?[")


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise ImportError("Llama.from_pretrained needs the huggingface_hub package: pip install huggingface_hub") from None
    return huggingface_hub


def _repo_files(hub: Any, repo_id: str, cache_dir: Any) -> list[str]:
    try:
        return list(hub.list_repo_files(repo_id))
    except Exception as online_error:  # offline, or the hub refused: fall back to the local snapshot
        try:
            snap = Path(hub.snapshot_download(repo_id, cache_dir=cache_dir, local_files_only=True))
        except Exception:
            raise online_error from None
        return sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file())


def _match(files: list[str], pattern: str, repo_id: str) -> str:
    hits = [f for f in files if fnmatch.fnmatch(f, pattern)]
    if len(hits) != 1:
        what = "No file" if not hits else f"{len(hits)} files ({', '.join(hits[:8])})"
        raise ValueError(f"{what} in {repo_id} match {pattern!r}: give a pattern that matches exactly one of "
                         f"{', '.join(files[:50]) or 'its files'}")
    return hits[0]


def download_model(repo_id: str, filename: str | None, *, additional_files: list[str] | None = None,
                   local_dir: str | os.PathLike[str] | None = None, local_dir_use_symlinks: bool | str = "auto",
                   cache_dir: str | os.PathLike[str] | None = None) -> str:
    """The local path of ``filename`` from ``repo_id`` (downloaded when needed), after the
    ``additional_files``."""
    hub = _hub()
    if not filename:
        raise ValueError("from_pretrained needs filename: the GGUF file (or a glob pattern such as '*Q4_K_M.gguf')")
    hub.utils.validate_repo_id(repo_id)
    patterns = [filename, *(additional_files or [])]
    files: list[str] | None = None
    names = []
    for pattern in patterns:
        if _GLOB & set(pattern):
            if files is None:
                files = _repo_files(hub, repo_id, cache_dir)
            names.append(_match(files, pattern, repo_id))
        else:
            names.append(pattern)
    kwargs: dict[str, Any] = {"cache_dir": cache_dir}
    if local_dir is not None:
        kwargs["local_dir"] = local_dir
    paths = []
    for name in names[1:] + names[:1]:  # the model last: its shards are in place when it loads
        sub, base = os.path.split(name)
        paths.append(hub.hf_hub_download(repo_id=repo_id, filename=base, subfolder=sub or None, **kwargs))
    return str(paths[-1])


__all__ = ["download_model"]
