"""Message UUIDs and clocks: Gazette's uuid_test.go fixtures and worked examples of `message/uuid.go`."""

from __future__ import annotations

import threading
import uuid

import pytest

from consumer.message import (
    TICK,
    Clock,
    Flags,
    UUIDError,
    build_uuid,
    clock_at,
    clock_unix_ns,
    flags_string,
    get_clock,
    get_flags,
    get_producer_id,
    new_producer_id,
    parse_uuid,
)
from consumer.message.uuid import G1582NS100

PRODUCER = bytes.fromhex("010203040506")


def unix(secs: int, nanos: int) -> int:
    """Go's time.Unix(secs, nanos), as Unix nanoseconds."""
    return secs * 1_000_000_000 + nanos


def test_worked_examples() -> None:
    assert str(build_uuid(PRODUCER, 160, Flags.CONTINUE_TXN)) == "0000000a-0000-1000-8001-010203040506"
    assert str(build_uuid(PRODUCER, 0x1E9CC5F83FC2F815, Flags.ACK_TXN)) == "83fc2f81-cc5f-11e9-9402-010203040506"


def test_decoding_worked_example() -> None:
    u = uuid.UUID("83fc2f81-cc5f-11e9-9402-010203040506")
    assert get_clock(u) == 0x1E9CC5F83FC2F815
    assert get_clock(u) & 0xF == 5  # The counter.
    assert get_flags(u) == Flags.ACK_TXN
    assert get_producer_id(u) == PRODUCER


def test_producer_uniqueness_and_multicast_bit() -> None:
    ids = {new_producer_id() for _ in range(1000)}
    assert len(ids) == 1000
    for producer in ids:
        assert len(producer) == 6
        assert producer[0] & 0x01  # Marks "not a real MAC address".


def test_building_with_full_range_clock() -> None:
    """TestUUIDBuilding: a clock using the full bit range, plus counter ticks, round-trips."""
    producer = new_producer_id()
    secs, nanos = 1567304621, 981273734
    clock = Clock.at(unix(secs, nanos))
    clock.tick()
    clock.tick()
    flags = 0b1010101010  # 682

    u = build_uuid(producer, clock.value, flags)
    assert get_clock(u) == clock.value
    assert get_producer_id(u) == producer
    assert get_flags(u) == flags

    # Compatible with RFC 4122 readers (Go's google/uuid; here Python's uuid module).
    assert u.version == 1
    assert u.variant == uuid.RFC_4122
    assert u.node == int.from_bytes(producer, "big")
    assert u.time == clock.value >> 4
    # Two ticks of 1 µs each on top of the nanos rounded down to 100 ns.
    assert (u.time - G1582NS100) * 100 == unix(secs, 981275700)


def test_round_trip_over_counter_and_flag_values() -> None:
    base = clock_at(unix(1_700_000_000, 123_456_700))
    for counter in range(16):
        for flags in (0, 1, 2, 0x100, 0x3FF):
            u = build_uuid(PRODUCER, base | counter, flags)
            assert (get_clock(u), get_flags(u), get_producer_id(u)) == (base | counter, flags, PRODUCER)


def test_clock_bits_past_the_timestamp_are_dropped() -> None:
    # The 64-bit clock holds 60 timestamp bits and 4 counter bits: nothing is lost at the maximum.
    top = (1 << 64) - 1
    assert get_clock(build_uuid(PRODUCER, top, 0)) == top


def test_build_rejects_bad_arguments() -> None:
    with pytest.raises(UUIDError, match="only 10 low bits may be used for flags"):
        build_uuid(PRODUCER, 160, 0x400)
    with pytest.raises(UUIDError, match="unsigned 64-bit"):
        build_uuid(PRODUCER, -1, 0)
    with pytest.raises(UUIDError, match="producer ID must be 6 bytes"):
        build_uuid(b"\x01\x02", 160, 0)
    with pytest.raises(ValueError):  # UUIDError is a ValueError too.
        build_uuid(PRODUCER, 1 << 64, 0)


def test_zero_uuid_has_zero_clock() -> None:
    zero = uuid.UUID(int=0)
    assert (get_clock(zero), get_flags(zero), get_producer_id(zero)) == (0, 0, bytes(6))


