"""Fragment file names: `%016x-%016x-%040x` plus a codec extension, and their parsing.

Names sort by offset and are content-addressed, so anyone with store access can find and
verify a journal's fragments.
"""

from __future__ import annotations

import re

from broker.fragment.errors import FragmentNameError, UnknownCodecError
from broker.fragment.sums import DIGEST_SIZE, digest_of, sha1sum_from_digest
from broker.protocol import pb
from broker.protocol.paths import go_clean, go_quote
from broker.protocol.validation import ValidationError, validate_fragment

MAX_INT64 = (1 << 63) - 1

CODEC_EXTENSIONS: dict[pb.CompressionCodec.ValueType, str] = {
    pb.NONE: ".raw",
    pb.GZIP: ".gz",
    pb.ZSTANDARD: ".zst",
    pb.SNAPPY: ".sz",
    # Gazette writes no extension here (a TODO there says `.gzod` once its v2 broker ships);
    # readers recognise the object by its `Content-Encoding: gzip` instead.
    pb.GZIP_OFFLOAD_DECOMPRESSION: "",
}
"""The extension written for each codec."""

EXTENSION_CODECS: dict[str, pb.CompressionCodec.ValueType] = {
    ".raw": pb.NONE,
    ".gz": pb.GZIP,
    ".gzip": pb.GZIP,
    ".zst": pb.ZSTANDARD,
    ".zstandard": pb.ZSTANDARD,
    ".sz": pb.SNAPPY,
    ".snappy": pb.SNAPPY,
    "": pb.GZIP_OFFLOAD_DECOMPRESSION,
    ".gzod": pb.GZIP_OFFLOAD_DECOMPRESSION,
}
"""The codec of each extension accepted when parsing, keyed in lower case."""

_HEX_INT = re.compile(r"[+-]?[0-9a-fA-F]+")
_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")


def codec_extension(codec: pb.CompressionCodec.ValueType) -> str:
    """Return the file extension written for `codec`."""
    try:
        return CODEC_EXTENSIONS[codec]
    except KeyError:
        raise UnknownCodecError(codec) from None


def codec_from_extension(ext: str) -> pb.CompressionCodec.ValueType:
    """Return the codec of file extension `ext` (with its dot; case-insensitive)."""
    try:
        return EXTENSION_CODECS[ext.lower()]
    except KeyError:
        raise FragmentNameError(f"unrecognized compression extension: {ext}") from None


def content_name(f: pb.Fragment) -> str:
    """Return the content-addressed base name of `f`, e.g. `00..01-00..ff-<sha1>.gz`."""
    # An empty fragment names the all-zero sum, whatever its `sum` holds.
    digest = bytes(DIGEST_SIZE) if f.begin == f.end else digest_of(f.sum)
    return f"{f.begin:016x}-{f.end:016x}-{digest.hex()}{codec_extension(f.compression_codec)}"


def content_path(f: pb.Fragment) -> str:
    """Return `journal/path_postfix/content_name` with Go `path.Join` semantics."""
    return go_join(f.journal, f.path_postfix, content_name(f))


def go_join(*elems: str) -> str:
    """Join non-empty elements with `/` and clean the result (Go `path.Join`)."""
    joined = "/".join(e for e in elems if e)
    return go_clean(joined) if joined else ""


def parse_fragment_from_relative_path(journal: str, rel: str) -> pb.Fragment:
    """Parse the Fragment named by `rel`, a path relative to `<journal>/` in a store.

    The directory part of `rel` becomes the path postfix. Errors carry Gazette's texts, e.g.
    `wrong Fragment format: ...` or `unrecognized compression extension: .XXX`.
    """
    try:
        _check_utf8(journal, "journal name")
        _check_utf8(rel, "fragment path")
        frag = _parse(journal, rel)
        validate_fragment(frag)
    except FragmentNameError as err:
        err.journal, err.path = journal, rel
        raise
    except ValidationError as err:
        raise FragmentNameError(str(err), journal=journal, path=rel) from None
    return frag


def _check_utf8(text: str, what: str) -> None:
    """Refuse a name that is not UTF-8: os.listdir gives lone surrogates for the bytes of a store
    directory or file whose name is not, and protobuf strings cannot hold them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        shown = text.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
        raise FragmentNameError(f"{what} is not valid UTF-8 at character {err.start}: {shown}") from None


def _parse(journal: str, rel: str) -> pb.Fragment:
    postfix = _go_dir(rel)
    name = rel
    if postfix == ".":
        postfix = ""
    else:
        # Go slices by the cleaned directory's length; keep that for identical results.
        name = rel[len(postfix) + 1 :]

    ext = _go_ext(name)
    name = name[: len(name) - len(ext)]

    fields = name.split("-")
    if len(fields) != 3:
        raise FragmentNameError(f"wrong Fragment format: {name}")
    begin = _parse_hex_int64(fields[0], "Begin")
    end = _parse_hex_int64(fields[1], "End")
    digest = _decode_hex(fields[2])
    if len(digest) != DIGEST_SIZE:
        raise FragmentNameError(f"invalid SHA1Sum length: {digest.hex()}")
    codec = codec_from_extension(ext)

    return pb.Fragment(
        journal=journal,
        begin=begin,
        end=end,
        sum=sha1sum_from_digest(digest),
        compression_codec=codec,
        path_postfix=postfix,
    )


def _go_dir(p: str) -> str:
    """Go `path.Dir`: everything before the last `/`, cleaned."""
    return go_clean(p[: p.rfind("/") + 1])


def _go_ext(p: str) -> str:
    """Go `path.Ext`: the suffix from the final `.` of the last element, or ""."""
    for i in range(len(p) - 1, -1, -1):
        if p[i] == "/":
            break
        if p[i] == ".":
            return p[i:]
    return ""


def _parse_hex_int64(s: str, field: str) -> int:
    """Go `strconv.ParseInt(s, 16, 64)`, with its error texts under `field`."""
    if not _HEX_INT.fullmatch(s):
        raise FragmentNameError(f"{field}: strconv.ParseInt: parsing {go_quote(s)}: invalid syntax")
    value = int(s, 16)
    if not -MAX_INT64 - 1 <= value <= MAX_INT64:
        raise FragmentNameError(f"{field}: strconv.ParseInt: parsing {go_quote(s)}: value out of range")
    return value


def _decode_hex(s: str) -> bytes:
    """Go `hex.DecodeString`, with its error texts under `Sum`."""
    raw = s.encode("utf-8", "surrogateescape")
    # Go reports the first invalid byte of each pair in order, then an odd length.
    for b in raw[: len(raw) - len(raw) % 2]:
        if b not in _HEX_DIGITS:
            raise FragmentNameError(f"Sum: encoding/hex: invalid byte: {_go_sharp_u(b)}")
    if len(raw) % 2:
        if raw[-1] not in _HEX_DIGITS:
            raise FragmentNameError(f"Sum: encoding/hex: invalid byte: {_go_sharp_u(raw[-1])}")
        raise FragmentNameError("Sum: encoding/hex: odd length hex string")
    return bytes.fromhex(raw.decode("ascii"))


def _go_sharp_u(b: int) -> str:
    """Go's `%#U` of a byte taken as a rune: `U+0058 'X'`, without the quote when unprintable."""
    ch = chr(b)
    return f"U+{b:04X} '{ch}'" if ch.isprintable() else f"U+{b:04X}"
