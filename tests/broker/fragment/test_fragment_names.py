"""Fragment content names and paths, and their parsing, with examples of Gazette's
`broker/protocol/fragment_extensions_test.go`."""

from __future__ import annotations

import hashlib

import pytest

from broker.fragment import (
    EMPTY_SHA1,
    ZERO_SUM,
    FragmentNameError,
    UnknownCodecError,
    codec_extension,
    codec_from_extension,
    content_name,
    content_path,
    digest_of,
    parse_fragment_from_relative_path,
    sha1sum_from_digest,
    sha1sum_hex,
)
from broker.protocol import pb

MAX_INT64 = (1 << 63) - 1
SUM = pb.SHA1Sum(part1=0x0102030405060708, part2=0x090A0B0C0D0E0F10, part3=0x11121314)
NAME = "00000000499602d2-7fffffffffffffff-0102030405060708090a0b0c0d0e0f1011121314"


def fixture(**kw: object) -> pb.Fragment:
    f = pb.Fragment(journal="a/journal", begin=1234567890, end=MAX_INT64, compression_codec=pb.GZIP)
    f.sum.CopyFrom(SUM)
    for k, v in kw.items():
        setattr(f, k, v)
    return f


def test_sums_round_trip() -> None:
    digest = hashlib.sha1(b"hello").digest()
    s = sha1sum_from_digest(digest)
    assert digest_of(s) == digest
    assert sha1sum_hex(s) == digest.hex()
    assert sha1sum_hex(SUM) == "0102030405060708090a0b0c0d0e0f1011121314"
    assert sha1sum_hex(EMPTY_SHA1) == "da39a3ee5e6b4b0d3255bfef95601890afd80709"
    assert sha1sum_hex(ZERO_SUM) == "0" * 40
    with pytest.raises(ValueError):
        sha1sum_from_digest(b"short")


def test_content_name() -> None:
    assert content_name(fixture()) == NAME + ".gz"
    assert content_name(fixture(compression_codec=pb.SNAPPY)) == NAME + ".sz"
    assert content_name(fixture(compression_codec=pb.ZSTANDARD)) == NAME + ".zst"
    assert content_name(fixture(compression_codec=pb.NONE)) == NAME + ".raw"
    assert content_name(fixture(compression_codec=pb.GZIP_OFFLOAD_DECOMPRESSION)) == NAME


def test_content_name_of_empty_fragment_uses_zero_sum() -> None:
    f = fixture(end=1234567890, compression_codec=pb.NONE)
    f.sum.CopyFrom(EMPTY_SHA1)  # Whatever it holds, an empty fragment names the zero sum.
    assert content_name(f) == "00000000499602d2-00000000499602d2-" + "0" * 40 + ".raw"


def test_content_name_of_invalid_codec() -> None:
    with pytest.raises(UnknownCodecError):
        content_name(fixture(compression_codec=pb.INVALID))
    with pytest.raises(UnknownCodecError):
        codec_extension(99)  # type: ignore[arg-type]


def test_content_path() -> None:
    f = fixture(journal="a/journal/name")
    assert content_path(f) == "a/journal/name/" + NAME + ".gz"
    f.path_postfix = "a=1/b=2"
    assert content_path(f) == "a/journal/name/a=1/b=2/" + NAME + ".gz"
    f.journal, f.path_postfix = "my/journal", "date=2019-11-19"
    assert content_path(f) == "my/journal/date=2019-11-19/" + NAME + ".gz"


@pytest.mark.parametrize(
    ("ext", "codec"),
    [
        (".raw", pb.NONE),
        (".RAW", pb.NONE),
        (".gz", pb.GZIP),
        (".gzip", pb.GZIP),
        (".GZip", pb.GZIP),
        (".zst", pb.ZSTANDARD),
        (".zstandard", pb.ZSTANDARD),
        (".sz", pb.SNAPPY),
        (".snappy", pb.SNAPPY),
        ("", pb.GZIP_OFFLOAD_DECOMPRESSION),
        (".gzod", pb.GZIP_OFFLOAD_DECOMPRESSION),
        (".GZOD", pb.GZIP_OFFLOAD_DECOMPRESSION),
    ],
)
def test_codec_from_extension(ext: str, codec: int) -> None:
    assert codec_from_extension(ext) == codec


