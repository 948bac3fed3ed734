"""Splitting newline-delimited messages into Arrow arrays (pure logic)."""

from __future__ import annotations

from pipelines.source.lines import split_lines


def test_split_whole_lines_and_leave_the_partial_one() -> None:
    data = b'{"a":1}\n\n{"b":2}\r\n{"partial'
    values, offsets, consumed = split_lines(data, 100)
    assert values.to_pylist() == [b'{"a":1}', b"", b'{"b":2}\r']
    assert offsets.to_pylist() == [100, 108, 109]
    assert consumed == len(b'{"a":1}\n\n{"b":2}\r\n')


def test_no_newline_consumes_nothing() -> None:
    values, offsets, consumed = split_lines(b"abc", 7)
    assert len(values) == 0 and len(offsets) == 0 and consumed == 0


def test_many_lines_match_a_python_split() -> None:
    lines = [f'{{"n": {i}, "pad": "{"x" * (i % 50)}"}}'.encode() for i in range(10_000)]
    data = b"\n".join(lines) + b"\n"
    values, offsets, consumed = split_lines(data, 0)
    assert values.to_pylist() == lines and consumed == len(data)
    expected, at = [], 0
    for line in lines:
        expected.append(at)
        at += len(line) + 1
    assert offsets.to_pylist() == expected
