"""Image references resolve only inside allowed directories, to bounded regular files and headers."""

from __future__ import annotations

import base64
import os
import struct
import sys
from pathlib import Path

import pytest

from build_tools.fixtures.media import png_bytes
from llama_cpp._errors import MultimodalError
from llama_cpp._safety.media_policy import MediaPolicy, image_dimensions


@pytest.fixture
def media(tmp_path: Path) -> Path:
    d = tmp_path / "media"
    d.mkdir()
    (d / "ok.png").write_bytes(png_bytes(8, 4))
    (tmp_path / "secret.png").write_bytes(png_bytes(8, 4))
    return d


def test_paths_refused_without_allowed_dirs(media: Path) -> None:
    with pytest.raises(MultimodalError, match="media_dirs"):
        MediaPolicy().resolve(str(media / "ok.png"))


def test_allowed_file_and_file_url(media: Path) -> None:
    policy = MediaPolicy.with_dirs([media])
    assert image_dimensions(policy.resolve(str(media / "ok.png"))) == (8, 4)
    assert policy.resolve((media / "ok.png").as_uri()).startswith(b"\x89PNG")


def test_missing_and_outside_share_one_message(media: Path) -> None:
    policy = MediaPolicy.with_dirs([media])
    (media / "escape.png").symlink_to(media.parent / "secret.png")
    messages = set()
    for name in ["missing.png", "../secret.png", "escape.png"]:
        with pytest.raises(MultimodalError) as info:
            policy.resolve(str(media / name), where="m")
        messages.add(str(info.value).replace(str(media / name), "P"))
    assert len(messages) == 1, messages


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and /dev are POSIX")
def test_fifo_and_devices_refused_without_reading(media: Path, tmp_path: Path) -> None:
    fifo = media / "pipe.png"
    os.mkfifo(fifo)
    policy = MediaPolicy.with_dirs([media, "/dev"])
    for path in [fifo, Path("/dev/zero")]:
        with pytest.raises(MultimodalError, match="no readable image"):
            policy.resolve(str(path))


def test_size_and_pixel_limits(media: Path) -> None:
    (media / "big.png").write_bytes(png_bytes(8, 4) + b"\0" * 2000)
    with pytest.raises(MultimodalError, match="size limit"):
        MediaPolicy.with_dirs([media], max_bytes=1000).resolve(str(media / "big.png"))
    huge = b"\x89PNG\r\n\x1a\n" + struct.pack(">I4sII", 13, b"IHDR", 100000, 100000) + b"\0" * 16
    url = "data:image/png;base64," + base64.b64encode(huge).decode()
    with pytest.raises(MultimodalError, match="100000x100000"):
        MediaPolicy().resolve(url)
    with pytest.raises(MultimodalError, match="size limit"):
        MediaPolicy(max_bytes=10).resolve(url)


@pytest.mark.parametrize(("data", "size"), [
    (b"GIF89a" + struct.pack("<HH", 7, 9), (7, 9)),
    (b"BM" + b"\0" * 16 + struct.pack("<ii", 5, -6), (5, 6)),
    (b"\xff\xd8\xff\xe0\x00\x04\0\0\xff\xc0\x00\x11\x08" + struct.pack(">HH", 3, 2) + b"\0" * 8, (2, 3)),
    (b"RIFF\0\0\0\0WEBPVP8X" + b"\0" * 8 + (9).to_bytes(3, "little") + (4).to_bytes(3, "little"), (10, 5)),
])
def test_header_dimensions(data: bytes, size: tuple[int, int]) -> None:
    assert image_dimensions(data) == size


def test_unknown_format_refused() -> None:
    url = "data:image/x-portable-pixmap;base64," + base64.b64encode(b"P6 100000 100000 255\n").decode()
    with pytest.raises(MultimodalError, match="not a PNG"):
        MediaPolicy().resolve(url)


@pytest.mark.parametrize("part", [
    {"type": "image", "image": "/dev/zero"},
    {"type": "input_image", "image_url": "/etc/passwd"},
    {"type": "image", "image": Path("/dev/zero")},
    {"type": "input_image", "image_url": {"url": "file:///dev/zero"}},
])
def test_image_parts_go_through_the_policy_like_image_url(part) -> None:
    from llama_cpp.mtmd_chat import flatten_messages

    with pytest.raises(MultimodalError, match="local image paths are refused"):
        flatten_messages([{"role": "user", "content": [part, {"type": "text", "text": "describe"}]}], "<m>")


def test_image_part_bytes_get_the_limits_and_inside_paths_work(media: Path) -> None:
    from llama_cpp.mtmd import Image
    from llama_cpp.mtmd_chat import flatten_messages

    policy = MediaPolicy.with_dirs([media], max_pixels=16)
    ok = flatten_messages([{"role": "user", "content": [{"type": "image", "image": str(media / "ok.png")}]}],
                          "<m>", MediaPolicy.with_dirs([media]))[1]
    assert len(ok) == 1 and isinstance(ok[0], Image)
    with pytest.raises(MultimodalError, match="over the limit of 16 pixels"):
        flatten_messages([{"role": "user", "content": [{"type": "image", "image": png_bytes(8, 4)}]}], "<m>", policy)
    with pytest.raises(MultimodalError, match="not a PNG"):
        flatten_messages([{"role": "user", "content": [{"type": "image", "image": b"\0" * 64}]}], "<m>", policy)