def test_parse_success_cases() -> None:
    assert parse_fragment_from_relative_path("a/journal", NAME + ".gz") == fixture()
    assert parse_fragment_from_relative_path("a/journal", "a=b/two=3/" + NAME + ".gz") == fixture(
        path_postfix="a=b/two=3"
    )
    assert parse_fragment_from_relative_path("a/journal", NAME) == fixture(
        compression_codec=pb.GZIP_OFFLOAD_DECOMPRESSION
    )
    empty = parse_fragment_from_relative_path(
        "a/journal", "00000000499602d2-00000000499602d2-0000000000000000000000000000000000000000.raw"
    )
    assert empty == pb.Fragment(
        journal="a/journal", begin=1234567890, end=1234567890, sum=pb.SHA1Sum(), compression_codec=pb.NONE
    )
    # Offsets are hex of any number of digits.
    short = parse_fragment_from_relative_path("a/journal", "0-ff-" + "00" * 20 + ".sz")
    assert (short.begin, short.end, short.compression_codec) == (0, 255, pb.SNAPPY)


def test_parse_round_trips_content_path() -> None:
    f = fixture(path_postfix="date=2019-11-19/hour=22")
    rel = content_path(f)[len("a/journal/") :]
    assert parse_fragment_from_relative_path("a/journal", rel) == f


@pytest.mark.parametrize(
    ("rel", "message"),
    [
        (NAME + "-extra.gz", "wrong Fragment format: " + NAME + "-extra"),
        (
            "00000000499602XX-7fffffffffffffff-0102030405060708090a0b0c0d0e0f1011121314.gz",
            'Begin: strconv.ParseInt: parsing "00000000499602XX": invalid syntax',
        ),
        (
            "00000000499602d2-7fffffffffffffXX-0102030405060708090a0b0c0d0e0f1011121314.gz",
            'End: strconv.ParseInt: parsing "7fffffffffffffXX": invalid syntax',
        ),
        (
            "00000000499602d2-8000000000000000-0102030405060708090a0b0c0d0e0f1011121314.gz",
            'End: strconv.ParseInt: parsing "8000000000000000": value out of range',
        ),
        (
            "00000000499602d2-7fffffffffffffff-0102030405060708090a0b0c0d0e0f10111213XX.gz",
            "Sum: encoding/hex: invalid byte: U+0058 'X'",
        ),
        (
            "00000000499602d2-7fffffffffffffff-0102030405060708090a0b0c0d0e0f101112131.gz",
            "Sum: encoding/hex: odd length hex string",
        ),
        (
            "00000000499602d2-7fffffffffffffff-0102030405060708090a0b0c0d0e0f10111213.gz",
            "invalid SHA1Sum length: 0102030405060708090a0b0c0d0e0f10111213",
        ),
        (NAME + ".XXX", "unrecognized compression extension: .XXX"),
        (
            "7fffffffffffffff-00000000499602d2-0102030405060708090a0b0c0d0e0f1011121314.gz",
            "expected Begin <= End (have 9223372036854775807, 1234567890)",
        ),
    ],
)
def test_parse_error_cases(rel: str, message: str) -> None:
    with pytest.raises(FragmentNameError) as info:
        parse_fragment_from_relative_path("a/journal", rel)
    assert str(info.value) == message
    assert info.value.journal == "a/journal"
    assert info.value.path == rel


def test_parse_validates_postfix() -> None:
    with pytest.raises(FragmentNameError, match=r"^PathPostfix: cannot begin with '/' \(/a=b\)$"):
        parse_fragment_from_relative_path("a/journal", "/a=b/" + NAME + ".gz")