def test_flags_string() -> None:
    assert flags_string(Flags.OUTSIDE_TXN) == "OUTSIDE_TXN"
    assert flags_string(Flags.CONTINUE_TXN) == "CONTINUE_TXN"
    assert flags_string(Flags.ACK_TXN) == "ACK_TXN"
    assert flags_string(0x100) == "Flags(100)"


def test_clock() -> None:
    """TestUUIDClock."""
    clock = Clock()
    # Each tick advances one microsecond: 160 units.
    assert clock.tick() == 160
    assert clock.tick() == 320

    clock.update(unix(12, 300))
    # Precise to 100 ns.
    assert clock == Clock.at(unix(12, 399))
    assert clock.as_unix_ns() == unix(12, 300)
    assert clock < Clock.at(unix(12, 400))
    assert clock > Clock.at(unix(12, 299))

    # A tick advances 1 µs.
    clock.tick()
    assert clock.as_unix_ns() == unix(12, 1300)
    assert clock > Clock.at(unix(12, 1299))
    assert clock < Clock.at(unix(12, 1400))

    # Update never moves the clock backward.
    clock.update(unix(11, 100))
    assert clock.as_unix_ns() == unix(12, 1300)

    # Updating forward resets the counter bits.
    clock.update(unix(12, 5000))
    assert clock == Clock.at(unix(12, 5000))
    assert clock.as_unix_ns() == unix(12, 5000)


def test_clock_value_layout() -> None:
    assert clock_at(0) == G1582NS100 << 4
    assert clock_unix_ns(clock_at(unix(5, 700)) + 0xF) == unix(5, 700)  # The counter is dropped.
    assert clock_at(-150) == (G1582NS100 - 1) << 4  # Truncates toward zero, as Go's division.
    assert int(Clock(TICK)) == 160


def test_clock_update_defaults_to_now() -> None:
    clock = Clock()
    clock.update()
    assert clock.value > clock_at(unix(1_600_000_000, 0))


def test_clock_ticks_are_unique_across_threads() -> None:
    clock = Clock()
    seen: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        values = [clock.tick() for _ in range(2000)]
        with lock:
            seen.extend(values)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == [TICK * i for i in range(1, 8001)]


def test_clock_rejects_out_of_range_values() -> None:
    with pytest.raises(ValueError):
        Clock(-1)
    assert Clock((1 << 64) - 160).tick() == 0  # Wraps as Go's uint64 does.


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("83fc2f81-cc5f-11e9-9402-010203040506", "83fc2f81-cc5f-11e9-9402-010203040506"),
        ("83FC2F81-CC5F-11E9-9402-010203040506", "83fc2f81-cc5f-11e9-9402-010203040506"),
        ("urn:uuid:83fc2f81-cc5f-11e9-9402-010203040506", "83fc2f81-cc5f-11e9-9402-010203040506"),
        ("{83fc2f81-cc5f-11e9-9402-010203040506}", "83fc2f81-cc5f-11e9-9402-010203040506"),
        ("83fc2f81cc5f11e99402010203040506", "83fc2f81-cc5f-11e9-9402-010203040506"),
    ],
)
def test_parse_uuid_forms(text: str, expect: str) -> None:
    assert str(parse_uuid(text)) == expect


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("not-a-uuid", "invalid UUID length: 10"),
        ("", "invalid UUID length: 0"),
        ("83fc2f81+cc5f-11e9-9402-010203040506", "invalid UUID format"),
        ("83fc2f81-cc5f-11e9-9402-01020304050g", "invalid UUID format"),
        ("83fc2f81cc5f11e99402010203040z06", "invalid UUID format"),
        # Strings int(_, 16) would take.
        ("0xfc2f81-cc5f-11e9-9402-010203040506", "invalid UUID format"),
        ("+3fc2f81-cc5f-11e9-9402-010203040506", "invalid UUID format"),
        ("83fc2f8_-cc5f-11e9-9402-010203040506", "invalid UUID format"),
        (" 3fc2f81-cc5f-11e9-9402-010203040506", "invalid UUID format"),
        ("83fc2f81-cc5f-11e9-9402-0102030405-6", "invalid UUID format"),
        ("urn:uuix:83fc2f81-cc5f-11e9-9402-010203040506", 'invalid urn prefix: "urn:uuix:"'),
    ],
)
def test_parse_uuid_errors(text: str, reason: str) -> None:
    with pytest.raises(UUIDError) as info:
        parse_uuid(text)
    assert info.value.reason == reason
