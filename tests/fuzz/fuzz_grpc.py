"""Fuzzing of every gRPC method of a broker (`protocol.Journal`) and a consumer (`consumer.Shard`).

Request messages are generated with hypothesis from the services' protobuf descriptors: every field
of every message type, nested messages, repeated fields and maps, enums with values the schema does
not know, the extremes of each integer type (int64 min and max, uint64 max), strings of any valid
unicode, control characters and lengths up to 100,000, bytes; string fields whose name says what
they hold (a journal, a shard, a label, a store URL, a template) draw now and then from values that
get past validation, so that inputs reach the code behind it. Streaming methods get sequences of
such messages (an Append is also sent as a header, content chunks and a commit). Raw bytes are sent
as request messages too, through a generic call that does not serialize: random bytes, mutations
of valid messages (flips, cuts, insertions) and hand-made hostile encodings.

The oracle, for each input: every answer is an OK response that decodes, or a gRPC status other
than UNKNOWN, and INTERNAL only when a request message does not decode (`grpc: error unmarshalling
request: ...`, as grpc-go answers); no call runs into its deadline unless it may block by design (a
blocking Read, a List watch, a Stat awaiting offsets, a request waiting for an etcd revision); the
processes stay up and answer `/debug/ready`, and their logs gain no traceback. A canary journal no
input can name is appended known records between inputs, and read back in full at the end: its
content must be exactly what was acknowledged (else a corruption).

tests/broker/test_grpc_fuzz.py and tests/consumer/test_shard_grpc_fuzz.py run a bounded number of
inputs against the test suite's processes. A longer run starts its own etcd, `gazette serve` and
`gazette consume`, and prints what it found:

    python -m tests.fuzz.fuzz_grpc --minutes 10 [--timeout 10] [--seed N]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor as gpd
from google.protobuf import message_factory
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError, Message
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from broker.protocol import pb, pb_grpc
from cluster.keyspace.etcd import EtcdProcess
from consumer.protocol import pb as cpb
from consumer.protocol import pb_grpc as cpb_grpc
from tests.benchmarks.stack import log
from tests.fuzz.fuzz_http import LogWatch
from tests.support.harness import (
    ROOT,
    BrokerProcess,
    append,
    apply_specs,
    free_port,
    journal_spec,
    wait_for_primary,
    wait_http_ready,
)

TARGET = "fuzz/target"
"""A journal the fuzzed requests name often: reads, appends, replications and applies of it go deep."""
OTHER = "fuzz/other/journal"
SHARD = "fuzz-shard"
"""A shard the fuzzed Shard requests name often."""
BLOCK_DEADLINE = 1.0
"""Seconds given to a call that may block by design (its DEADLINE_EXCEEDED is then no hang)."""
MAX_RESPONSES = 32
"""Responses read from a server stream before the call is cancelled (as a client that had enough)."""
UNMARSHAL = "grpc: error unmarshalling request: "


# Methods.


@dataclass(frozen=True)
class Method:
    """One RPC of a service, as its descriptor says."""

    descriptor: gpd.MethodDescriptor

    @property
    def path(self) -> str:
        return f"/{self.descriptor.containing_service.full_name}/{self.descriptor.name}"

    @property
    def name(self) -> str:
        return f"{self.descriptor.containing_service.full_name}.{self.descriptor.name}"

    @property
    def client_streaming(self) -> bool:
        return bool(self.descriptor.client_streaming)

    @property
    def server_streaming(self) -> bool:
        return bool(self.descriptor.server_streaming)

    @property
    def request(self) -> type[Message]:
        return message_factory.GetMessageClass(self.descriptor.input_type)

    @property
    def response(self) -> type[Message]:
        return message_factory.GetMessageClass(self.descriptor.output_type)


def service_methods(file: gpd.FileDescriptor, service: str) -> list[Method]:
    return [Method(m) for m in file.services_by_name[service].methods]


JOURNAL_METHODS = service_methods(pb.DESCRIPTOR, "Journal")
SHARD_METHODS = service_methods(cpb.DESCRIPTOR, "Shard")


# Generation of messages from descriptors.

FD = gpd.FieldDescriptor
INT_RANGES: dict[int, tuple[int, int]] = {
    FD.TYPE_INT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FD.TYPE_UINT32: (0, 2**32 - 1),
    FD.TYPE_FIXED32: (0, 2**32 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1),
    FD.TYPE_FIXED64: (0, 2**64 - 1),
}


def integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    """Integers of [lo, hi]: its extremes and their neighbours, small ones, and any."""
    edges = sorted({v for v in (lo, lo + 1, hi - 1, hi, -1, 0, 1, 2, 1024, 2**31 - 1, 2**31, 2**32 - 1, 2**53)
                    if lo <= v <= hi})
    small = st.integers(max(lo, -2), min(hi, 4096))
    return st.one_of(st.sampled_from(edges), small, small, st.integers(lo, hi))


# Valid unicode (no surrogates: a proto string is UTF-8), control characters included.
_chars = st.characters(exclude_categories=("Cs",))
odd_strings = st.one_of(
    st.text(_chars, max_size=24),
    st.text(st.characters(min_codepoint=0, max_codepoint=0x1F), min_size=1, max_size=8),
    st.text(st.sampled_from("\x00\t\n\r\x7f\u0085\u2028\u202e\ufeff\uffff\U0010ffff\U0001f600é/;#:=% "),
            min_size=1, max_size=16),
    st.integers(1, 100_000).map(lambda n: "a" * n),
    st.integers(1, 3000).map(lambda n: "é/" * n),
)
journal_names = st.one_of(
    st.sampled_from([TARGET] * 6 + [OTHER, TARGET + ";meta", TARGET + ";", "fuzz/target/", "/fuzz/target",
                                    "fuzz//target", "fuzz/../target", "fuzz", "", "fuzz/target;a;b", "fuzz/目標"]),
    st.text("abcdefghij/-_.;=%", min_size=1, max_size=20).map(lambda s: "fuzz/" + s),
)
label_names = st.sampled_from(["name", "prefix", "id", "content-type", "app.gazette.dev/message-type",
                               "app.gazette.dev/message-subtype", "app.gazette.dev/managed-by", "a", "ab", "x:y",
                               "estuary.dev/label", "Ab-9_+/.", "é"])
label_values = st.sampled_from(["", "fuzz/", "fuzz", TARGET, "application/x-ndjson", "application/json; x=y",
                                "text/plain;;", "a b", "%", "=", SHARD, "v"])
store_urls = st.sampled_from(["file:///", "file:///fuzz/", "file:///../", "file://host/p/", "file:///a b/",
                              "s3://bucket/", "s3://bucket", "gs://bucket/p/", "azure://c/p/", "azure-ad://t/a/c/",
                              "http://x/", "", "relative/", "file:///%zz/", "s3://b/?endpoint=http://127.0.0.1:1"])
delete_prefixes = st.sampled_from(["", "a/", "a", "../", "..", "x/../", "/abs/", "a//b/", "./", "é/", "a/b/c/"])
templates = st.sampled_from(["", "{{", "{{ .Spool.FirstAppendTime }}", "{{ .JournalSpec.Name }}",
                             "{{ .Spool.Registers }}", '{{ printf "%s" }}', "{{ template \"x\" }}",
                             "date={{ .Spool.FirstAppendTime.Format \"2006-01-02\" }}/", "{{ index . 99 }}"])
endpoints = st.sampled_from(["", "http://127.0.0.1:1/", "http://[::1/", "unix://host/tmp/sock", "https://x:99999/",
                             "gazette://x/", "http://127.0.0.1:1"])
shard_ids = st.sampled_from([SHARD] * 4 + ["fuzz-shard-2", "", "a", "fuzz shard", "fuzz/shard", "é" * 3])
recovery_prefixes = st.sampled_from(["", "fuzz/recovery", "fuzz/recovery/", "/abs", "fuzz//r"])
hint_prefixes = st.sampled_from(["", "/fuzz/hints", "fuzz/hints", "/fuzz/hints/", "/"])

HINTS: dict[str, st.SearchStrategy[str]] = {
    "protocol.Label.name": label_names,
    "protocol.Label.value": label_values,
    "protocol.JournalSpec.name": journal_names,
    "protocol.JournalSpec.Fragment.stores": store_urls,
    "protocol.JournalSpec.Fragment.path_postfix_template": templates,
    "protocol.Fragment.backing_store": store_urls,
    "protocol.FragmentStoreHealthRequest.fragment_store": store_urls,
    "protocol.FragmentStoreHealthRequest.check_delete_prefix": delete_prefixes,
    "protocol.ProcessSpec.endpoint": endpoints,
    "protocol.Route.endpoints": endpoints,
    "protocol.ApplyRequest.Change.delete": journal_names,
    "consumer.ShardSpec.id": shard_ids,
    "consumer.ShardSpec.recovery_log_prefix": recovery_prefixes,
    "consumer.ShardSpec.hint_prefix": hint_prefixes,
    "consumer.ApplyRequest.Change.delete": shard_ids,
    "consumer.StatRequest.shard": shard_ids,
    "consumer.GetHintsRequest.shard": shard_ids,
    "consumer.UnassignRequest.shards": shard_ids,
    "consumer.StatRequest.ReadThroughEntry.key": journal_names,
}
"""Values that get past validation, by field (full name), or by field name below."""
HINTS_BY_NAME: dict[str, st.SearchStrategy[str]] = {
    "journal": journal_names,
    "deprecated_journal": journal_names,
    "log": journal_names,
    "zone": st.sampled_from(["local", "a", "", "zone#1"]),
    "suffix": st.sampled_from(["broker-1", "consumer", "abc", "", "x" * 129]),
}


def _string_strategy(f: gpd.FieldDescriptor) -> st.SearchStrategy[str]:
    hint = HINTS.get(f.full_name)
    if hint is None:
        hint = HINTS_BY_NAME.get(f.name)
    return st.one_of(hint, hint, odd_strings) if hint is not None else odd_strings


_bytes = st.one_of(
    st.binary(max_size=64),
    st.binary(max_size=64).map(lambda b: b + b"\n"),
    st.sampled_from([b'{"Key":"k","Value":"v"}\n', b"\n", b"\x00" * 10, b"\xff" * 10]),
    st.integers(1, 1 << 16).map(lambda n: b"x" * n),
    st.integers(60_000, 1 << 20).map(lambda n: b"y" * n),
)


def _scalar_strategy(f: gpd.FieldDescriptor) -> st.SearchStrategy[Any]:
    if f.type in INT_RANGES:
        return integers(*INT_RANGES[f.type])
    if f.type == FD.TYPE_BOOL:
        return st.booleans()
    if f.type in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
        return st.floats(width=32 if f.type == FD.TYPE_FLOAT else 64)
    if f.type == FD.TYPE_STRING:
        return _string_strategy(f)
    if f.type == FD.TYPE_BYTES:
        return _bytes
    if f.type == FD.TYPE_ENUM:
        known = [v.number for v in f.enum_type.values]
        # Open (proto3) enums carry any int32 on the wire.
        return st.one_of(st.sampled_from(known), st.sampled_from([-1, max(known) + 1, 2**31 - 1, -(2**31)]),
                         st.integers(-(2**31), 2**31 - 1))
    raise TypeError(f"no strategy for field {f.full_name} of type {f.type}")


MAX_DEPTH = 6
_cache: dict[tuple[str, int], st.SearchStrategy[Any]] = {}


def messages(desc: gpd.Descriptor, depth: int = 0) -> st.SearchStrategy[Any]:
    """Messages of type `desc`, every field set or not, nested ones to `MAX_DEPTH`."""
    key = (desc.full_name, depth)
    if key not in _cache:
        _cache[key] = _message_strategy(desc, depth)
    return _cache[key]


def _value_strategy(f: gpd.FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if f.type in (FD.TYPE_MESSAGE, FD.TYPE_GROUP):
        return messages(f.message_type, depth + 1)
    return _scalar_strategy(f)


def _is_map(f: gpd.FieldDescriptor) -> bool:
    return f.type == FD.TYPE_MESSAGE and f.message_type.GetOptions().map_entry


def _message_strategy(desc: gpd.Descriptor, depth: int) -> st.SearchStrategy[Any]:
    cls = message_factory.GetMessageClass(desc)
    fields = [f for f in desc.fields if depth < MAX_DEPTH or f.type != FD.TYPE_MESSAGE]

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        # Sparse messages (which often get past validation) as well as dense ones; the chance of
        # each field being set falls with depth, so that messages stay finite and small.
        density = max(5, draw(st.sampled_from([10, 25, 50, 80])) - 10 * depth)
        msg = cls()
        for f in fields:
            if draw(st.integers(0, 99)) >= density:
                continue
            target = getattr(msg, f.name)
            if _is_map(f):
                key_f, value_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
                entries = draw(st.dictionaries(_value_strategy(key_f, depth), _value_strategy(value_f, depth),
                                               max_size=3))
                for k, v in entries.items():
                    if value_f.type == FD.TYPE_MESSAGE:
                        target[k].CopyFrom(v)
                    else:
                        target[k] = v
            elif f.is_repeated:
                values = draw(st.lists(_value_strategy(f, depth), max_size=4))
                if f.type == FD.TYPE_MESSAGE:
                    for v in values:
                        target.add().CopyFrom(v)
                else:
                    target.extend(values)
            elif f.type == FD.TYPE_MESSAGE:
                target.CopyFrom(draw(messages(f.message_type, depth + 1)))
                if not target.ListFields():
                    target.SetInParent()  # Present, though empty (as gogo's non-nullable fields are sent).
            else:
                setattr(msg, f.name, draw(_scalar_strategy(f)))
        return msg

    return build()


# Raw bytes.


def _mutate(data: bytes, rnd: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        op = rnd.randrange(5)
        at = rnd.randint(0, len(buf))
        if op == 0 and buf:
            buf[min(at, len(buf) - 1)] ^= 1 << rnd.randrange(8)
        elif op == 1:
            del buf[at:]
        elif op == 2:
            buf[at:at] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 6)))
        elif op == 3 and buf:
            buf[min(at, len(buf) - 1)] = rnd.choice([0x00, 0x7F, 0x80, 0xFF, 0x0F, 0x0B, 0x0C])
        else:
            buf += buf[at:]
    return bytes(buf)


HOSTILE_BYTES = [
    b"\x0f",  # Tag of field 1, wire type 7 (none).
    b"\x0a\xff\xff\xff\xff\x0f",  # A length past the message.
    b"\x08" + b"\xff" * 10 + b"\x01",  # A varint of 11 bytes.
    b"\x0b" * 200,  # Start-groups nested past the recursion limit.
    b"\x0b" * 90 + b"\x0c" * 90,  # Nested groups within it.
    b"\x12\x02\xc3\x28",  # Field 2 (a string) that is not UTF-8.
    b"\x12\x03\xed\xa0\x80",  # A UTF-8 encoded surrogate.
    b"\x00",  # Field number 0.
    b"\xf8\xff\xff\xff\x7f\x01",  # Field number 2**28 - 1 (the largest).
    b"\xf8\xff\xff\xff\xff\x01",  # Past the largest field number.
    b"\x0a\x00" * 5000,  # A message field repeated 5,000 times.
    b"\x1a\x80\x80\x80\x02" + b"z" * 64,  # A length of 4 MiB, with 64 bytes behind it.
    b"",
]


@st.composite
def raw_messages(draw: st.DrawFn, method: Method) -> bytes:
    """Bytes sent as one request message of `method`: any, or a valid message's, damaged."""
    kind = draw(st.sampled_from(["random", "mutated", "mutated", "hostile", "valid"]))
    if kind == "random":
        return draw(st.binary(max_size=256))
    if kind == "hostile":
        return draw(st.sampled_from(HOSTILE_BYTES))
    valid: bytes = draw(messages(method.descriptor.input_type)).SerializeToString()
    if kind == "valid":
        return valid
    return _mutate(valid, random.Random(draw(st.integers(0, 2**32))))


