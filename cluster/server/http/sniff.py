"""The `Content-Type` Go's net/http gives a response whose handler set none: `DetectContentType` of
the first bytes written, which follows the WHATWG MIME sniffing standard (mimesniff.spec.whatwg.org,
section 7's signature table, as net/http's sniff.go orders it).

Gazette's gateway sets no type on a GET's 206, so Go sniffs the first content it streams (and sends
none when the read ends before any content). `detect_content_type` reproduces that answer.
"""

from __future__ import annotations

SNIFF_LEN = 512
"""Bytes looked at, at most."""

_WHITESPACE = b"\t\n\x0c\r "
_HTML_TAGS = (
    b"<!DOCTYPE HTML", b"<HTML", b"<HEAD", b"<SCRIPT", b"<IFRAME", b"<H1", b"<DIV", b"<FONT", b"<TABLE", b"<A",
    b"<STYLE", b"<TITLE", b"<B", b"<BODY", b"<BR", b"<P", b"<!--",
)
_ANY = None
"""A byte of a signature that matches any byte."""

# (pattern, type): bytes that must match at the start of the data, None matching any byte.
_SIGNATURES: tuple[tuple[tuple[int | None, ...], str], ...] = tuple(
    (tuple(p), t) if isinstance(p, bytes) else (p, t)
    for p, t in (
        (b"%PDF-", "application/pdf"),
        (b"%!PS-Adobe-", "application/postscript"),
        ((0xFE, 0xFF, _ANY, _ANY), "text/plain; charset=utf-16be"),
        ((0xFF, 0xFE, _ANY, _ANY), "text/plain; charset=utf-16le"),
        ((0xEF, 0xBB, 0xBF, _ANY), "text/plain; charset=utf-8"),
        (b"\x00\x00\x01\x00", "image/x-icon"),
        (b"\x00\x00\x02\x00", "image/x-icon"),
        (b"BM", "image/bmp"),
        (b"GIF87a", "image/gif"),
        (b"GIF89a", "image/gif"),
        ((*b"RIFF", _ANY, _ANY, _ANY, _ANY, *b"WEBPVP"), "image/webp"),
        (b"\x89PNG\r\n\x1a\n", "image/png"),
        (b"\xff\xd8\xff", "image/jpeg"),
        ((*b"FORM", _ANY, _ANY, _ANY, _ANY, *b"AIFF"), "audio/aiff"),
        (b"ID3", "audio/mpeg"),
        (b"OggS\x00", "application/ogg"),
        (b"MThd\x00\x00\x00\x06", "audio/midi"),
        ((*b"RIFF", _ANY, _ANY, _ANY, _ANY, *b"AVI "), "video/avi"),
        ((*b"RIFF", _ANY, _ANY, _ANY, _ANY, *b"WAVE"), "audio/wave"),
    )
)
_LATER_SIGNATURES: tuple[tuple[tuple[int | None, ...], str], ...] = tuple(
    (tuple(p), t) if isinstance(p, bytes) else (p, t)
    for p, t in (
        (b"\x1a\x45\xdf\xa3", "video/webm"),
        ((*(_ANY,) * 34, *b"LP"), "application/vnd.ms-fontobject"),
        (b"\x00\x01\x00\x00", "font/ttf"),
        (b"OTTO", "font/otf"),
        (b"ttcf", "font/collection"),
        (b"wOFF", "font/woff"),
        (b"wOF2", "font/woff2"),
        (b"\x1f\x8b\x08", "application/x-gzip"),
        (b"PK\x03\x04", "application/zip"),
        (b"Rar!\x1a\x07\x00", "application/x-rar-compressed"),
        (b"Rar!\x1a\x07\x01\x00", "application/x-rar-compressed"),
        (b"\x00asm", "application/wasm"),
    )
)
_BINARY = frozenset([*range(0x00, 0x09), 0x0B, *range(0x0E, 0x1B), *range(0x1C, 0x20)])
"""Bytes that make data binary rather than text (the standard's binary data bytes)."""


def detect_content_type(data: bytes) -> str:
    """The MIME type Go's `http.DetectContentType` gives `data` (its first SNIFF_LEN bytes):
    `application/octet-stream` when nothing more specific matches."""
    data = data[:SNIFF_LEN]
    start = len(data) - len(data.lstrip(_WHITESPACE))
    text = data[start:]
    for tag in _HTML_TAGS:
        if len(text) > len(tag) and text[: len(tag)].upper() == tag and text[len(tag)] in b" >":
            return "text/html; charset=utf-8"
    if text.startswith(b"<?xml"):
        return "text/xml; charset=utf-8"
    for pattern, content_type in _SIGNATURES:
        if _matches(data, pattern):
            return content_type
    if _is_mp4(data):
        return "video/mp4"
    for pattern, content_type in _LATER_SIGNATURES:
        if _matches(data, pattern):
            return content_type
    if not _BINARY.intersection(text):
        return "text/plain; charset=utf-8"
    return "application/octet-stream"


def _matches(data: bytes, pattern: tuple[int | None, ...]) -> bool:
    if len(data) < len(pattern):
        return False
    return all(want is None or got == want for got, want in zip(data, pattern, strict=False))


def _is_mp4(data: bytes) -> bool:
    """An ISO base media file whose `ftyp` box names an `mp4` brand (the standard's 6.2.1)."""
    if len(data) < 12:
        return False
    box_size = int.from_bytes(data[:4], "big")
    if len(data) < box_size or box_size % 4 != 0 or data[4:8] != b"ftyp":
        return False
    return any(data[at : at + 3] == b"mp4" for at in range(8, box_size, 4) if at != 12)
