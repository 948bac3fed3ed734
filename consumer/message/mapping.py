"""Mapping helpers: choose the journal (partition) a message is published to.

A MappingFunc maps a message to `(journal, content_type)`, the content type being the chosen
journal's `content-type` label, from which the publisher picks the framing. Partitions are
journal specs (or ListResponse journals, or bare names, whose content type is then ""), taken
in the order given; Gazette's ListResponse is sorted by name. They may be a fixed sequence or a
function returning the current one, as a watched journal listing would.

Keys are hashed with 32-bit FNV-1a, as Gazette does, so a key maps to the same journal here
and in Go.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

from broker.protocol import labels as lbl
from broker.protocol import pb
from consumer.message.errors import EmptyPartitionsError

Partition: TypeAlias = pb.JournalSpec | pb.ListResponse.Journal | str
Partitions: TypeAlias = Sequence[Partition] | pb.ListResponse
PartitionsFunc: TypeAlias = Callable[[], Partitions]
MappingFunc: TypeAlias = Callable[[Any], tuple[str, str]]
"""Maps a message to (journal name, content type)."""
MappingKeyFunc: TypeAlias = Callable[[Any], bytes | str]
"""Extracts the key of a message; str keys are hashed as UTF-8."""

FNV32_OFFSET = 0x811C9DC5
FNV32_PRIME = 0x01000193


def fnv1a32(data: bytes) -> int:
    """The 32-bit FNV-1a hash of `data`."""
    h = FNV32_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV32_PRIME) & 0xFFFFFFFF
    return h


def random_mapping(partitions: Partitions | PartitionsFunc, rng: random.Random | None = None) -> MappingFunc:
    """Map every message to a uniformly random partition."""
    current = _resolver(partitions)
    choose = (rng or random.Random()).randrange

    def mapping(message: Any) -> tuple[str, str]:
        parts = current()
        if not parts:
            raise EmptyPartitionsError()
        return _name_and_content_type(parts[choose(len(parts))])

    return mapping


def modulo_mapping(key: MappingKeyFunc, partitions: Partitions | PartitionsFunc) -> MappingFunc:
    """Map a message to partition `fnv1a32(key) % len(partitions)`: stable while the count is."""
    current = _resolver(partitions)

    def mapping(message: Any) -> tuple[str, str]:
        parts = current()
        if not parts:
            raise EmptyPartitionsError()
        return _name_and_content_type(parts[fnv1a32(_key_bytes(key(message))) % len(parts)])

    return mapping


def rendezvous_mapping(key: MappingKeyFunc, partitions: Partitions | PartitionsFunc) -> MappingFunc:
    """Map a message by highest random weight: the partition maximising `fnv1a32(key) ^ fnv1a32(name)`.

    Costlier than modulo, but adding or removing partitions moves few keys. Ties go to the
    earliest partition. Name hashes are cached while the partitions object stays the same one.
    """
    current = _resolver(partitions)
    lock = threading.Lock()
    cached_parts: list[Sequence[Partition] | None] = [None]  # Held, so its identity can't be reused.
    cached_hashes: list[list[int]] = [[]]

    def hashes_of(parts: Sequence[Partition]) -> list[int]:
        with lock:
            if parts is not cached_parts[0]:
                cached_parts[0] = parts
                cached_hashes[0] = [fnv1a32(_name_and_content_type(p)[0].encode("utf-8")) for p in parts]
            return cached_hashes[0]

    def mapping(message: Any) -> tuple[str, str]:
        parts = current()
        if not parts:
            raise EmptyPartitionsError()
        hashes = hashes_of(parts)
        sum_ = fnv1a32(_key_bytes(key(message)))
        best, index = 0, 0
        for i, h in enumerate(hashes):
            if (weight := sum_ ^ h) > best:
                best, index = weight, i
        return _name_and_content_type(parts[index])

    return mapping


def _resolver(partitions: Partitions | PartitionsFunc) -> Callable[[], Sequence[Partition]]:
    """A function returning the current partitions as a sequence, keeping object identity stable."""
    if callable(partitions):
        fn = partitions
        last: list[Any] = [None, None]  # (ListResponse seen, its journals), for identity-stable caching.

        def current() -> Sequence[Partition]:
            parts = fn()
            if isinstance(parts, pb.ListResponse):
                if parts is not last[0]:
                    last[0], last[1] = parts, list(parts.journals)
                journals: Sequence[Partition] = last[1]
                return journals
            return parts

        return current

    fixed: Sequence[Partition] = list(partitions.journals) if isinstance(partitions, pb.ListResponse) else partitions
    return lambda: fixed


def _name_and_content_type(part: Partition) -> tuple[str, str]:
    if isinstance(part, str):
        return part, ""
    spec = part.spec if isinstance(part, pb.ListResponse.Journal) else part
    return spec.name, lbl.value_of(spec.labels, lbl.CONTENT_TYPE) or ""


def _key_bytes(key: bytes | str) -> bytes:
    return key.encode("utf-8") if isinstance(key, str) else key