# Inputs.


@dataclass
class Input:
    """One call of `method` with request messages `requests` (serialized), and their decoded forms
    (None where one does not decode)."""

    method: Method
    requests: list[bytes]
    raw: bool

    @property
    def decoded(self) -> list[Message | None]:
        out: list[Message | None] = []
        for data in self.requests:
            try:
                out.append(self.method.request.FromString(data))
            except DecodeError:
                out.append(None)
        return out

    def show(self, limit: int = 700) -> str:
        if self.raw:
            text = repr(self.requests)
        else:
            text = " | ".join(str(m).replace("\n", " ") if m is not None else "?" for m in self.decoded)
        text = text if len(text) <= limit else text[:limit] + f"... ({sum(map(len, self.requests))} bytes)"
        return f"{self.method.name} {'raw ' if self.raw else ''}{text}"


@st.composite
def _append_sequence(draw: st.DrawFn, method: Method) -> list[bytes]:
    """An Append as clients send it: a header (journal, maybe registers or an offset), content, a commit."""
    head = draw(messages(method.descriptor.input_type))
    head.ClearField("content")
    if draw(st.booleans()):
        head.journal = draw(journal_names)
    chunks = draw(st.lists(_bytes, max_size=4))
    out = [head.SerializeToString()] + [pb.AppendRequest(content=c).SerializeToString() for c in chunks]
    if draw(st.booleans()):
        out.append(b"")  # The empty message: commit.
    return out


