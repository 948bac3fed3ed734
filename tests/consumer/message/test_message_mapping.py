"""Mapping helpers: Gazette's modulo and rendezvous regression fixtures, and their edge cases."""

from __future__ import annotations

import random

import pytest

from broker.protocol import labels as lbl
from broker.protocol import pb
from consumer.message import EmptyPartitionsError, fnv1a32, modulo_mapping, random_mapping, rendezvous_mapping
from tests.consumer.message.helpers import TestMsg

MODULO_FIXTURES = {
    "It always": 119,
    "seems": 54,
    "impossible": 308,
    "until": 97,
    "it is done.": 179,
    "- Nelson Mandela": 437,
    "Shall I compare": 84,
    "thee to": 300,
    "a summer's day?": 214,
    "Thou art more": 135,
    "lovely and more": 118,
    "temperate - Shakespeare": 228,
}
RENDEZVOUS_FIXTURES = {
    "It always": 21,
    "seems": 179,
    "impossible": 50,
    "until": 13,
    "it is done.": 337,
    "- Nelson Mandela": 29,
    "Shall I compare": 110,
    "thee to": 395,
    "a summer's day?": 192,
    "Thou art more": 394,
    "lovely and more": 344,
    "temperate - Shakespeare": 75,
}


def partitions(count: int) -> pb.ListResponse:
    """Gazette's buildPartitionsFuncFixture: journals a/topic/part-NNN of JSON lines."""
    labels = lbl.label_set((lbl.CONTENT_TYPE, lbl.CONTENT_TYPE_JSON_LINES))
    return pb.ListResponse(
        journals=[
            pb.ListResponse.Journal(spec=pb.JournalSpec(name=f"a/topic/part-{i:03d}", labels=labels))
            for i in range(count)
        ]
    )


def key(msg: TestMsg) -> str:
    return msg.Str


def test_fnv1a32() -> None:
    assert fnv1a32(b"") == 0x811C9DC5
    assert fnv1a32(b"a") == 0xE40C292C
    assert fnv1a32(b"foobar") == 0xBF9CF968


def test_modulo_mapping_regression_fixtures() -> None:
    parts = partitions(443)  # A prime count.
    mapping = modulo_mapping(key, lambda: parts)
    for text, index in MODULO_FIXTURES.items():
        assert mapping(TestMsg(Str=text)) == (f"a/topic/part-{index:03d}", lbl.CONTENT_TYPE_JSON_LINES), text


def test_rendezvous_mapping_regression_fixtures() -> None:
    # Rendezvous hashing moves few keys when partitions change: these agree at 400 and 500.
    for count in (400, 500):
        mapping = rendezvous_mapping(key, partitions(count))
        for text, index in RENDEZVOUS_FIXTURES.items():
            assert mapping(TestMsg(Str=text)) == (f"a/topic/part-{index:03d}", lbl.CONTENT_TYPE_JSON_LINES), text


def test_random_mapping_spreads_and_copies_content_type() -> None:
    mapping = random_mapping(partitions(100), rng=random.Random(7))
    results = {mapping(TestMsg(Str="foobar")) for _ in range(101)}
    assert len(results) > 1
    assert {content_type for _, content_type in results} == {lbl.CONTENT_TYPE_JSON_LINES}


@pytest.mark.parametrize(
    "make",
    [
        lambda parts: modulo_mapping(key, parts),
        lambda parts: rendezvous_mapping(key, parts),
        lambda parts: random_mapping(parts),
    ],
)
def test_empty_partitions(make: object) -> None:
    for empty in ([], pb.ListResponse(), lambda: []):
        mapping = make(empty)  # type: ignore[operator]
        with pytest.raises(EmptyPartitionsError) as info:
            mapping(TestMsg(Str="x"))
        assert info.value.reason == "empty ListResponse"


def test_partitions_as_specs_and_names() -> None:
    specs = [spec.spec for spec in partitions(443).journals]
    assert modulo_mapping(key, specs)(TestMsg(Str="seems")) == ("a/topic/part-054", lbl.CONTENT_TYPE_JSON_LINES)
    names = [spec.name for spec in specs]
    assert modulo_mapping(key, names)(TestMsg(Str="seems")) == ("a/topic/part-054", "")
    # Keys may be bytes.
    assert modulo_mapping(lambda m: m.Str.encode(), names)(TestMsg(Str="seems"))[0] == "a/topic/part-054"


def test_rendezvous_follows_changing_partitions() -> None:
    current = [partitions(400)]
    mapping = rendezvous_mapping(key, lambda: current[0])
    assert mapping(TestMsg(Str="seems"))[0] == "a/topic/part-179"

    # A new listing is a new object: hashes are recomputed for it.
    current[0] = pb.ListResponse(journals=[j for j in current[0].journals if j.spec.name != "a/topic/part-179"])
    moved = mapping(TestMsg(Str="seems"))[0]
    assert moved != "a/topic/part-179"
    # Keys whose journal survived stay put.
    assert mapping(TestMsg(Str="impossible"))[0] == "a/topic/part-050"


def test_rendezvous_ties_go_to_the_first_partition() -> None:
    # Weight is key-hash XOR name-hash, so a key equal to the only name weighs 0: index 0 still wins.
    assert rendezvous_mapping(key, ["x"])(TestMsg(Str="x")) == ("x", "")
    assert rendezvous_mapping(key, ["dup", "dup"])(TestMsg(Str="k"))[0] == "dup"
