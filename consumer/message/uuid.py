"""Message UUIDs, laid out exactly as Gazette lays them out (RFC 4122 version 1).

| Bytes (big-endian) | Content                                                              |
|--------------------|----------------------------------------------------------------------|
| 0-3                | `clock >> 4`, low 32 bits: time_low                                  |
| 4-5                | `clock >> 36`, low 16 bits: time_mid                                 |
| 6-7                | `clock >> 52`, 12 bits, OR `0x1000`: time_hi and version 1           |
| 8-9                | `0x8000 | (clock & 0xF) << 10 | flags`: variant, counter, 10 flag bits |
| 10-15              | ProducerID, the RFC's "node"                                         |

A clock is a 60-bit count of 100 ns ticks since 1582-10-15, shifted left 4 bits to make room
for a 4-bit counter; see `consumer.message.clock`. Values are `uuid.UUID`; clocks and flags are
plain ints.
"""

from __future__ import annotations

import binascii
import enum
import secrets
import uuid

from consumer.message.errors import UUIDError

ProducerID = bytes
"""The 6-byte node field of a message UUID, naming the producer that published it."""

PRODUCER_ID_LENGTH = 6
PRODUCER_MASK = (1 << 48) - 1
"""The producer ID in a UUID's integer: its 48 low bits (the node field)."""
FLAGS_MASK = 0x3FF
"""Flags occupy the 10 low bits of the clock sequence."""
CLOCK_MASK = (1 << 64) - 1
"""Clocks are unsigned 64-bit values, as in Go."""
G1582NS100 = 122192928000000000
"""100 ns intervals from 1582-10-15 (the RFC 4122 epoch) to 1970-01-01 (the Unix epoch)."""

ZERO_UUID = uuid.UUID(int=0)
"""The zero UUID. A message carrying it opts out of exactly-once: it is always delivered."""


class Flags(enum.IntEnum):
    """Transaction semantics of a message, carried in its UUID."""

    OUTSIDE_TXN = 0x0
    """Self-committed: process immediately."""
    CONTINUE_TXN = 0x1
    """Part of an open transaction: process only after an ACK_TXN with a larger clock."""
    ACK_TXN = 0x2
    """Commits the producer's CONTINUE_TXN messages with clocks up to its own; rolls back larger ones."""


def flags_string(flags: int) -> str:
    """Gazette's `Flags.String()`: the flag's name, or `Flags(<hex>)` for other values."""
    try:
        return Flags(flags).name
    except ValueError:
        return f"Flags({flags:x})"


def new_producer_id() -> ProducerID:
    """A cryptographically random ProducerID with the multicast bit set.

    As Gazette does: draw a random int64 in [0, 2^63), take the first 6 of its minimal big-endian
    bytes (zero-padded on the right when shorter), then set bit 0 of byte 0, which RFC 4122 uses
    to mark a node ID that is not a real MAC address.
    """
    value = secrets.randbelow(1 << 63)
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")[:PRODUCER_ID_LENGTH]
    out = bytearray(raw.ljust(PRODUCER_ID_LENGTH, b"\x00"))
    out[0] |= 0x01
    return bytes(out)


def build_uuid(producer: ProducerID, clock: int, flags: int) -> uuid.UUID:
    """Build the v1 UUID of a message from its producer, clock and flags.

    Raises UUIDError if `flags` exceed 10 bits, `clock` is not an unsigned 64-bit value, or
    `producer` is not 6 bytes.
    """
    if not 0 <= flags <= FLAGS_MASK:
        raise UUIDError(f"only 10 low bits may be used for flags (got {flags:#x})")
    if not 0 <= clock <= CLOCK_MASK:
        raise UUIDError(f"clock must be an unsigned 64-bit value (got {clock})")
    if len(producer) != PRODUCER_ID_LENGTH:
        raise UUIDError(f"producer ID must be {PRODUCER_ID_LENGTH} bytes (got {len(producer)})")

    # time_low, time_mid, time_hi_and_version (1), clock_seq (variant, counter, flags), node.
    value = (
        ((clock >> 4) & 0xFFFFFFFF) << 96
        | ((clock >> 36) & 0xFFFF) << 80
        | ((clock >> 52) | 0x1000) << 64
        | (((clock << 10) & 0x3C00) | flags | 0x8000) << 48
        | _from_bytes(producer, "big")
    )
    u = _new_object(uuid.UUID)  # As parse_uuid builds one: this runs once per message published.
    _set_int(u, value)
    _set_is_safe(u, _UNKNOWN_SAFETY)
    return u