def _duration(seconds: int) -> Duration:
    return Duration(seconds=seconds)


def _bases() -> dict[str, st.SearchStrategy[list[Message]]]:
    """Valid requests of each method (a sequence for a client stream), that go past validation."""
    small = st.integers(-1, 300)
    shard_spec = st.builds(
        lambda sid, journal, disable, standbys, recorded: cpb.ShardSpec(
            id=sid, sources=[cpb.ShardSpec.Source(journal=journal)], max_txn_duration=_duration(1),
            disable=disable, hot_standbys=standbys, recovery_log_prefix="fuzz/recovery" if recorded else "",
            hint_prefix="/fuzz/hints" if recorded else "",
        ),
        st.sampled_from([SHARD, "fuzz-shard-2"]), st.sampled_from([TARGET, OTHER]), st.booleans(), st.integers(0, 2),
        st.booleans(),
    )
    journal_change = st.one_of(
        st.builds(lambda name, rev: pb.ApplyRequest.Change(upsert=journal_spec(name), expect_mod_revision=rev),
                  st.sampled_from([TARGET, OTHER, "fuzz/new/journal"]), st.sampled_from([-1, 0, 1])),
        st.builds(lambda name, rev: pb.ApplyRequest.Change(delete=name, expect_mod_revision=rev),
                  st.sampled_from([OTHER, "fuzz/new/journal", "fuzz/absent"]), st.sampled_from([-1, 1, 2**40])),
    )
    fuzz_prefix = pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="prefix", value="fuzz/")]))
    return {
        "protocol.Journal.List": st.builds(lambda sel: [pb.ListRequest(selector=sel)],
                                           st.sampled_from([pb.LabelSelector(), fuzz_prefix])),
        "protocol.Journal.Apply": st.lists(journal_change, min_size=1, max_size=3).map(
            lambda changes: [pb.ApplyRequest(changes=changes)]),
        "protocol.Journal.Read": st.builds(
            lambda j, off, end, meta: [pb.ReadRequest(journal=j, offset=off, end_offset=end, metadata_only=meta)],
            st.sampled_from([TARGET, OTHER, TARGET + ";meta"]), small, st.sampled_from([0, 0, 1, 100, 10**6]),
            st.booleans()),
        "protocol.Journal.Append": st.builds(
            lambda j, off, chunks, commit: [pb.AppendRequest(journal=j, offset=off)]
            + [pb.AppendRequest(content=c) for c in chunks] + ([pb.AppendRequest()] if commit else []),
            st.sampled_from([TARGET, OTHER, TARGET + ";meta"]), st.sampled_from([0, 0, 0, 1, 100]),
            st.lists(_bytes, max_size=3), st.booleans()),
        "protocol.Journal.Replicate": st.builds(
            lambda j, begin, chunks: [pb.ReplicateRequest(
                header=HEADERS.get(j), proposal=pb.Fragment(journal=j, begin=begin, end=begin,
                                                            compression_codec=pb.NONE),
                registers=pb.LabelSet(), acknowledge=True)]
            + [pb.ReplicateRequest(content=c, content_delta=0) for c in chunks],
            st.sampled_from([TARGET, OTHER]), st.sampled_from([0, 0, 10]), st.lists(_bytes, max_size=2)),
        "protocol.Journal.ListFragments": st.builds(
            lambda j, limit, ttl: [pb.FragmentsRequest(journal=j, page_limit=limit, signatureTTL=ttl)],
            st.sampled_from([TARGET, OTHER]), st.integers(0, 3), st.sampled_from([None, _duration(60)])),
        "protocol.Journal.FragmentStoreHealth": st.builds(
            lambda store, delete, prefix: [pb.FragmentStoreHealthRequest(
                fragment_store=store, check_delete=delete, check_delete_prefix=prefix if delete else "")],
            st.sampled_from(["file:///", "file:///fuzz/"]), st.booleans(), st.sampled_from(["", "probe/"])),
        "consumer.Shard.Stat": st.builds(
            lambda sid, through: [cpb.StatRequest(shard=sid, read_through=through)],
            st.sampled_from([SHARD, "fuzz-shard-2", "fuzz-absent"]),
            st.sampled_from([{}, {}, {TARGET: 0}, {TARGET: 10}, {OTHER: -1}])),
        "consumer.Shard.List": st.just([cpb.ListRequest()]),
        "consumer.Shard.Apply": st.one_of(
            st.builds(lambda spec, rev: [cpb.ApplyRequest(changes=[
                cpb.ApplyRequest.Change(upsert=spec, expect_mod_revision=rev)])], shard_spec, st.sampled_from([-1, 0])),
            st.builds(lambda sid: [cpb.ApplyRequest(changes=[
                cpb.ApplyRequest.Change(delete=sid, expect_mod_revision=-1)])],
                st.sampled_from([SHARD, "fuzz-absent"])),
        ),
        "consumer.Shard.GetHints": st.builds(lambda sid: [cpb.GetHintsRequest(shard=sid)],
                                             st.sampled_from([SHARD, "fuzz-shard-2"])),
        "consumer.Shard.Unassign": st.builds(
            lambda sid, failed, dry: [cpb.UnassignRequest(shards=[sid], only_failed=failed, dry_run=dry)],
            st.sampled_from([SHARD, "fuzz-shard-2"]), st.booleans(), st.booleans()),
    }


