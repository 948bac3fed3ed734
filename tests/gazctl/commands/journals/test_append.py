"""`gazctl journals append`, run as a user runs it against a real broker; and its record parser."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client.sync import read_all
from consumer.message.framing import encode_fixed_frame
from consumer.message.mapping import modulo_mapping, rendezvous_mapping
from gazctl.appending import Framing, RecordError, RecordParser
from tests.support.harness import BrokerProcess, apply_specs, journal_spec, run_gazctl, wait_for_primary

PARTS = [f"append/{{}}/part-{i:03d}" for i in range(4)]
KEYED = ("modulo", "rendezvous", "base64")
SINGLE = ("none", "file", "lines", "fixed", "bad-magic", "truncated", "no-newline", "combos")
DIRECT = ("append/direct/a", "append/direct/b")
OTHER = "append/other/x"
"""A journal which exists but which the direct test's selector does not match."""


@pytest.fixture(scope="module")
def journals(broker: BrokerProcess) -> Iterator[BrokerProcess]:
    """Every journal the tests append to, created once (and each test uses its own)."""
    names = [p.format(k) for k in KEYED for p in PARTS] + [f"append/{s}/j" for s in SINGLE] + [*DIRECT, OTHER]
    channel, stub = broker.stub()
    try:
        apply_specs(stub, *(journal_spec(n) for n in names))
        for name in names:
            wait_for_primary(stub, name)
    finally:
        channel.close()
    yield broker


