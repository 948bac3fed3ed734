"""JSONFileStore against a real broker: commits recorded to a recovery log play back into another
directory with exactly the last committed state and checkpoint; a failed dependency or a fenced
log fails the commit and leaves no trace; Gazette's file format, legacy offsets included."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from consumer.protocol import pb
from consumer.recoverylog import FileRecorder, FSMHints
from consumer.recoverylog.ops import decode_frames
from consumer.stores import ConsumerStoreError, FenceError, JSONFileStore, StoreDependencyError
from consumer.stores.json_file import checkpoint_from_json, checkpoint_to_json, go_json_line
from tests.consumer.stores.recorded import (
    TIMEOUT,
    FakeShard,
    Log,
    checkpoint,
    failed,
    new_log_with,
    read_log,
    recorded,
)

__all__ = ["recorded"]  # A fixture.

SHARD = FakeShard()


@dataclass
class Counts:
    words: dict[str, int] = field(default_factory=dict)
    total: int = 0


async def commit(store: JSONFileStore[Any], n: int, wait_for: list[asyncio.Future[None]] | None = None) -> None:
    await asyncio.wait_for(store.start_commit(SHARD, checkpoint(n), wait_for or []), TIMEOUT)


async def test_commits_play_back_to_the_last_committed_state(recorded: Log, tmp_path: Path) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store: JSONFileStore[dict[str, int]] = JSONFileStore(rec, {})
    assert await store.restore_checkpoint(SHARD) == pb.Checkpoint()
    for n in range(1, 6):
        store.state[f"key{n}"] = n
        await commit(store, n)
    # A change after the last commit is not in the log.
    store.state["uncommitted"] = 99

    rec2 = await recorded.take_over(tmp_path / "next", 2222)
    assert sorted(p.name for p in Path(rec2.dir).iterdir()) == ["state.json"]
    store2: JSONFileStore[dict[str, int]] = JSONFileStore(rec2, {})
    assert store2.state == {f"key{n}": n for n in range(1, 6)}
    assert await store2.restore_checkpoint(SHARD) == checkpoint(5)

    # The new primary commits on; the log's live files stay one: state.json.
    store2.state["key6"] = 6
    await commit(store2, 6)
    assert list(rec2.fsm.links) == ["/state.json"]
    assert len(rec2.fsm.live_nodes) == 1
    store3: JSONFileStore[dict[str, int]] = JSONFileStore(await recorded.take_over(tmp_path / "third", 3333), {})
    assert store3.state["key6"] == 6
    assert await store3.restore_checkpoint(SHARD) == checkpoint(6)


async def test_dataclass_state(recorded: Log, tmp_path: Path) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store = JSONFileStore(rec, Counts())
    store.state.words["hello"] = 2
    store.state.total = 2
    await commit(store, 1)
    lines = (tmp_path / "primary" / "state.json").read_bytes().splitlines()
    assert lines[:2] == [b"{}", b'{"words":{"hello":2},"total":2}']
    again = JSONFileStore(await recorded.take_over(tmp_path / "next", 2222), Counts())
    assert again.state == Counts({"hello": 2}, 2)


async def test_a_failed_dependency_fails_the_commit(recorded: Log, tmp_path: Path) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store: JSONFileStore[dict[str, int]] = JSONFileStore(rec, {"n": 1})
    await commit(store, 1)
    store.state["n"] = 2
    with pytest.raises(StoreDependencyError, match="dependency failed: append failed"):
        await commit(store, 2, [failed(RuntimeError("append failed"))])
    # The Recorder is failed: so is every later commit.
    store.state["n"] = 3
    with pytest.raises(ConsumerStoreError):
        await commit(store, 3)

    store2: JSONFileStore[dict[str, int]] = JSONFileStore(await recorded.take_over(tmp_path / "next", 2222), {})
    assert store2.state == {"n": 1}
    assert await store2.restore_checkpoint(SHARD) == checkpoint(1)


async def test_a_fenced_recorder_fails_the_commit(recorded: Log, tmp_path: Path) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store: JSONFileStore[dict[str, int]] = JSONFileStore(rec, {"n": 1})
    await commit(store, 1)

    # A new primary takes the log: it injects a hand-off, fencing the old author.
    rec2 = await recorded.take_over(tmp_path / "next", 2222)
    store.state["n"] = 2
    with pytest.raises(FenceError, match="fenced"):
        await commit(store, 2)

    # Neither the new primary nor a later player sees the fenced commit.
    assert JSONFileStore(rec2, {}).state == {"n": 1}
    resolved = await recorded.play(tmp_path / "later")
    assert json.loads((Path(resolved.dir) / "state.json").read_text().splitlines()[1]) == {"n": 1}


async def test_destroy_removes_the_directory(recorded: Log, tmp_path: Path) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store: JSONFileStore[dict[str, int]] = JSONFileStore(rec, {})
    await commit(store, 1)
    await store.destroy()
    assert not (tmp_path / "primary").exists()


async def test_legacy_offsets_override_read_through(recorded: Log, tmp_path: Path) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    # A legacy file: offsets and state, no checkpoint.
    (tmp_path / "primary" / "state.json").write_text('{"a/journal":1234,"b/journal":5}\n{"x":1}\n')
    store: JSONFileStore[dict[str, int]] = JSONFileStore(rec, {})
    assert store.state == {"x": 1}
    cp = await store.restore_checkpoint(SHARD)
    assert {j: s.read_through for j, s in cp.sources.items()} == {"a/journal": 1234, "b/journal": 5}
    # Offsets override a checkpoint's read-through, and keep its producers.
    doc = checkpoint_to_json(checkpoint(1))
    (tmp_path / "primary" / "state.json").write_bytes(
        go_json_line({"a/journal": 7}) + go_json_line({"x": 2}) + go_json_line(doc))
    cp = await store.restore_checkpoint(SHARD)
    assert cp.sources["a/journal"].read_through == 7
    assert len(cp.sources["a/journal"].producers) == 1


async def test_a_corrupt_file_is_a_clear_error(recorded: Log, tmp_path: Path) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    (tmp_path / "primary" / "state.json").write_text('{}\n{"x": ')
    with pytest.raises(ConsumerStoreError, match=r"state\.json is not concatenated JSON documents"):
        JSONFileStore(rec, {})


def test_checkpoint_json_is_gazettes() -> None:
    """Go's encoding/json of pc.Checkpoint: snake_case tags, omitempty, base64 bytes, sorted maps."""
    cp = checkpoint(1)
    assert go_json_line(checkpoint_to_json(cp)) == (
        b'{"sources":{"a/journal":{"read_through":100,"producers":[{"id":"AQIDBAUG","state":'
        b'{"last_ack":1099511627776,"begin":-1}}]}},"ack_intents":{"ack/journal":"YWNrIDE="}}\n'
    )
    assert checkpoint_from_json(checkpoint_to_json(cp)) == cp
    assert go_json_line(checkpoint_to_json(pb.Checkpoint())) == b'{"sources":null}\n'
    assert checkpoint_from_json({"sources": None}) == pb.Checkpoint()
    empty_source = pb.Checkpoint()
    empty_source.sources["j"].read_through = 0
    assert checkpoint_to_json(empty_source) == {"sources": {"j": {"producers": None}}}
    assert checkpoint_from_json(checkpoint_to_json(empty_source)) == empty_source
    assert go_json_line({"a": "<&>"}) == b'{"a":"\\u003c\\u0026\\u003e"}\n'
    with pytest.raises(ValueError, match="read_through of j is not an integer"):
        checkpoint_from_json({"sources": {"j": {"read_through": "1"}}})