BASES = _bases()


@st.composite
def plausible(draw: st.DrawFn, method: Method) -> list[bytes]:
    """A valid request of `method`, with up to two of its first message's fields generated instead."""
    reqs = draw(BASES[method.descriptor.full_name])
    desc = method.descriptor.input_type
    for f in draw(st.lists(st.sampled_from(list(desc.fields)), max_size=2, unique=True)):
        other = draw(messages(desc))
        keep = type(reqs[0])()
        keep.MergeFrom(other)
        for g in desc.fields:
            if g is not f:
                keep.ClearField(g.name)
        reqs[0].ClearField(f.name)
        reqs[0].MergeFrom(keep)
    return [r.SerializeToString() for r in reqs]


def inputs(method: Method, raw: bool | None = None) -> st.SearchStrategy[Input]:
    """Calls of `method`: generated messages (a sequence of them for a client stream), or raw bytes."""
    typed_one = messages(method.descriptor.input_type).map(lambda m: m.SerializeToString())
    raw_one = raw_messages(method)
    count = (1, 4) if method.client_streaming else (1, 1)
    typed = st.one_of(st.lists(typed_one, min_size=count[0], max_size=count[1]), plausible(method))
    if method.descriptor.full_name == "protocol.Journal.Append":
        typed = st.one_of(typed, _append_sequence(method))
    raws = st.lists(raw_one, min_size=count[0], max_size=count[1])
    typed_inputs = typed.map(lambda reqs: Input(method, reqs, raw=False))
    raw_inputs = raws.map(lambda reqs: Input(method, reqs, raw=True))
    if raw is None:
        return st.one_of(typed_inputs, typed_inputs, raw_inputs)
    return raw_inputs if raw else typed_inputs


