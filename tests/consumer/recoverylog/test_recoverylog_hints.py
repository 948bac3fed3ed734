"""FSMHints in a real etcd: Gazette's TestStoreAndFetchHints rotation, fencing by the assignment's
CreateRevision, the JSON codec, and validation of fetched hints."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cluster.keyspace.keyspace import get_op, put_op, txn_response
from consumer.protocol import pb as cpb
from consumer.protocol import recoverylog_pb
from consumer.recoverylog.errors import HintsError
from consumer.recoverylog.hints import (
    decode_hints,
    encode_hints,
    fetch_hints,
    pick_first_hints,
    store_recorded_hints,
    store_recovered_hints,
)

FSMHints = recoverylog_pb.FSMHints
LOG = "recovery/logs/shard-A"


def hints_of(n: int, log: str = LOG) -> FSMHints:
    """Hints telling `n` apart: one live Fnode `n`."""
    hints = FSMHints(log=log)
    hints.live_nodes.add(fnode=n).segments.add(author=1, first_seq_no=n, last_seq_no=n + 1, first_checksum=n,
                                               first_offset=n * 10)
    return hints


def fnode_of(h: FSMHints | None) -> int:
    return h.live_nodes[0].fnode if h is not None else 0


async def create_revision(etcd: Any, key: str) -> int:
    resp = await txn_response(etcd, [], [get_op(key)])
    return int(resp.responses[0].response_range.kvs[0].create_revision)


@pytest.fixture
def spec(etcd_prefix: str) -> cpb.ShardSpec:
    return cpb.ShardSpec(id="shard-A", recovery_log_prefix="recovery/logs", hint_prefix=f"{etcd_prefix}/hints",
                         hint_backups=2)


def test_json_codec_matches_go_encoding() -> None:
    hints = hints_of(7)
    hints.properties.add(path="/IDENTITY", content="guid")
    doc = json.loads(encode_hints(hints))
    assert doc == {
        "log": LOG,
        "live_nodes": [{"fnode": 7, "segments": [{"author": 1, "first_seq_no": 7, "first_offset": 70,
                                                  "first_checksum": 7, "last_seq_no": 8}]}],
        "properties": [{"path": "/IDENTITY", "content": "guid"}],
    }
    assert encode_hints(FSMHints()) == b'{"live_nodes":null,"properties":null}'
    assert decode_hints(encode_hints(hints)) == hints
    assert decode_hints(hints.SerializeToString()) == hints  # Protobuf values are read too.
    with pytest.raises(HintsError, match=r"json\.Unmarshal\(hints\)"):
        decode_hints(b"{not json")


async def test_store_and_fetch_hints(etcd_client: Any, etcd_prefix: str, spec: cpb.ShardSpec) -> None:
    asn = f"{etcd_prefix}/assign/shard-A#local#consumer#0"
    await etcd_client.put(asn.encode(), b"")
    rev = await create_revision(etcd_client, asn)

    async def state() -> tuple[int, ...]:
        return tuple(fnode_of(h) for h in (await fetch_hints(etcd_client, spec)).hints)

    assert await state() == (0, 0, 0)
    assert pick_first_hints((await fetch_hints(etcd_client, spec)).hints, LOG) == FSMHints(log=LOG)
    await store_recovered_hints(etcd_client, spec, hints_of(111), asn, rev)
    assert await state() == (0, 111, 0)
    assert pick_first_hints((await fetch_hints(etcd_client, spec)).hints, LOG) == hints_of(111)
    assert await store_recorded_hints(etcd_client, spec, hints_of(222), asn, rev)
    assert await state() == (222, 111, 0)
    await store_recovered_hints(etcd_client, spec, hints_of(333), asn, rev)
    assert await state() == (222, 333, 111)
    assert await store_recorded_hints(etcd_client, spec, hints_of(444), asn, rev)
    assert await state() == (444, 333, 111)
    await store_recovered_hints(etcd_client, spec, hints_of(555), asn, rev)
    assert await state() == (444, 555, 333)
    fetched = await fetch_hints(etcd_client, spec)
    assert fetched.primary == hints_of(444) and fetched.backups == [hints_of(555), hints_of(333)]
    assert pick_first_hints(fetched.hints, LOG) == hints_of(444)
    # Stored as Gazette's JSON.
    raw = await txn_response(etcd_client, [], [get_op(f"{spec.hint_prefix}/shard-A.primary")])
    assert bytes(raw.responses[0].response_range.kvs[0].value).startswith(b'{"log":"recovery/logs/shard-A"')

    # A re-created assignment (another primary) fences both writes.
    await etcd_client.delete(asn.encode())
    await etcd_client.put(asn.encode(), b"")
    assert not await store_recorded_hints(etcd_client, spec, hints_of(666), asn, rev)
    with pytest.raises(HintsError, match="unexpected Etcd transaction failure"):
        await store_recovered_hints(etcd_client, spec, hints_of(777), asn, rev)
    assert await state() == (444, 555, 333)


async def test_fetched_hints_are_validated(etcd_client: Any, spec: cpb.ShardSpec) -> None:
    key = f"{spec.hint_prefix}/shard-A.primary"
    await etcd_client.put(key.encode(), encode_hints(hints_of(5, "other/log")))
    with pytest.raises(HintsError, match=r"hints\.Log other/log != ShardSpec\.RecoveryLog recovery/logs/shard-A"):
        await fetch_hints(etcd_client, spec)
    bad = hints_of(5)
    bad.live_nodes[0].fnode = 6  # Not its first segment's seq_no.
    await txn_response(etcd_client, [], [put_op(key, encode_hints(bad))])
    with pytest.raises(HintsError, match="validating FSMHints: expected Fnode to match Segment FirstSeqNo"):
        await fetch_hints(etcd_client, spec)
    await etcd_client.put(key.encode(), b"\xff\xff not a proto")
    with pytest.raises(HintsError, match=r"hints\.Unmarshal"):
        await fetch_hints(etcd_client, spec)


async def test_fetch_reads_only_the_shards_own_hint_keys(etcd_client: Any, spec: cpb.ShardSpec) -> None:
    # The hints are read by one Range of the prefix `{hint_prefix}/{id}.`, which also holds the keys of
    # a shard whose id extends this one's after a dot, and backup slots beyond hint_backups: not its.
    await etcd_client.put(f"{spec.hint_prefix}/shard-A.x.primary".encode(), encode_hints(hints_of(9, "x/log")))
    await etcd_client.put(
        f"{spec.hint_prefix}/shard-A.backup.{spec.hint_backups}".encode(), encode_hints(hints_of(8))
    )
    await etcd_client.put(f"{spec.hint_prefix}/shard-A.backup.0".encode(), encode_hints(hints_of(7)))
    fetched = await fetch_hints(etcd_client, spec)
    assert [fnode_of(h) for h in fetched.hints] == [0, 7] + [0] * (spec.hint_backups - 1)
    assert fetched.keys == [f"{spec.hint_prefix}/shard-A.primary"] + [
        f"{spec.hint_prefix}/shard-A.backup.{i}" for i in range(spec.hint_backups)
    ]
