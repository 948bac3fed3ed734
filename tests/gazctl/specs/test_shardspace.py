"""The shardspace YAML (gazctl.specs.shardspace): Gazette's TestYAMLRoundTrip fixture, push-down and hoisting."""

from __future__ import annotations

import pytest

from broker.specs import SpecError
from consumer.protocol import pb
from gazctl.specs import shardspace

# Gazette's consumer/shardspace TestYAMLRoundTrip: decoding then encoding gives exactly this text.
FIXTURE = """\
common:
  recovery_log_prefix: recovery/logs
  hint_prefix: /hints
  hint_backups: 2
  max_txn_duration: 1s
  min_txn_duration: 1ms
  hot_standbys: 1
  labels:
  - name: name-1
    value: val-1
  disable_wait_for_ack: true
shards:
- comment: This is a comment
  delete: true
  id: shard-A
  sources:
  - journal: journal/A
  labels:
  - name: name-2
    value: val-2
  revision: 123
- id: shard-B
  sources:
  - journal: journal/B
  disable: true
  labels:
  - name: name-3
    value: val-3
  revision: 456
"""


def test_round_trip_push_down_and_hoist() -> None:
    space = shardspace.load(FIXTURE, "fixture")
    assert shardspace.dump(space) == FIXTURE

    a, b = shardspace.flatten(space)
    assert a.delete and a.expect_mod_revision == 123 and not b.delete and b.expect_mod_revision == 456
    assert [(label.name, label.value) for label in a.spec.labels.labels] == [("name-1", "val-1"), ("name-2", "val-2")]
    assert [(label.name, label.value) for label in b.spec.labels.labels] == [("name-1", "val-1"), ("name-3", "val-3")]
    for flat in (a, b):
        assert flat.spec.recovery_log_prefix == "recovery/logs" and flat.spec.hint_backups == 2
        assert flat.spec.max_txn_duration.ToMilliseconds() == 1000 and flat.spec.hot_standbys == 1
    assert b.spec.disable and not a.spec.disable

    change = shardspace.change(a)
    assert change.delete == "shard-A" and change.expect_mod_revision == 123

    hoisted = shardspace.hoist([(a.spec, 123), (b.spec, 456)])
    hoisted.shards[0].comment, hoisted.shards[0].delete = "This is a comment", True
    assert shardspace.dump(hoisted) == FIXTURE


def test_one_shard_hoists_into_common_and_keeps_its_id() -> None:
    spec = pb.ShardSpec(id="shard-one")
    spec.sources.add(journal="a/journal")
    spec.max_txn_duration.FromMilliseconds(250)
    text = shardspace.dump(shardspace.hoist([(spec, 7)]))
    assert text == (
        "common:\n  sources:\n  - journal: a/journal\n  max_txn_duration: 250ms\n"
        "shards:\n- id: shard-one\n  revision: 7\n"
    )
    [flat] = shardspace.load_flat(text)
    assert flat.spec == spec and flat.expect_mod_revision == 7
    assert shardspace.dump(shardspace.hoist([])) == "shards: []\n"


def test_empty_and_ill_typed_documents() -> None:
    with pytest.raises(SpecError, match=r"^f:1:1: empty document"):
        shardspace.load("", "f")
    with pytest.raises(SpecError, match=r"^f:2:18: shards\[0\]\.hot_standbys: expected an integer"):
        shardspace.load("shards:\n- {hot_standbys: many}\n", "f")
    with pytest.raises(SpecError, match=r"^f:2:3: shards\[0\]: shard has no id"):
        shardspace.flatten(shardspace.load("shards:\n- sources: []\n", "f"))