def all_inputs(methods: Sequence[Method]) -> st.SearchStrategy[Input]:
    return st.one_of(*[inputs(m) for m in methods])


# Calls and the oracle.


def may_block(method: Method, requests: Sequence[Message | None]) -> bool:
    """Whether a call may go on until its deadline by design: a blocking Read, a List watch, a Stat
    awaiting offsets, or any request waiting for an etcd revision (of its header, or asked for)."""
    name = method.descriptor.full_name
    for req in requests:
        if req is None:
            continue
        if name == "protocol.Journal.Read" and getattr(req, "block", False):
            return True
        if name == "protocol.Journal.List" and getattr(req, "watch", False):
            return True
        if name == "consumer.Shard.Stat" and len(getattr(req, "read_through", {})):
            return True
        if _waits_for_revision(req):
            return True
    return False


def _waits_for_revision(msg: Message) -> bool:
    for f, value in msg.ListFields():
        if f.name == "min_etcd_revision" and value > 0:
            return True
        if f.message_type is not None and f.message_type.full_name == "protocol.Header.Etcd" and value.revision > 0:
            return True
        if f.type == FD.TYPE_MESSAGE and not _is_map(f):
            values = value if f.is_repeated else [value]
            if any(_waits_for_revision(v) for v in values):
                return True
    return False


@dataclass
class Outcome:
    code: grpc.StatusCode
    details: str
    responses: list[bytes]
    seconds: float
    deadline: float


