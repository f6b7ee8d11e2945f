"""Image token costs by the providers' published rules.

OpenAI (GPT-4o family): ``detail: low`` costs 85; otherwise the image is fitted into 2048x2048,
its short side scaled down to 768, and it costs 170 per 512-px tile plus 85.
Anthropic: the long edge is scaled to at most 1568 px and the image costs width*height/750.
Dimensions are read from the image header when the image is inline (base64); for a remote URL
they are unknown and the rule's typical maximum is assumed (and the count stays an estimate).
"""

from __future__ import annotations

import base64
import binascii
import math
import struct

OPENAI_UNKNOWN_SIZE = (1024, 1024)
ANTHROPIC_UNKNOWN_TOKENS = 1600


def image_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG, GIF, WebP or JPEG header; None when unrecognised."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        w, h = struct.unpack(">II", data[16:24])
        return int(w), int(h)
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        w, h = struct.unpack("<HH", data[6:10])
        return int(w), int(h)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 30:
        chunk = data[12:16]
        if chunk == b"VP8X":
            w = 1 + int.from_bytes(data[24:27], "little")
            h = 1 + int.from_bytes(data[27:30], "little")
            return w, h
        if chunk == b"VP8L":
            bits = int.from_bytes(data[21:25], "little")
            return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        if chunk == b"VP8 ":
            w, h = struct.unpack("<HH", data[26:30])
            return int(w & 0x3FFF), int(h & 0x3FFF)
        return None
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                return None
            marker = data[i + 1]
            length = struct.unpack(">H", data[i + 2 : i + 4])[0]
            if marker in (
                0xC0,
                0xC1,
                0xC2,
                0xC3,
                0xC5,
                0xC6,
                0xC7,
                0xC9,
                0xCA,
                0xCB,
                0xCD,
                0xCE,
                0xCF,
            ):
                h, w = struct.unpack(">HH", data[i + 5 : i + 9])
                return int(w), int(h)
            i += 2 + length
    return None


def size_from_base64(b64: str) -> tuple[int, int] | None:
    """Decode just enough of a base64 image to read its header."""
    head = b64[:65536]
    head = head[: len(head) - len(head) % 4]
    try:
        return image_size(base64.b64decode(head, validate=False))
    except (binascii.Error, ValueError):
        return None


def size_from_data_url(url: str) -> tuple[int, int] | None:
    if not url.startswith("data:"):
        return None
    _, _, payload = url.partition(",")
    return size_from_base64(payload)


def openai_image_tokens(size: tuple[int, int] | None, detail: str = "auto") -> int:
    if detail == "low":
        return 85
    iw, ih = size or OPENAI_UNKNOWN_SIZE
    if iw <= 0 or ih <= 0:
        return 85
    scale = min(1.0, 2048 / max(iw, ih))
    w, h = iw * scale, ih * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = w * scale, h * scale
    return 170 * math.ceil(w / 512) * math.ceil(h / 512) + 85


def anthropic_image_tokens(size: tuple[int, int] | None) -> int:
    if size is None:
        return ANTHROPIC_UNKNOWN_TOKENS
    w, h = size
    if w <= 0 or h <= 0:
        return 0
    scale = min(1.0, 1568 / max(w, h))
    return math.ceil((w * scale) * (h * scale) / 750)