def get_producer_id(u: uuid.UUID) -> ProducerID:
    """The 6-byte node field of `u`."""
    return (u.int & PRODUCER_MASK).to_bytes(PRODUCER_ID_LENGTH, "big")


def get_clock(u: uuid.UUID) -> int:
    """The clock of `u`: its 60-bit timestamp shifted left 4, plus the 4-bit counter."""
    # From the UUID's integer rather than its bytes: this runs twice per message read.
    n = u.int
    clock = ((n >> 96) & 0xFFFFFFFF) << 4  # time_low
    clock |= ((n >> 80) & 0xFFFF) << 36  # time_mid
    # time_hi and version: the version nibble lands in bits 64-67 and falls off the uint64, as in Go.
    clock |= ((n >> 64) & 0xFFFF) << 52
    clock |= (n >> 58) & 0xF  # The counter, in the clock sequence's bits 10-13.
    return clock & CLOCK_MASK


def get_flags(u: uuid.UUID) -> int:
    """The 10 low bits of the clock sequence of `u`."""
    return (u.int >> 48) & FLAGS_MASK


_new_object = object.__new__
# The setters of UUID's two slots, which UUID.__init__ fills (its own __setattr__ refuses).
_set_int = uuid.UUID.__dict__["int"].__set__
_set_is_safe = uuid.UUID.__dict__["is_safe"].__set__
_UNKNOWN_SAFETY = uuid.SafeUUID.unknown
_unhexlify = binascii.unhexlify
_from_bytes = int.from_bytes


def parse_uuid(text: str) -> uuid.UUID:
    """Parse a UUID as google/uuid's `Parse` does, with its error wording.

    Accepted: `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, the same with a `urn:uuid:` prefix or
    wrapped in one character each side (`{...}`), or 32 hex digits.
    """
    if len(text) == 36 and text[8:24:5] == "----":
        # The canonical form, as every message carries it: unhexlify takes exactly pairs of hex
        # digits (no sign, space, underscore or "0x", which int() would). The UUID is built as
        # uuid.UUID(int=value) builds one, less its argument checks: this runs once per message read.
        digits = text.replace("-", "")
        if len(digits) == 32:
            try:
                value = _from_bytes(_unhexlify(digits), "big")
            except ValueError:  # binascii.Error is one: a character that isn't a hex digit.
                pass  # Below says so.
            else:
                u = _new_object(uuid.UUID)
                _set_int(u, value)
                _set_is_safe(u, _UNKNOWN_SAFETY)
                return u

    raw = text.encode("utf-8", errors="surrogateescape")
    # google/uuid measures Go strings, which are bytes.
    if len(raw) == 36 + 9:
        if raw[:9].lower() != b"urn:uuid:":
            prefix = raw[:9].decode("utf-8", errors="replace").replace("\\", "\\\\").replace('"', '\\"')
            raise UUIDError(f'invalid urn prefix: "{prefix}"')
        raw = raw[9:]
    elif len(raw) == 36 + 2:
        raw = raw[1:37]
    elif len(raw) == 32:
        return _from_hex(raw)
    elif len(raw) != 36:
        raise UUIDError(f"invalid UUID length: {len(raw)}")

    if raw[8:9] != b"-" or raw[13:14] != b"-" or raw[18:19] != b"-" or raw[23:24] != b"-":
        raise UUIDError("invalid UUID format")
    return _from_hex(raw[0:8] + raw[9:13] + raw[14:18] + raw[19:23] + raw[24:36])


_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")


def _from_hex(raw: bytes) -> uuid.UUID:
    if len(raw) != 32 or not _HEX_DIGITS.issuperset(raw):
        raise UUIDError("invalid UUID format")
    return uuid.UUID(hex=raw.decode("ascii"))