def call(channel: grpc.Channel, inp: Input, timeout: float, block_deadline: float = BLOCK_DEADLINE,
         known: str | None = None) -> Outcome:
    """Make the call of `inp` (bytes as they are, no serialization) and collect its answer; a call
    that may block, or meets a `known` issue, gets `block_deadline`."""
    m = inp.method
    deadline = block_deadline if known or may_block(m, inp.decoded) else timeout
    responses: list[bytes] = []
    started = time.monotonic()
    code, details = grpc.StatusCode.OK, ""
    try:
        if not m.client_streaming and not m.server_streaming:
            responses.append(channel.unary_unary(m.path, None, None)(inp.requests[0], timeout=deadline))
        elif m.client_streaming and not m.server_streaming:
            responses.append(channel.stream_unary(m.path, None, None)(iter(inp.requests), timeout=deadline))
        else:
            if m.client_streaming:
                stream = channel.stream_stream(m.path, None, None)(iter(inp.requests), timeout=deadline)
            else:
                stream = channel.unary_stream(m.path, None, None)(inp.requests[0], timeout=deadline)
            for response in stream:
                responses.append(response)
                if len(responses) >= MAX_RESPONSES:
                    stream.cancel()
                    break
    except grpc.RpcError as err:
        e: Any = err
        code, details = e.code(), e.details() or ""
    return Outcome(code, details, responses, time.monotonic() - started, deadline)


def problems(inp: Input, out: Outcome, known: str | None = None) -> list[str]:
    """What is wrong with `out`, the answer to `inp`: "kind: detail" lines (a DEADLINE_EXCEEDED
    of an input that meets a `known` issue is "known")."""
    found: list[str] = []
    decoded = inp.decoded
    if out.code == grpc.StatusCode.DEADLINE_EXCEEDED and known:
        found.append(f"known: {known}")
    elif out.code == grpc.StatusCode.UNKNOWN:
        found.append(f"unknown: {out.details[:500]}")
    elif out.code == grpc.StatusCode.INTERNAL:
        if not (None in decoded and out.details.startswith(UNMARSHAL)):
            found.append(f"internal: {out.details[:500]}")
    elif out.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        if out.deadline >= BLOCK_DEADLINE * 2 or not may_block(inp.method, decoded):
            found.append(f"hang: no answer within {out.deadline:g}s")
    elif out.code == grpc.StatusCode.CANCELLED and len(out.responses) < MAX_RESPONSES:
        found.append(f"cancelled: {out.details[:500]}")
    elif out.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "metadata size exceeds" in out.details:
        found.append(f"oversized: the answer's metadata is past what a client takes: {out.details[:300]}")
    if "Traceback" in out.details or "Exception" in out.details:
        found.append(f"traceback: {out.details[:500]}")
    for data in out.responses:
        try:
            inp.method.response.FromString(data)
        except DecodeError as exc:
            found.append(f"bad response: {exc}: {data[:100]!r}")
            break
    return found


def http_ready(url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/debug/ready", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


# The processes under test.


@dataclass
class Target:
    """A process serving fuzzed gRPC: its URL, whether it runs, and the watch of its log."""

    name: str
    url: str
    alive: Callable[[], bool]
    logs: LogWatch
    known: Callable[[grpc.Channel, Input], str | None] = lambda channel, inp: None
    """A bug the input meets, found by this fuzzing and not yet fixed (in a module whose owner has
    it in hand), or None. (A Stat of a shard whose primary is FAILED was one, until consumer/api.py
    answered it SHARD_STOPPED at once.)"""

    @property
    def address(self) -> str:
        return self.url.removeprefix("http://")


class ConsumerProcess:
    """A `gazette consume` child (running tests.support.cli_apps:app) serving the Shard service."""

    def __init__(self, tmp: Path, broker_url: str, etcd: str, prefix: str) -> None:
        self.port = free_port()
        self.log_path = tmp / f"consumer-{self.port}.log"
        args = [
            sys.executable, "-m", "consumer", "consume", "tests.support.cli_apps:app",
            "--consumer.id", f"fuzz-{self.port}", "--consumer.port", str(self.port), "--consumer.host", "127.0.0.1",
            "--consumer.bind", "127.0.0.1", "--broker.address", broker_url, "--etcd.address", etcd,
            "--etcd.prefix", prefix, "--etcd.lease", "10", "--log.level", "debug",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CONSUMER_", "ETCD_", "BROKER_", "LOG_"))}
        env["PYTHONPATH"] = str(ROOT)
        env["GAZETTE_TEST_COUNTS_DB"] = str(tmp / f"counts-{self.port}.db")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> ConsumerProcess:
        wait_http_ready("consumer", self.url, self.proc, self.logs, timeout)
        return self

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self._log.close()


@contextmanager
def consuming(tmp: Path, broker: BrokerProcess, etcd: str) -> Iterator[ConsumerProcess]:
    """A ready consumer of `broker` under a keyspace root of its own; stopped on exit."""
    consumer = ConsumerProcess(tmp, broker.url, etcd, f"/fuzz-consumer/{uuid.uuid4().hex}")
    try:
        yield consumer.wait_ready()
    finally:
        consumer.stop()


def broker_target(broker: BrokerProcess) -> Target:
    return Target("broker", broker.url, lambda: broker.proc.poll() is None, LogWatch(broker.log_path))


def consumer_target(consumer: ConsumerProcess) -> Target:
    return Target("consumer", consumer.url, lambda: consumer.proc.poll() is None, LogWatch(consumer.log_path))


# Journals and shards the fuzzing needs, and the canary.


HEADERS: dict[str, pb.Header] = {}
"""The broker's header of each fuzzed journal (its route), which plausible Replicate proposals carry."""


def prepare_journals(stub: pb_grpc.JournalStub) -> None:
    """(Re)create the journals fuzzed requests name, with their first spec; note their headers."""
    specs = [journal_spec(TARGET), journal_spec(OTHER)]
    req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=s, expect_mod_revision=-1) for s in specs])
    resp = stub.Apply(req, timeout=30)
    assert resp.status == pb.OK, resp
    for name in (TARGET, OTHER):
        wait_for_primary(stub, name)
        for read in stub.Read(pb.ReadRequest(journal=name, metadata_only=True), timeout=30):
            if read.HasField("header"):
                HEADERS[name] = read.header
                break