async def test_a_log_cut_inside_the_rename_recovers_next_json(recorded: Log, tmp_path: Path) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store: JSONFileStore[dict[str, int]] = JSONFileStore(rec, {"n": 1})
    await commit(store, 1)
    # The next commit's ops, as if the log ended after the rename's unlink of state.json.
    content = go_json_line({}) + go_json_line({"n": 2}) + go_json_line(checkpoint_to_json(checkpoint(2)))
    nxt = tmp_path / "primary" / "next.json"
    nxt.write_bytes(content)
    FileRecorder(rec, rec.record_create(nxt)).record_write(content)
    rec.record_remove(tmp_path / "primary" / "state.json")
    await asyncio.wait_for(rec.barrier(), TIMEOUT)

    rec2 = await recorded.take_over(tmp_path / "next", 2222)
    assert sorted(p.name for p in Path(rec2.dir).iterdir()) == ["next.json"]
    store2: JSONFileStore[dict[str, int]] = JSONFileStore(rec2, {})
    assert store2.state == {"n": 2}
    assert await store2.restore_checkpoint(SHARD) == checkpoint(2)
    store2.state["n"] = 3
    await commit(store2, 3)
    assert sorted(p.name for p in Path(rec2.dir).iterdir()) == ["state.json"]

    # A next.json cut short is no state at all: a fresh store.
    rec3 = await recorded.recorder(tmp_path / "third", 3333)
    partial = tmp_path / "third" / "next.json"
    partial.write_bytes(content[:-10])
    assert JSONFileStore(rec3, {"fresh": 1}).state == {"fresh": 1}


async def test_a_large_state(recorded: Log, tmp_path: Path) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store: JSONFileStore[dict[str, str]] = JSONFileStore(rec, {})
    for n in range(1, 3):
        store.state.update({f"key{i}": f"{n}-{i}" * 100 for i in range(3000)})  # ~6 MB of JSON
        await commit(store, n)
    store2: JSONFileStore[dict[str, str]] = JSONFileStore(await recorded.take_over(tmp_path / "next", 2222), {})
    assert store2.state == store.state
    assert await store2.restore_checkpoint(SHARD) == checkpoint(2)


async def test_every_prefix_of_the_log_is_a_committed_state(recorded: Log, tmp_path: Path) -> None:
    """Whatever op of the log a primary died after (even inside a rename), a playback up to there
    holds the state and checkpoint of one commit, never going back."""
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store: JSONFileStore[dict[str, int]] = JSONFileStore(rec, {})
    for n in range(1, 6):
        store.state[f"key{n}"] = n
        await commit(store, n)
    data = await read_log(recorded.client, recorded.name)
    ends = [op.last_offset for op, _, _ in decode_frames(data)]
    assert len(ends) == 4 + 4 * 5  # create, write, link, unlink; later ones unlink the old state.json too
    last = 0
    for i, cut in enumerate(ends):
        log = await new_log_with(recorded.client, recorded.ajc, data[:cut])
        resolved = await recorded.play(tmp_path / f"prefix-{i}", hints=FSMHints(log=log))
        rec2 = await recorded.recorder(Path(resolved.dir), 2222, resolved.fsm)
        store2: JSONFileStore[dict[str, int]] = JSONFileStore(rec2, {})
        cp = await store2.restore_checkpoint(SHARD)
        n = cp.sources["a/journal"].read_through // 100 if cp.sources else 0
        assert store2.state == {f"key{k}": k for k in range(1, n + 1)}
        assert cp == (checkpoint(n) if n else pb.Checkpoint())
        assert n >= last
        last = n
    assert last == 5
