"""CRC-64 as Gazette's stream-sum computes it: Go's `hash/crc64` with the `crc64.ECMA` table.

The polynomial is ECMA-182's, 0x42F0E1EBA9EA3693, used bit-reflected (0xC96C5795D7870F42), with
the register inverted before and after each update, as Go's `crc64.Update` does. In the CRC
catalogue this is CRC-64/XZ (also called CRC-64/GO-ECMA): check value ("123456789")
0x995DC9BBDF1939FA. It is *not* the catalogue's CRC-64/ECMA-182 (unreflected, no inversion,
check 0x6C40DF5F0B497347). Because the inversion is applied inside each update, updating with
the pieces of a stream gives the sum of the whole stream: `update(update(0, a), b) ==
update(0, a + b)`, which is how the summer folds chunks into a running sum.

No CRC library is a dependency of the project, so this is a 256-entry table computed at import.
"""

from __future__ import annotations

from typing import Final

ECMA_POLY: Final = 0x42F0E1EBA9EA3693
"""ECMA-182's polynomial, in its normal (unreflected) form."""
ECMA_REFLECTED: Final = 0xC96C5795D7870F42
"""The same polynomial bit-reflected: Go's `crc64.ECMA` constant."""
_MASK: Final = 0xFFFFFFFFFFFFFFFF


def _make_table(poly: int) -> tuple[int, ...]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


ECMA_TABLE: Final = _make_table(ECMA_REFLECTED)


def update(crc: int, data: bytes) -> int:
    """Go's `crc64.Update(crc, crc64.MakeTable(crc64.ECMA), data)`."""
    table = ECMA_TABLE
    crc = ~crc & _MASK
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return ~crc & _MASK


def checksum(data: bytes) -> int:
    """The CRC-64 of `data` (Go's `crc64.Checksum(data, ecmaTable)`)."""
    return update(0, data)


__all__ = ["ECMA_POLY", "ECMA_REFLECTED", "ECMA_TABLE", "checksum", "update"]
