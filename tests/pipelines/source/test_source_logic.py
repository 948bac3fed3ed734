"""Pure logic of the `gazette` source: options, UUID columns, line framing across chunks, read-committed."""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest

from consumer.message import Flags, build_uuid, clock_at, get_clock, new_producer_id
from pipelines.source.committed import CommittedFilter
from pipelines.source.options import GazetteOptionError, parse_options
from pipelines.source.planning import GazettePartition, JournalInfo
from pipelines.source.read import RowBuilder, json_uuids, line_messages, uuid_columns
from pipelines.source.schema import ARROW_BASE


def test_options_defaults_and_errors_name_the_option() -> None:
    opts = parse_options({"selector": "app.gazette.dev/message-type=X", "broker": "http://b:1"})
    assert (opts.starting, opts.ending, opts.isolation, opts.fail_on_data_loss) == (
        "earliest", "latest", "read_committed", True)
    assert parse_options({"selector": "aa=bb", "broker": "http://b:1"}, streaming=True).starting == "latest"
    mixed = parse_options({"SELECTOR": "aa=bb", "broker": "http://b:1", "startingoffsets": '{"j": 5, "k": -2}'})
    assert mixed.starting == {"j": 5, "k": -2}
    for options, name in [
        ({"selector": "aa=bb", "startingOffsets": '{"j": -3}'}, "startingOffsets"),
        ({"selector": "aa=bb", "startingOffsets": '{"j": 9}', "endingOffsets": '{"j": 4}'}, "endingOffsets"),
        ({"selector": "aa=bb", "parse": "xml"}, "parse"),
        ({"selector": "aa=bb", "broker": "ftp://x"}, "broker"),
    ]:
        with pytest.raises(GazetteOptionError, match=f"^{name}"):
            parse_options(options)


def test_uuid_columns_match_the_consumer_uuid_helpers() -> None:
    producer = new_producer_id()
    uuids = [build_uuid(producer, (1 << 60) + 12345 * i, flag) for i, flag in enumerate([0, 1, 2, 1])]
    text = pa.array([str(u).upper() for u in uuids] + [None, "not-a-uuid"], pa.string())
    cols = uuid_columns(text)
    assert cols["uuid"].to_pylist() == [str(u) for u in uuids] + [None, None]
    assert cols["producer"].to_pylist() == [producer.hex()] * 4 + [None, None]
    assert cols["clock"].to_pylist() == [get_clock(u) for u in uuids] + [None, None]
    assert cols["flags"].to_pylist() == [0, 1, 2, 1, None, None]
    assert cols["clock"].type == pa.int64() and cols["flags"].type == pa.int32()


def test_json_uuids_from_a_field_or_meta_and_none_without() -> None:
    u = str(build_uuid(new_producer_id(), 1 << 40, 0))
    values = [json.dumps({"UUID": u}), json.dumps({"_meta": {"uuid": u}, "x": 1}), "{}", json.dumps({"uuid": u})]
    raw = "".join(v + "\n" for v in values).encode()
    arr = json_uuids(raw, pa.array([v.encode() for v in values], pa.binary()))
    assert arr is not None and arr.to_pylist() == [u, u, None, u]
    assert json_uuids(b'{"a":1}\n', pa.array([b'{"a":1}'])) is None
    # Arrow's parser refuses a line which is not an object: Python's takes over.
    bad = [json.dumps({"UUID": u}), "[1]"]
    arr = json_uuids("".join(v + "\n" for v in bad).encode(), pa.array([v.encode() for v in bad]))
    assert arr is not None and arr.to_pylist() == [u, None]


def test_line_messages_join_lines_split_across_chunks() -> None:
    data = b"".join(b'{"i":%d}\n' % i for i in range(1000))
    chunks = [(100 + at, data[at : at + 37]) for at in range(0, len(data), 37)]
    got = list(line_messages(iter(chunks), with_uuids=False))
    values = [v for m in got for v in m.values.to_pylist()]
    offsets = [o for m in got for o in m.offsets.to_pylist()]
    assert values == [b'{"i":%d}' % i for i in range(1000)]
    assert offsets[:2] == [100, 100 + len(b'{"i":0}\n')]
    assert int(got[-1].ends[-1]) == 100 + len(data)


def test_committed_filter_emits_inside_its_range_only() -> None:
    a, b = new_producer_id(), new_producer_id()
    flt = CommittedFilter("j", 100, 300, lambda begin, end: [])
    feed = [
        (100, a, 10, Flags.CONTINUE_TXN),
        (150, b, 10, Flags.OUTSIDE_TXN),
        (200, a, 11, Flags.CONTINUE_TXN),
        (250, b, 11, Flags.CONTINUE_TXN),  # Rolled back below.
        (300, a, 12, Flags.ACK_TXN),  # Past the end: commits a's messages inside it.
        (350, b, 10, Flags.ACK_TXN),  # Rollback of b's open transaction.
    ]
    for offset, producer, clock, flags in feed:
        flt.feed(offset, offset + 50, build_uuid(producer, clock, flags))
        if offset == 250:
            assert flt.pending_inside() and flt.settled_before() == 100
    assert not flt.pending_inside()
    assert sorted(flt.committed) == [100, 150, 200]