def _append(broker: BrokerProcess, *args: str, input: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    done: subprocess.CompletedProcess[bytes] = run_gazctl(
        broker, "journals", "append", "--log.level", "info", *args, input=input
    )
    return done


def _ok(done: subprocess.CompletedProcess[bytes]) -> str:
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr
    return stderr


def _failed(done: subprocess.CompletedProcess[bytes], *expected: str) -> str:
    """The one-line error of a failed run, checked to name each of `expected`."""
    assert done.returncode != 0
    error = done.stderr.decode().strip()
    assert "\n" not in error and error.startswith("error: "), error
    for text in expected:
        assert text in error, error
    return error


def _content(broker: BrokerProcess, journal: str) -> bytes:
    return read_all(broker.url, journal, timeout=10)


def test_framing_none_appends_whole_input_atomically(journals: BrokerProcess) -> None:
    data = bytes(range(256)) * (3 * 4096 + 7)  # Over 3 MiB of binary: streamed in several chunks.
    stderr = _ok(_append(journals, "-l", "name=append/none/j", input=data))
    assert _content(journals, "append/none/j") == data
    assert f"appended journal=append/none/j records=1 bytes={len(data)}" in stderr


def test_input_file(journals: BrokerProcess, tmp_path: Path) -> None:
    path = tmp_path / "in"
    path.write_bytes(b"from a file\nno final newline")
    _ok(_append(journals, "-l", "name=append/file/j", "-i", str(path)))
    assert _content(journals, "append/file/j") == b"from a file\nno final newline"
    _failed(_append(journals, "-l", "name=append/file/j", "-i", str(tmp_path / "missing")), "missing")


def test_lines_to_one_journal(journals: BrokerProcess) -> None:
    data = b"".join(b'{"n": %d}\n' % i for i in range(1000)) + b"\n\r\n"
    stderr = _ok(_append(journals, "-l", "name=append/lines/j", "-f", "lines", input=data))
    assert _content(journals, "append/lines/j") == data
    assert "appended journal=append/lines/j records=1002" in stderr


@pytest.mark.parametrize("mapping", ["modulo", "rendezvous"])
def test_keyed_mapping_spreads_records_deterministically(journals: BrokerProcess, mapping: str) -> None:
    names = [p.format(mapping) for p in PARTS]
    keys = [f"key-{i % 20}" for i in range(200)]
    data = b"".join(f"{k}\r\nrecord {i} of {k}\n".encode() for i, k in enumerate(keys))
    _ok(_append(journals, "-l", f"prefix=append/{mapping}/", "-f", "lines", "-m", mapping, input=data))

    # Gazette's mapping of each key over the journals in name order (given here out of order).
    make = modulo_mapping if mapping == "modulo" else rendezvous_mapping
    mapper = make(lambda key: key, sorted(names))
    expected: dict[str, list[bytes]] = {n: [] for n in names}
    for i, k in enumerate(keys):
        expected[mapper(k.encode())[0]].append(f"record {i} of {k}\n".encode())
    assert sum(1 for records in expected.values() if records) >= 3  # The keys spread.
    keys_of: dict[str, set[bytes]] = {}
    for name in names:
        content = _content(journals, name)
        assert content == b"".join(expected[name])  # Whole records, in input order, keys dropped.
        keys_of[name] = {line.rsplit(b" of ", 1)[1] for line in content.splitlines()}
    assert sum(len(k) for k in keys_of.values()) == 20  # Each key went to one journal only.


def test_base64_keys(journals: BrokerProcess) -> None:
    names = [p.format("base64") for p in PARTS]
    keys = [bytes([i, 0xFF, 0x00, i * 7 % 256]) for i in range(16)]
    data = b"".join(base64.b64encode(k) + b"\n" + b"rec %d\n" % i for i, k in enumerate(keys))
    _ok(_append(journals, "-l", "prefix=append/base64/", "-f", "lines", "-m", "modulo", "--base64", input=data))
    mapper = modulo_mapping(lambda key: key, names)
    for name in names:
        want = b"".join(b"rec %d\n" % i for i, k in enumerate(keys) if mapper(k)[0] == name)
        assert _content(journals, name) == want

    before = _content(journals, names[0])
    bad = base64.b64encode(b"k") + b"\nfine\n" + b"not*base64\nrecord\n"
    _failed(_append(journals, "-l", f"name={names[0]}", "-f", "lines", "-m", "modulo", "--base64", input=bad),
            "record 2 at input offset 10", "not*base64", "base64")
    assert _content(journals, names[0]) == before + b"fine\n"  # The record before the error; none after.


def test_direct_mapping(journals: BrokerProcess) -> None:
    data = b"append/direct/b\nto b 1\nappend/direct/a\nto a\r\nappend/direct/b\nto b 2\n"
    _ok(_append(journals, "-l", "prefix=append/direct/", "-f", "lines", "-m", "direct", input=data))
    assert _content(journals, "append/direct/a") == b"to a\r\n"
    assert _content(journals, "append/direct/b") == b"to b 1\nto b 2\n"

    _failed(_append(journals, "-l", "prefix=append/direct/", "-f", "lines", "-m", "direct",
                    input=b"append/direct/nope\nrecord\n"), "journal 'append/direct/nope' does not exist", "record 1")
    _failed(_append(journals, "-l", "prefix=append/direct/", "-f", "lines", "-m", "direct",
                    input=b"append/direct/a\nok\n" + OTHER.encode() + b"\nrecord\n"),
            f"journal '{OTHER}' does not match --selector 'prefix=append/direct/'", "record 2 at input offset 19")
    assert _content(journals, OTHER) == b""
    assert _content(journals, "append/direct/a") == b"to a\r\nok\n"


def test_fixed_framing_round_trip(journals: BrokerProcess) -> None:
    frames = [encode_fixed_frame(bytes([i]) * i) for i in range(50)] + [encode_fixed_frame(b"\n\x00" * 40000)]
    _ok(_append(journals, "-l", "name=append/fixed/j", "-f", "fixed", input=b"".join(frames)))
    assert _content(journals, "append/fixed/j") == b"".join(frames)


def test_fixed_framing_errors(journals: BrokerProcess) -> None:
    first = encode_fixed_frame(b"first")
    _failed(_append(journals, "-l", "name=append/bad-magic/j", "-f", "fixed", input=first + b"garbage!" * 3),
            "stdin: record 2 at input offset 13", "magic word 67 61 72 62")
    assert _content(journals, "append/bad-magic/j") == first

    _failed(_append(journals, "-l", "name=append/truncated/j", "-f", "fixed", input=encode_fixed_frame(b"0123")[:-1]),
            "record 1 at input offset 0", "truncated")
    assert _content(journals, "append/truncated/j") == b""


def test_lines_without_final_newline_fail(journals: BrokerProcess) -> None:
    _failed(_append(journals, "-l", "name=append/no-newline/j", "-f", "lines", input=b"one\ntwo\nthr"),
            "record 3 at input offset 8", "no trailing newline", "2 earlier records were appended")
    assert _content(journals, "append/no-newline/j") == b"one\ntwo\n"


def test_option_errors(journals: BrokerProcess) -> None:
    _failed(_append(journals, "-l", "name=append/nothing/here", input=b"x"), "name=append/nothing/here")
    _failed(_append(journals, "-l", "name=append/combos/j", "-m", "modulo", input=b"x"), "--framing none", "--mapping")
    _failed(_append(journals, "-l", "name=append/combos/j", "-f", "fixed", "-m", "modulo", "--base64", input=b"x"),
            "--base64")
    _failed(_append(journals, "-l", "name=append/combos/j", "-f", "lines", "--base64", input=b"x"), "--base64")
    assert _content(journals, "append/combos/j") == b""


# The record parser alone: pure logic.


def _parse(parser: RecordParser, data: bytes, step: int) -> list[tuple[bytes | None, bytes, int, int]]:
    out = []
    for i in range(0, len(data), step):
        out += [(r.key, r.data, r.number, r.offset) for r in parser.feed(data[i : i + step])]
    parser.finish()
    return out


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_parser_lines_with_keys(step: int) -> None:
    data = b"k1\r\nrec one\nk2\n\n"
    assert _parse(RecordParser(Framing.lines, keyed=True), data, step) == [
        (b"k1", b"rec one\n", 1, 4), (b"k2", b"\n", 2, 15)]
    assert _parse(RecordParser(Framing.lines, keyed=False), b"a\nb\n", step) == [
        (None, b"a\n", 1, 0), (None, b"b\n", 2, 2)]


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_parser_fixed(step: int) -> None:
    data = b"".join(encode_fixed_frame(p) for p in (b"key", b"value", b"", b"v"))
    assert _parse(RecordParser(Framing.fixed, keyed=True), data + b"\n", step) == [
        (b"key", encode_fixed_frame(b"value"), 1, 11), (b"", encode_fixed_frame(b"v"), 2, 32)]


@pytest.mark.parametrize(
    "framing, keyed, data, message",
    [
        (Framing.fixed, False, b"\x66\x33\x93\x37", "input: record 1 at input offset 0: bad fixed-frame magic word"),
        (Framing.fixed, False, encode_fixed_frame(b"ab") + b"\x66\x33", "record 2 at input offset 10: input ends"),
        (Framing.lines, True, b"key\nrecord\nkey2\n", "record 2 at input offset 11: input ends after a partition key"),
        (Framing.lines, True, b"key", "record 1 at input offset 0: input ends mid-frame: the key of record's line"),
    ],
)
def test_parser_errors(framing: Framing, keyed: bool, data: bytes, message: str) -> None:
    parser = RecordParser(framing, keyed=keyed)
    with pytest.raises(RecordError, match=message):
        list(parser.feed(data))
        parser.finish()