def reset_journals(stub: pb_grpc.JournalStub, keep: Sequence[str]) -> None:
    """Delete every journal but `keep` and the fuzzed ones, then restore those to their first spec."""
    names = [j.spec.name for r in stub.List(pb.ListRequest(), timeout=30) for j in r.journals]
    doomed = [n for n in names if n not in keep and n not in (TARGET, OTHER)]
    for i in range(0, len(doomed), 100):
        changes = [pb.ApplyRequest.Change(delete=n, expect_mod_revision=-1) for n in doomed[i:i + 100]]
        stub.Apply(pb.ApplyRequest(changes=changes), timeout=30)
    prepare_journals(stub)


def reset_shards(channel: grpc.Channel) -> None:
    """Delete every shard the fuzzing created."""
    shard_stub = cpb_grpc.ShardStub(channel)
    ids = [s.spec.id for s in shard_stub.List(cpb.ListRequest(), timeout=30).shards]
    if ids:
        changes = [cpb.ApplyRequest.Change(delete=i, expect_mod_revision=-1) for i in ids]
        shard_stub.Apply(cpb.ApplyRequest(changes=changes), timeout=30)


class Canary:
    """A journal no fuzzed input names: known records appended between inputs, read back in full."""

    def __init__(self, stub: pb_grpc.JournalStub) -> None:
        self.stub = stub
        self.name = f"canary/{uuid.uuid4().hex}"
        self.acknowledged: list[tuple[int, bytes]] = []
        self.failures: list[str] = []
        assert apply_specs(stub, journal_spec(self.name)).status == pb.OK
        wait_for_primary(stub, self.name)

    def append(self) -> None:
        n = len(self.acknowledged)
        record = f"canary record {n} ".encode() + os.urandom(8).hex().encode() + b"\n" * (1 + n % 3)
        try:
            resp = append(self.stub, self.name, record)
        except grpc.RpcError as err:
            self.failures.append(f"append {n} failed: {err}")
            return
        if resp.status != pb.OK or resp.commit.end - resp.commit.begin != len(record):
            self.failures.append(f"append {n} answered {resp}")
            return
        self.acknowledged.append((resp.commit.begin, record))

    def verify(self) -> list[str]:
        """The corruptions found: acknowledged records that do not read back where they were committed."""
        found = list(self.failures)
        content = bytearray()
        try:
            for r in self.stub.Read(pb.ReadRequest(journal=self.name, offset=0), timeout=60):
                if r.content:
                    if r.offset != len(content):
                        found.append(f"read content at {r.offset}, expected {len(content)}")
                    content += r.content
        except grpc.RpcError as err:
            found.append(f"reading back the canary: {err}")
        expected = b"".join(record for _, record in self.acknowledged)
        at = 0
        for begin, record in self.acknowledged:
            if begin != at:
                found.append(f"record committed at {begin}, expected {at}")
            at = begin + len(record)
        if bytes(content) != expected:
            found.append(f"canary content differs: {len(content)} bytes read, {len(expected)} acknowledged")
        return found


# Running inputs.


@dataclass
class Tally:
    inputs: int = 0
    raw: int = 0
    crashes: int = 0
    hangs: int = 0
    unknown: int = 0
    internal: int = 0
    tracebacks: int = 0
    other: int = 0
    corruptions: int = 0
    known: int = 0
    by_method: Counter[str] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)
    details: dict[str, str] = field(default_factory=dict)
    """The details of the first answer of each method and code."""
    samples: dict[str, list[str]] = field(default_factory=dict)

    def sample(self, kind: str, text: str) -> None:
        kept = self.samples.setdefault(kind, [])
        if len(kept) < 3:
            kept.append(text)

    @property
    def failed(self) -> int:
        return self.crashes + self.hangs + self.unknown + self.internal + self.tracebacks + self.other + \
            self.corruptions


def check(target: Target, channel: grpc.Channel, inp: Input, timeout: float,
          block_deadline: float = BLOCK_DEADLINE) -> tuple[Outcome, list[str]]:
    """Call `inp` on `target`; the outcome and every problem found, of the answer and of the process."""
    known = target.known(channel, inp)
    out = call(channel, inp, timeout, block_deadline, known)
    if known is None and out.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        known = target.known(channel, inp)  # Met during the call (a shard that failed meanwhile).
    found = problems(inp, out, known)
    if not target.alive():
        found.append(f"crash: the {target.name} exited")
    elif not http_ready(target.url):
        found.append(f"crash: the {target.name} does not answer /debug/ready")
    found += [f"traceback: logged by the {target.name}:\n{tb}" for tb in target.logs.new_tracebacks()]
    return out, found