def test_row_builder_types_match_the_base_schema() -> None:
    p = GazettePartition(JournalInfo("j", {"region": ["us"]}, "json"), 0, 10, mod_time=1_700_000_000)
    msgs = next(line_messages(iter([(0, b'{"a":1}\n{"b":2}\n')]), with_uuids=True))
    batch = RowBuilder(p, ARROW_BASE, None).build(msgs, None)
    assert batch is not None and batch.schema.equals(ARROW_BASE)
    assert batch.column("labels").to_pylist() == [[("region", ["us"])]] * 2
    assert batch.column("fragment_mod_time")[0].value == 1_700_000_000_000_000


def listed(begin: int, end: int, *, mod_time: int = 0, url: str = "") -> object:
    from broker.protocol import pb

    spec = pb.Fragment(journal="j", begin=begin, end=end, mod_time=mod_time,
                       backing_store="file:///" if url else "")
    return pb.FragmentsResponse._Fragment(spec=spec, signed_url=url)


def test_plan_range_clips_overlaps_and_reports_gaps() -> None:
    from pipelines.source.planning import DataLossError, plan_range

    info = JournalInfo("j", {}, "json")
    opts = parse_options({"selector": "aa=bb", "broker": "http://b:1", "fileRoot": "/r"})
    frags = [listed(100, 200, mod_time=5, url="file:///j/a"), listed(150, 500, mod_time=6, url="file:///j/b"),
             listed(500, 600)]
    parts = plan_range(info, frags, 120, 550, opts)  # type: ignore[arg-type]
    assert [(p.begin, p.end, p.direct) for p in parts] == [(120, 200, True), (200, 500, True), (500, 550, False)]
    # Without fileRoot, file:// fragments are read through the broker.
    no_root = parse_options({"selector": "aa=bb", "broker": "http://b:1"})
    assert not any(p.direct for p in plan_range(info, frags, 100, 600, no_root))  # type: ignore[arg-type]
    gap = [listed(0, 100), listed(200, 300)]
    with pytest.raises(DataLossError, match=r"\[100, 200\)"):
        plan_range(info, gap, 0, 300, opts)  # type: ignore[arg-type]
    lenient = parse_options({"selector": "aa=bb", "broker": "http://b:1", "failOnDataLoss": "false"})
    assert [(p.begin, p.end) for p in plan_range(info, gap, 0, 300, lenient)] == [(0, 100), (200, 300)]  # type: ignore[arg-type]
    # Content removed before the first fragment is no loss when reading from the beginning.
    assert [(p.begin, p.end) for p in plan_range(info, gap[1:], 0, 300, opts, from_beginning=True)] == [(200, 300)]  # type: ignore[arg-type]
    timed = parse_options({"selector": "aa=bb", "broker": "http://b:1", "startingTimestamp": "5500"})
    assert [(p.begin, p.end) for p in plan_range(info, frags, 100, 600, timed)] == [(150, 500), (500, 600)]  # type: ignore[arg-type]
    assert plan_range(info, frags[:2], 100, 500, timed_all := parse_options(  # type: ignore[arg-type]
        {"selector": "aa=bb", "broker": "http://b:1", "startingTimestamp": "99000"})) == []
    assert [(p.begin, p.end) for p in plan_range(info, frags[:2], 100, 700, timed_all)] == [(500, 700)]  # type: ignore[arg-type]


def test_abandoned_transactions_stop_holding_the_stable_end_back() -> None:
    now = time.time_ns()
    old, live = new_producer_id(), new_producer_id()
    flt = CommittedFilter("j", 0, 1000, lambda begin, end: [])
    # A producer that died 20 minutes ago in the middle of a transaction, then one that is live.
    flt.feed(0, 50, build_uuid(old, clock_at(now - 20 * 60 * 10**9), Flags.CONTINUE_TXN))
    flt.feed(50, 100, build_uuid(live, clock_at(now), Flags.OUTSIDE_TXN))
    flt.feed(100, 150, build_uuid(live, clock_at(now) + 1, Flags.CONTINUE_TXN))
    assert flt.settled_before() == 0  # Without a timeout the dead producer holds everything back.
    assert flt.settled_before(now - 10 * 60 * 10**9) == 100  # Abandoned after 10 minutes: the live one rules.
    flt.feed(150, 200, build_uuid(live, clock_at(now) + 2, Flags.ACK_TXN))
    assert flt.settled_before(now - 10 * 60 * 10**9) == 1 << 62


def test_transaction_timeout_is_a_streaming_option() -> None:
    assert parse_options({"selector": "app=x", "transactionTimeout": "30"}, streaming=True).transaction_timeout == 30
    with pytest.raises(GazetteOptionError, match=r"^transactionTimeout: only streaming reads"):
        parse_options({"selector": "app=x", "transactionTimeout": "30"}, streaming=False)
