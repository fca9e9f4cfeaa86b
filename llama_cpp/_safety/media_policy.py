"""Resolve an ``image_url`` (data URL, ``file://`` URL or path) under a policy, to bounded bytes.

Local files are refused unless the caller names allowed directories; the path is resolved
(symlinks followed) and must stay inside one of them, and must be a regular file: FIFOs and
devices such as ``/dev/zero`` never reach a read. "Missing" and "not allowed" share one message,
so a request cannot probe which files exist. Sizes are checked before reading, and the pixel count
is read from the PNG/JPEG/GIF/BMP/WebP header before anything decodes the image.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, unquote_to_bytes, urlparse

from .._errors import MultimodalError

DEFAULT_MAX_BYTES = 32 << 20
DEFAULT_MAX_PIXELS = 64 << 20


@dataclass(frozen=True)
class MediaPolicy:
    """Which local directories images may come from, and how large an image may be."""

    allowed_dirs: tuple[Path, ...] = ()
    max_bytes: int = DEFAULT_MAX_BYTES
    max_pixels: int = DEFAULT_MAX_PIXELS

    @classmethod
    def with_dirs(cls, dirs: Sequence[str | os.PathLike[str]] | None, **limits: int) -> MediaPolicy:
        return cls(tuple(Path(d).resolve() for d in dirs or ()), **limits)

    def resolve(self, url: str, where: str = "image_url") -> bytes:
        """The encoded image bytes ``url`` names, or MultimodalError saying why they are refused."""
        if url.startswith("data:"):
            data = self._data_url(url, where)
        else:
            parsed = urlparse(url)
            if parsed.scheme in ("http", "https", "ftp"):
                raise MultimodalError(f"{where}: remote URLs are not fetched ({parsed.scheme}://...): download "
                                      "the image yourself and pass a data: URL or a local file path")
            if parsed.scheme == "file":
                data = self._local(unquote(parsed.path), where)
            elif parsed.scheme and len(parsed.scheme) > 1:  # "c:" is a Windows drive, not a scheme
                raise MultimodalError(f"{where}: unsupported URL scheme {parsed.scheme!r}: "
                                      "use data:, file:// or a path")
            else:
                data = self._local(url, where)
        self._check_pixels(data, where)
        return data

    def check_bytes(self, data: bytes, where: str = "image") -> bytes:
        """Encoded image bytes given directly: the same size and pixel limits as a URL's."""
        if len(data) > self.max_bytes:
            raise MultimodalError(f"{where}: the image is {len(data)} bytes, over the media size limit ({self.max_bytes})")
        self._check_pixels(data, where)
        return data

    def _data_url(self, url: str, where: str) -> bytes:
        header, sep, payload = url.partition(",")
        if not sep:
            raise MultimodalError(f"{where}: a data: URL needs a ',' before its payload")
        if len(payload) * 3 // 4 > self.max_bytes:
            raise MultimodalError(f"{where}: the data: URL holds over {self.max_bytes} bytes (the media size limit)")
        if not header.endswith(";base64"):
            return unquote_to_bytes(payload)
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as e:
            raise MultimodalError(f"{where}: the data: URL is not valid base64 ({e})") from None

    def _local(self, path: str, where: str) -> bytes:
        if not self.allowed_dirs:
            raise MultimodalError(f"{where}: local image paths are refused; name the directories images may "
                                  "come from (media_dirs=[...]) or pass a data: URL")
        unavailable = MultimodalError(f"{where}: no readable image at {path!r} inside the allowed media "
                                      "directories")
        resolved = Path(path).resolve()
        if not any(resolved.is_relative_to(d) for d in self.allowed_dirs):
            raise unavailable
        try:
            fd = os.open(resolved, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            raise unavailable from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen: it raises IsADirectoryError for a folder
            os.close(fd)
            raise unavailable
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if info.st_size > self.max_bytes:
                raise MultimodalError(f"{where}: {path!r} is {info.st_size} bytes, over the media size limit "
                                      f"({self.max_bytes})")
            return f.read(self.max_bytes)

    def _check_pixels(self, data: bytes, where: str) -> None:
        size = image_dimensions(data)
        if size is None:
            raise MultimodalError(f"{where}: not a PNG, JPEG, GIF, BMP or WebP image")
        width, height = size
        if width * height > self.max_pixels:
            raise MultimodalError(f"{where}: the image is {width}x{height} pixels, over the limit of "
                                  f"{self.max_pixels} pixels")


def _jpeg_dimensions(data: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 9 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack_from(">HH", data, i + 5)
            return width, height
        (length,) = struct.unpack_from(">H", data, i + 2)
        i += 2 + length
    return None


def _webp_dimensions(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 " and len(data) >= 30:
        width, height = struct.unpack_from("<HH", data, 26)
        return width & 0x3FFF, height & 0x3FFF
    return None


def image_dimensions(data: bytes) -> tuple[int, int] | None:
    """(width, height) from an image header, without decoding; None for other formats."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        return struct.unpack_from(">II", data, 16)
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack_from("<HH", data, 6)
    if data.startswith(b"BM") and len(data) >= 26:
        width, height = struct.unpack_from("<ii", data, 18)
        return abs(width), abs(height)
    if data.startswith(b"\xff\xd8"):
        return _jpeg_dimensions(data)
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return _webp_dimensions(data)
    return None
