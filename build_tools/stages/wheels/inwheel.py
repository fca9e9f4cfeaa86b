"""Deterministic wheel archives: write, read, and edit-in-place with RECORD rewritten.

Every wheel this project produces goes through :func:`write_wheel`, so the same entries
always give the same bytes: entries sorted (``.dist-info`` last, ``RECORD`` very last),
one timestamp (``SOURCE_DATE_EPOCH``), fixed permissions and one compression level.
:class:`InWheel` unpacks a wheel, lets the caller edit the tree, then rewrites RECORD and
re-zips it the same way (the idea of auditwheel's ``InWheel``, written for this project).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import stat
import tempfile
import time
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ...errors import WheelError

DEFAULT_SOURCE_DATE_EPOCH = 315532800  # 1980-01-01T00:00:00Z: the earliest time a zip entry can hold
COMPRESSION = zipfile.ZIP_DEFLATED
COMPRESS_LEVEL = 6
FILE_MODE = 0o644
EXEC_MODE = 0o755
_WHEEL_NAME = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-(?P<build>\d[^-]*))?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)



@dataclass(frozen=True)
class Entry:
    """One file of a wheel: its archive name, content and whether it is executable (libraries)."""

    name: str
    data: bytes
    executable: bool = False


@dataclass(frozen=True)
class WheelName:
    name: str
    version: str
    build: str | None
    python: str
    abi: str
    platform: str

    @property
    def tag(self) -> str:
        return f"{self.python}-{self.abi}-{self.platform}"

    @property
    def tags(self) -> list[str]:
        """Expanded compressed tag sets (``cp310.cp311`` or ``manylinux_2_17_x86_64.manylinux2014_x86_64``)."""
        return [f"{p}-{a}-{pl}" for p in self.python.split(".") for a in self.abi.split(".")
                for pl in self.platform.split(".")]


def parse_wheel_name(filename: str) -> WheelName:
    m = _WHEEL_NAME.match(filename)
    if not m:
        raise WheelError(f"{filename!r} is not a wheel filename (NAME-VERSION[-BUILD]-PY-ABI-PLATFORM.whl)")
    return WheelName(m["name"], m["version"], m["build"], m["py"], m["abi"], m["plat"])


def source_date_epoch(value: int | str | None = None) -> int:
    """The archive timestamp: ``value``, else ``$SOURCE_DATE_EPOCH``, else the fixed default (≥ 1980)."""
    if value is None:
        value = os.environ.get("SOURCE_DATE_EPOCH") or DEFAULT_SOURCE_DATE_EPOCH
    try:
        epoch = int(value)
    except ValueError:
        raise WheelError(f"SOURCE_DATE_EPOCH={value!r} is not an integer number of seconds") from None
    return max(epoch, DEFAULT_SOURCE_DATE_EPOCH)


def record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def render_record(entries: Iterable[Entry], record_name: str) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for e in entries:
        writer.writerow([e.name, record_hash(e.data), len(e.data)])
    writer.writerow([record_name, "", ""])
    return buf.getvalue().encode("utf-8")


def parse_record(text: str) -> list[tuple[str, str, str]]:
    rows = []
    for i, row in enumerate(csv.reader(io.StringIO(text))):
        if not row:
            continue
        if len(row) != 3:
            raise WheelError(f"RECORD line {i + 1}: expected 3 fields (path,hash,size), got {row!r}")
        rows.append((row[0], row[1], row[2]))
    return rows


def _order(name: str, dist_info: str) -> tuple[int, str]:
    if name == f"{dist_info}/RECORD":
        return (2, name)
    if name.startswith(dist_info + "/"):
        return (1, name)
    return (0, name)


def write_wheel(path: Path, entries: Iterable[Entry], dist_info: str, epoch: int) -> Path:
    """Write ``entries`` plus a fresh RECORD to ``path``, deterministically and atomically."""
    record_name = f"{dist_info}/RECORD"
    files = sorted((e for e in entries if e.name != record_name), key=lambda e: _order(e.name, dist_info))
    names = [e.name for e in files]
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise WheelError(f"duplicate wheel entries: {dupes}")
    for n in names:
        if n.startswith("/") or ".." in n.split("/") or "\\" in n:
            raise WheelError(f"unsafe wheel entry name {n!r}")
    files.append(Entry(record_name, render_record(files, record_name)))
    date_time = time.gmtime(epoch)[:6]
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w") as zf:
            for e in files:
                info = zipfile.ZipInfo(e.name, date_time=date_time)  # type: ignore[arg-type]
                info.compress_type = COMPRESSION
                info.create_system = 3  # Unix, so external_attr carries the permissions
                mode = EXEC_MODE if e.executable else FILE_MODE
                info.external_attr = (stat.S_IFREG | mode) << 16
                zf.writestr(info, e.data, compress_type=COMPRESSION, compresslevel=COMPRESS_LEVEL)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_entries(path: Path) -> list[Entry]:
    """Every file of a wheel (directories skipped), with its executable bit."""
    out = []
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if info.is_dir():
                    continue
                mode = (info.external_attr >> 16) & 0o777
                out.append(Entry(info.filename, zf.read(info), bool(mode & 0o111)))
    except zipfile.BadZipFile as exc:
        raise WheelError(f"{path}: not a valid zip archive ({exc})") from None
    return out


def dist_info_dir(names: Iterable[str]) -> str:
    dirs = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
    if len(dirs) != 1:
        raise WheelError(f"expected exactly one .dist-info directory, found {sorted(dirs)}")
    return dirs.pop()


class InWheel:
    """Unpack a wheel into a temp dir; on a clean exit re-zip it (RECORD rewritten) to ``out``.

    ``out`` defaults to the input path. On an exception nothing is written.
    Inside, the tree is a plain directory: edit, add or remove files freely; the
    ``.dist-info`` directory may be renamed (pass its new name via :attr:`dist_info`).
    """

    def __init__(self, wheel: Path, out: Path | None = None, epoch: int | None = None) -> None:
        self.wheel = Path(wheel)
        self.out = Path(out) if out is not None else self.wheel
        self.epoch = source_date_epoch(epoch)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.root = Path()
        self.dist_info = ""

    def __enter__(self) -> InWheel:  # noqa: PYI034
        self._tmp = tempfile.TemporaryDirectory(prefix="inwheel-")
        self.root = Path(self._tmp.name)
        entries = read_entries(self.wheel)
        self.dist_info = dist_info_dir(e.name for e in entries)
        for e in entries:
            dest = self.root / e.name
            if not dest.resolve().is_relative_to(self.root.resolve()):
                raise WheelError(f"{self.wheel}: entry {e.name!r} escapes the archive root")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(e.data)
            os.chmod(dest, EXEC_MODE if e.executable else FILE_MODE)
        return self

    def entries(self) -> list[Entry]:
        out = []
        for dirpath, _dirs, files in os.walk(self.root):
            for f in files:
                p = Path(dirpath) / f
                rel = p.relative_to(self.root).as_posix()
                out.append(Entry(rel, p.read_bytes(), bool(p.stat().st_mode & 0o111)))
        return out

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc_type is None:
                entries = self.entries()
                write_wheel(self.out, entries, dist_info_dir(e.name for e in entries), self.epoch)
        finally:
            assert self._tmp is not None
            self._tmp.cleanup()


def rewrite(wheel: Path, out: Path, replace: Mapping[str, bytes] | None = None, epoch: int | None = None) -> Path:
    """Copy ``wheel`` to ``out`` re-zipped deterministically, with ``replace``'d entries' contents."""
    entries = read_entries(wheel)
    dist_info = dist_info_dir(e.name for e in entries)
    replace = dict(replace or {})
    entries = [Entry(e.name, replace.pop(e.name, e.data), e.executable) for e in entries]
    entries += [Entry(n, d) for n, d in replace.items()]
    return write_wheel(out, entries, dist_info, source_date_epoch(epoch))
