"""Pinned Debian packages used as build inputs without installing them: fetch by pool path with a
sha256 check, and unpack a ``.deb`` (an ``ar`` archive around ``data.tar.*``) in pure Python, so
the manylinux container (no dpkg) and any Linux host read it the same way."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tarfile
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

from ..errors import HashMismatchError, ToolNotFoundError
from .fsutil import staging_dir
from .hashing import sha256_file

log = logging.getLogger(__name__)

DEBIAN_MIRROR = os.environ.get("LLAMA_CPP_DEBIAN_MIRROR", "http://deb.debian.org/debian")


def fetch(pool_path: str, sha256: str, dest_dir: Path, *, mirror: str = DEBIAN_MIRROR, timeout: float = 300) -> Path:
    """``dest_dir/<name>.deb`` for ``pool_path``, downloaded once and checked against ``sha256``."""
    dest = dest_dir / pool_path.rsplit("/", 1)[-1]
    if dest.is_file() and sha256_file(dest) == sha256:
        return dest
    # quoted: a pool name's "+" (an epoch-free version like 1.6.1+1.3.239.0) reads as a space to some mirrors
    url = f"{mirror.rstrip('/')}/{urllib.parse.quote(pool_path.lstrip('/'))}"
    dest_dir.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s", url)
    fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=".deb-", suffix=".part")
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310
            while chunk := resp.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != sha256:
            raise HashMismatchError(f"{url}: sha256 {digest.hexdigest()} is not the pinned {sha256}; the mirror "
                                    "serves another file (update the pin in manifests/configs.toml deliberately)")
        os.replace(tmp, dest)
    except OSError as exc:
        raise ToolNotFoundError(f"could not download {url}: {exc} (set LLAMA_CPP_DEBIAN_MIRROR to a "
                                "reachable Debian mirror)") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def _ar_members(data: bytes) -> dict[str, bytes]:
    if not data.startswith(b"!<arch>\n"):
        raise ValueError("not an ar archive")
    out, at = {}, 8
    while at + 60 <= len(data):
        head = data[at:at + 60]
        name = head[:16].decode("ascii").strip().rstrip("/")
        size = int(head[48:58].decode("ascii").strip())
        out[name] = data[at + 60:at + 60 + size]
        at += 60 + size + (size & 1)
    return out


def extract(deb: Path, dest: Path, prefix: str) -> Path:
    """Unpack the members of ``deb`` under ``prefix`` (e.g. ``usr/include/``) into ``dest``, once;
    only regular files and directories, never a path outside ``dest``."""
    if dest.is_dir():
        return dest
    members = _ar_members(deb.read_bytes())
    data = next((v for k, v in members.items() if k.startswith("data.tar")), None)
    if data is None:
        raise ValueError(f"{deb.name}: no data.tar member")
    with staging_dir(dest) as tmp, tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar.getmembers():
            name = m.name.lstrip("./")
            if not name.startswith(prefix) or ".." in Path(name).parts or not (m.isfile() or m.isdir()):
                continue
            target = tmp / name
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            assert src is not None
            target.write_bytes(src.read())
    return dest