def fuzz_once(target: Target, channel: grpc.Channel, inp: Input, tally: Tally, timeout: float) -> None:
    tally.inputs += 1
    tally.raw += inp.raw
    tally.by_method[inp.method.name] += 1
    out, found = check(target, channel, inp, timeout)
    key = f"{inp.method.name} {out.code.name}"
    tally.codes[key] += 1
    if out.details and key not in tally.details:
        tally.details[key] = out.details[:160]
    for problem in found:
        kind = problem.split(":", 1)[0]
        if kind == "crash":
            tally.crashes += 1
        elif kind == "hang":
            tally.hangs += 1
        elif kind == "unknown":
            tally.unknown += 1
        elif kind == "internal":
            tally.internal += 1
        elif kind == "traceback":
            tally.tracebacks += 1
        elif kind == "known":
            tally.known += 1
        else:
            tally.other += 1
        tally.sample(f"{kind} ({inp.method.name})", f"{problem}\n    input: {inp.show()}")


def run(minutes: float, timeout: float, base_seed: int | None) -> Tally:
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="fuzz-grpc-") as tmpdir:
        tmp = Path(tmpdir)
        etcd = EtcdProcess(tmp / "etcd", client_port=free_port(), peer_port=free_port(), log_path=tmp / "etcd.log",
                           extra_args=["--unsafe-no-fsync"])
        etcd.start()
        try:
            etcd.wait_ready(30.0)
            (tmp / "fragments").mkdir()
            broker = BrokerProcess(tmp, etcd.endpoint, "/fuzz", "--broker.file-root", str(tmp / "fragments"))
            try:
                broker.wait_ready()
                with consuming(tmp, broker, etcd.endpoint) as consumer:
                    _run(broker, consumer, minutes, timeout, base_seed, tally)
            finally:
                rc = broker.stop()
                if rc != 0:
                    log(f"the broker exited with {rc}:\n{broker.logs()[-4000:]}")
        finally:
            etcd.stop()
    return tally


def _run(broker: BrokerProcess, consumer: ConsumerProcess, minutes: float, timeout: float,
         base_seed: int | None, tally: Tally) -> None:
    channel, stub = broker.stub()
    shard_channel = grpc.insecure_channel(consumer.url.removeprefix("http://"))
    with channel, shard_channel:
        prepare_journals(stub)
        canary = Canary(stub)
        targets = {"protocol": broker_target(broker), "consumer": consumer_target(consumer)}
        channels = {"protocol": channel, "consumer": shard_channel}
        end = time.monotonic() + minutes * 60
        rng = random.Random(base_seed)
        log(f"fuzzing gRPC at {broker.url} (Journal) and {consumer.url} (Shard) for {minutes} minutes")

        def alive() -> bool:
            return all(t.alive() for t in targets.values())

        def fuzz(inp: Input) -> None:
            if time.monotonic() >= end or not alive():
                return
            service = inp.method.descriptor.containing_service.full_name.split(".")[0]
            fuzz_once(targets[service], channels[service], inp, tally, timeout)
            if tally.inputs % 20 == 0:
                canary.append()
            if tally.inputs % 500 == 0:
                reset_journals(stub, [canary.name])
                reset_shards(shard_channel)

        while time.monotonic() < end and alive():
            batch = settings(max_examples=500, deadline=None, database=None, phases=[Phase.generate],
                             suppress_health_check=list(HealthCheck))(
                given(inp=all_inputs(JOURNAL_METHODS + SHARD_METHODS))(fuzz))
            if base_seed is not None:
                batch = seed(rng.getrandbits(64))(batch)
            batch()
            log(f"{tally.inputs} inputs, {tally.hangs} hangs, {tally.unknown} UNKNOWN, {tally.internal} INTERNAL, "
                f"{tally.tracebacks} tracebacks")
        if not alive():
            tally.crashes += 1 if not tally.crashes else 0
        else:
            canary.append()
        corruptions = canary.verify()
        tally.corruptions = len(corruptions)
        for c in corruptions:
            tally.sample("corruption", c)
        log(f"canary: {len(canary.acknowledged)} records acknowledged, {len(corruptions)} corruptions")


def report(tally: Tally, minutes: float) -> str:
    lines = [
        f"gRPC fuzzing (protocol.Journal and consumer.Shard), {minutes:g} minutes",
        f"inputs tried:        {tally.inputs} ({tally.raw} of them raw bytes)",
        f"crashes:             {tally.crashes}",
        f"hangs:               {tally.hangs}",
        f"UNKNOWN answers:     {tally.unknown}",
        f"INTERNAL answers:    {tally.internal} (besides undecodable requests)",
        f"tracebacks:          {tally.tracebacks} (logged, or in an answer)",
        f"other problems:      {tally.other} (oversized answers, bad responses, cancelled calls)",
        f"corruptions:         {tally.corruptions}",
        f"known, not fixed:    {tally.known} (see `Target.known`)",
        "inputs by method:    " + ", ".join(f"{m}: {n}" for m, n in sorted(tally.by_method.items())),
        "codes:",
        *[f"  {k}: {n}" + (f" (e.g. {tally.details[k]!r})" if k in tally.details else "")
          for k, n in sorted(tally.codes.items())],
    ]
    for kind, samples in tally.samples.items():
        lines.append(f"\n{kind} (first {len(samples)}):")
        lines += [f"  {s}" for s in samples]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds a call may take (else a hang)")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    tally = run(args.minutes, args.timeout, args.seed)
    print(report(tally, args.minutes))
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
