"""Validation rules and exact error texts, following Gazette's Go test tables."""

from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.protocol import labels as lbl
from broker.protocol import pb
from broker.protocol import validation as v
from broker.protocol.validation import ValidationError


def expect_error(fn: Callable[[Any], None], arg: Any, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        fn(arg)
    assert str(info.value) == message


def ls(*nv: str) -> pb.LabelSet:
    """A LabelSet from alternating names and values, as Go's MustLabelSet."""
    return lbl.label_set(*zip(nv[::2], nv[1::2], strict=True))


def dur(seconds: float) -> Duration:
    out = Duration()
    out.FromNanoseconds(round(seconds * 1e9))
    return out


def bad_header() -> pb.Header:
    """Go's badHeaderFixture: only ClusterId is invalid."""
    return pb.Header(
        process_id=pb.ProcessSpec.ID(zone="zone", suffix="name"),
        route=pb.Route(primary=0, members=[pb.ProcessSpec.ID(zone="zone", suffix="name")]),
        etcd=pb.Header.Etcd(cluster_id=0, member_id=34, revision=56, raft_term=78),
    )


def minimal_spec(name: str = "a/journal") -> pb.JournalSpec:
    return pb.JournalSpec(
        name=name,
        replication=1,
        fragment=pb.JournalSpec.Fragment(
            length=1024,
            compression_codec=pb.NONE,
            refresh_interval=dur(60),
            retention=dur(3600),
        ),
    )


# ValidationError.


def test_error_str_joins_context_then_message() -> None:
    err = ValidationError("not absolute (invalid)", ["Fragment", "Stores[2]"])
    assert str(err) == "Fragment.Stores[2]: not absolute (invalid)"
    assert str(ValidationError("bare")) == "bare"
    assert isinstance(err, ValueError)


def test_with_context_prepends_without_mutating() -> None:
    err = ValidationError("invalid length (1; expected 2 <= length <= 64)", ["Name"])
    outer = err.with_context("Labels[0]").with_context("Labels")
    assert str(outer) == "Labels.Labels[0].Name: invalid length (1; expected 2 <= length <= 64)"
    assert str(err) == "Name: invalid length (1; expected 2 <= length <= 64)"
    assert outer.message == err.message
    assert outer.context == ("Labels", "Labels[0]", "Name")


def test_in_context_extends_raised_errors() -> None:
    with pytest.raises(ValidationError) as info, v.in_context("Upsert"), v.in_context("Fragment"):
        raise ValidationError("invalid Length (0; expected 1024 <= length <= 17179869184)")
    assert str(info.value) == "Upsert.Fragment: invalid Length (0; expected 1024 <= length <= 17179869184)"


def test_in_context_leaves_other_errors_alone() -> None:
    with pytest.raises(KeyError), v.in_context("Ignored"):
        raise KeyError("k")


# Tokens and path components.


@pytest.mark.parametrize(
    ("s", "symbols", "lo", "hi", "message"),
    [
        ("a-token", v.TOKEN_SYMBOLS, 2, 64, None),
        ("日本語-トークン", v.TOKEN_SYMBOLS, 2, 64, None),
        ("٣٤Ⅻ½", v.TOKEN_SYMBOLS, 2, 64, None),  # Nd, Nl and No are all numbers.
        ("a b", v.TOKEN_SYMBOLS, 2, 64, "not a valid token (a b)"),
        ("a=b", v.TOKEN_SYMBOLS, 2, 64, "not a valid token (a=b)"),
        ("a=b%20", v.PATH_SYMBOLS, 2, 64, None),
        ("a:b", v.PATH_SYMBOLS, 2, 64, "not a valid token (a:b)"),
        ("a#b", v.PATH_SYMBOLS, 2, 64, "not a valid token (a#b)"),
        ("a;b", v.PATH_SYMBOLS, 2, 64, "not a valid token (a;b)"),
        ("a\u0301", v.PATH_SYMBOLS, 2, 64, "not a valid token (a\u0301)"),  # A mark is not a letter.
        ("a", v.TOKEN_SYMBOLS, 2, 64, "invalid length (1; expected 2 <= length <= 64)"),
        ("é", v.TOKEN_SYMBOLS, 2, 64, None),  # Two UTF-8 bytes.
        ("éé", v.TOKEN_SYMBOLS, 1, 3, "invalid length (4; expected 1 <= length <= 3)"),
        ("a b", v.TOKEN_SYMBOLS, 5, 9, "invalid length (3; expected 5 <= length <= 9)"),  # Length first.
        ("", v.TOKEN_SYMBOLS, 0, 9, None),
    ],
)
def test_validate_token(s: str, symbols: str, lo: int, hi: int, message: str | None) -> None:
    if message is None:
        v.validate_token(s, symbols, lo, hi)
    else:
        with pytest.raises(ValidationError) as info:
            v.validate_token(s, symbols, lo, hi)
        assert str(info.value) == message


@pytest.mark.parametrize(
    ("s", "message"),
    [
        ("a/clean/path", None),
        ("a=1/b%202", None),
        ("../x", None),  # Go's Clean keeps a leading `..`.
        ("", None),
        ("a//b", "must be a clean path (a//b)"),
        ("a/", "must be a clean path (a/)"),
        ("./a", "must be a clean path (./a)"),
        ("a/../b", "must be a clean path (a/../b)"),
        ("/a", "cannot begin with '/' (/a)"),
        ("a b", "not a valid token (a b)"),
    ],
)
def test_validate_path_component(s: str, message: str | None) -> None:
    if message is None:
        v.validate_path_component(s, 0, 512)
    else:
        with pytest.raises(ValidationError) as info:
            v.validate_path_component(s, 0, 512)
        assert str(info.value) == message


# Journals (Go TestJournalValidationCases).


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("a/valid/path/to/a/journal", None),
        ("/leading/slash", "cannot begin with '/' (/leading/slash)"),
        ("trailing/slash/", "must be a clean path (trailing/slash/)"),
        ("extra-middle//slash", "must be a clean path (extra-middle//slash)"),
        ("not-$%|-a valid token", "not a valid token (not-$%|-a valid token)"),
        ("", "invalid length (0; expected 4 <= length <= 512)"),
        ("zz", "invalid length (2; expected 4 <= length <= 512)"),
        ("a" * 513, "invalid length (513; expected 4 <= length <= 512)"),
        ("foo/bar;baz/bing", None),
        ("foo/bar;disallowed#rune", "metadata path segment: not a valid token (disallowed#rune)"),
        ("foo/bar;", "metadata path segment: invalid length (0; expected 1 <= length <= 512)"),
        ("foo/bar;a;b", "metadata path segment: not a valid token (a;b)"),
        ("part=1/x%2Fy", None),
    ],
)
def test_validate_journal(name: str, message: str | None) -> None:
    if message is None:
        v.validate_journal(name)
    else:
        expect_error(v.validate_journal, name, message)


def test_split_meta() -> None:
    assert v.split_meta("foo/bar;meta-part") == ("foo/bar", ";meta-part")
    assert v.split_meta("foo/bar") == ("foo/bar", "")


# Labels (Go TestLabelValidationCases, TestSetValidationCases).


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("a-label", "a-value", None),
        ("a/label", "a%20value", None),
        ("a|label", "a-value", "Name: not a valid token (a|label)"),
        ("a-label", "a|value", "Value: not a valid token (a|value)"),
        ("a", "a-value", "Name: invalid length (1; expected 2 <= length <= 64)"),
        ("a" * 65, "a-value", "Name: invalid length (65; expected 2 <= length <= 64)"),
        ("a-label", "", None),
        ("a-label", "a" * 1025, "Value: invalid length (1025; expected 0 <= length <= 1024)"),
        ("a-label:prefix", "v", "Name: not a valid token (a-label:prefix)"),
        ("a=label", "v", "Name: not a valid token (a=label)"),
        ("a-label", "a=b//c", None),  # Values need not be clean paths.
    ],
)
def test_validate_label(name: str, value: str, message: str | None) -> None:
    label = pb.Label(name=name, value=value)
    if message is None:
        v.validate_label(label)
    else:
        expect_error(v.validate_label, label, message)


def test_validate_label_set_progression() -> None:
    labels = [
        ("bad label", "111"),
        ("aaa", "444"),
        ("aaa", "333"),
        ("aaa", "222"),
        ("ccc", ""),
        ("ccc", ""),
        ("ccc", "555"),
    ]

    def check(message: str | None) -> None:
        set_ = pb.LabelSet(labels=[pb.Label(name=n, value=val) for n, val in labels])
        if message is None:
            v.validate_label_set(set_)
        else:
            expect_error(v.validate_label_set, set_, message)

    check("Labels[0].Name: not a valid token (bad label)")
    labels[0] = ("bbb", "111")
    check("Labels not in unique, sorted order (index 1; label name aaa <= bbb)")
    labels[0], labels[3] = labels[3], labels[0]
    check("Labels not in unique, sorted order (index 2; label aaa value 333 <= 444)")
    labels[1], labels[2] = labels[2], labels[1]
    check("Labels not in unique, sorted order (index 5; label ccc value  <= )")
    labels[5] = ("ccc", "444")
    check("Label has empty & non-empty values (index 5; label ccc value 444)")
    labels[4] = ("ccc", "44")
    check(None)


def test_label_set_rejects_prefix_outside_selector() -> None:
    set_ = pb.LabelSet(
        labels=[pb.Label(name="aa", value="x"), pb.Label(name="name", value="a/", prefix=True)]
    )
    expect_error(v.validate_label_set, set_, "Labels[1]: Prefix may not be set outside of a LabelSelector")
    v.validate_label_set(set_, allow_prefix=True)


def test_single_value_labels() -> None:
    v.validate_single_value_labels(ls("aaa", "bar", "aaa", "baz", lbl.CONTENT_TYPE, "a/type"))
    expect_error(
        v.validate_single_value_labels,
        ls("aaa", "bar", lbl.CONTENT_TYPE, "a/type", lbl.CONTENT_TYPE, "other/type"),
        "expected single-value Label has multiple values (index 2; label content-type value other/type)",
    )
    expect_error(
        v.validate_single_value_labels,
        ls(lbl.INSTANCE, "a", lbl.INSTANCE, "b", "other", "c"),
        "expected single-value Label has multiple values (index 1; label app.gazette.dev/instance value b)",
    )
    for name in (lbl.MANAGED_BY, lbl.MESSAGE_SUB_TYPE, lbl.MESSAGE_TYPE, lbl.REGION):
        with pytest.raises(ValidationError):
            v.validate_single_value_labels(ls(name, "a", name, "b"))
    v.validate_single_value_labels(ls(lbl.TAG, "a", lbl.TAG, "b"))


def test_validate_label_selector() -> None:
    sel = pb.LabelSelector(
        include=pb.LabelSet(labels=[pb.Label(name="include", value="a-value")]),
        exclude=pb.LabelSet(labels=[pb.Label(name="exclude", value="other-value")]),
    )
    v.validate_label_selector(sel)
    sel.include.labels[0].name = "bad label"
    expect_error(v.validate_label_selector, sel, "Include.Labels[0].Name: not a valid token (bad label)")
    sel.include.labels[0].name = "include"
    sel.exclude.labels[0].name = "bad label"
    expect_error(v.validate_label_selector, sel, "Exclude.Labels[0].Name: not a valid token (bad label)")
    sel.exclude.labels[0].name = "name"
    sel.exclude.labels[0].prefix = True
    v.validate_label_selector(sel)


# Journal specs (Go TestSpecValidationCases).


def model_spec() -> pb.JournalSpec:
    return pb.JournalSpec(
        name="a/journal",
        replication=3,
        labels=ls("aaa", "bbb"),
        fragment=pb.JournalSpec.Fragment(
            length=1 << 18,
            compression_codec=pb.GZIP,
            stores=["s3://bucket/path/", "gs://other-bucket/path/"],
            refresh_interval=dur(300),
            retention=dur(365 * 24 * 3600),
            path_postfix_template=(
                'date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}'
                '/hour={{ .Spool.FirstAppendTime.Format "15" }}'
            ),
        ),
        flags=pb.JournalSpec.O_RDWR,
        max_append_rate=12345,
    )


def test_journal_spec_progression() -> None:
    spec = model_spec()
    v.validate_journal_spec(spec)

    def check(message: str) -> None:
        expect_error(v.validate_journal_spec, spec, message)

    spec.name = "/bad/name"
    check("Name: cannot begin with '/' (/bad/name)")
    spec.name = "a/journal;disallowed/meta"
    check("Name cannot have a metadata path segment (;disallowed/meta; expected no segment)")
    spec.name = "a/journal"

    spec.replication = 0
    check("invalid Replication (0; expected 1 <= Replication <= 5)")
    spec.replication = 1024
    check("invalid Replication (1024; expected 1 <= Replication <= 5)")
    spec.replication = 5
    v.validate_journal_spec(spec)

    spec.labels.labels[0].name = "xxx xxx"
    check("Labels.Labels[0].Name: not a valid token (xxx xxx)")
    spec.labels.labels[0].name = "name"
    check('Labels cannot include label "name"')
    spec.labels.labels[0].value = ""  # Rejected even when the value is empty.
    check('Labels cannot include label "name"')
    spec.labels.labels[0].name = "prefix"
    check('Labels cannot include label "prefix"')

    spec.labels.CopyFrom(ls(lbl.MESSAGE_TYPE, "a", lbl.MESSAGE_TYPE, "b"))
    check(
        "Labels: expected single-value Label has multiple values "
        "(index 1; label app.gazette.dev/message-type value b)"
    )
    spec.labels.CopyFrom(ls(lbl.CONTENT_TYPE, "invalid/content/type"))
    check("Labels: parsing content-type: mime: unexpected content after media subtype")
    spec.labels.CopyFrom(ls(lbl.CONTENT_TYPE, ""))
    check("Labels: parsing content-type: mime: no media type")
    spec.labels.CopyFrom(ls(lbl.CONTENT_TYPE, "text=x"))
    check("Labels: parsing content-type: mime: expected slash after first token")
    spec.labels.CopyFrom(ls(lbl.CONTENT_TYPE, "text/"))
    check("Labels: parsing content-type: mime: expected token after slash")
    spec.labels.CopyFrom(ls(lbl.MESSAGE_SUB_TYPE, "subtype"))
    check("Labels: expected app.gazette.dev/message-type label alongside app.gazette.dev/message-subtype")
    spec.labels.CopyFrom(ls(lbl.MESSAGE_SUB_TYPE, "subtype", lbl.MESSAGE_TYPE, "type"))
    check("Labels: expected content-type label alongside app.gazette.dev/message-type")
    spec.labels.CopyFrom(ls(lbl.MESSAGE_TYPE, "type", lbl.CONTENT_TYPE, lbl.CONTENT_TYPE_JSON_LINES))
    v.validate_journal_spec(spec)
    spec.labels.CopyFrom(
        ls(
            lbl.MESSAGE_SUB_TYPE,
            "subtype",
            lbl.MESSAGE_TYPE,
            "type",
            lbl.CONTENT_TYPE,
            lbl.CONTENT_TYPE_JSON_LINES,
        )
    )
    v.validate_journal_spec(spec)
    spec.labels.CopyFrom(ls(lbl.CONTENT_TYPE, "text"))  # A bare type parses.
    v.validate_journal_spec(spec)

    spec.fragment.length = 0
    check("Fragment: invalid Length (0; expected 1024 <= length <= 17179869184)")
    spec.fragment.length = 4096

    for flags in (4 | 1, 4 | 2, 1 | 2):
        spec.flags = flags
        check(f"Flags: invalid combination ({flags})")
    for flags in (0, 1, 2, 4):
        spec.flags = flags
        v.validate_journal_spec(spec)

    spec.max_append_rate = -1
    check("invalid MaxAppendRate (-1; expected >= 0)")
    spec.max_append_rate = 0
    v.validate_journal_spec(spec)


def test_journal_spec_suspend() -> None:
    spec = model_spec()
    spec.suspend.level = pb.JournalSpec.Suspend.FULL
    spec.suspend.offset = 1234
    v.validate_journal_spec(spec)
    spec.suspend.offset = -1
    expect_error(v.validate_journal_spec, spec, "Suspend: invalid Offset (-1; expected >= 0)")
    spec.suspend.offset = 0
    spec.suspend.level = 7  # type: ignore[assignment]
    expect_error(v.validate_journal_spec, spec, "Suspend: invalid Level (7)")


def test_journal_spec_fragment_cases() -> None:
    frag = model_spec().fragment

    def check(message: str) -> None:
        expect_error(v.validate_journal_spec_fragment, frag, message)

    frag.length = (1 << 34) + 1
    check("invalid Length (17179869185; expected 1024 <= length <= 17179869184)")
    frag.length = 1024

    frag.compression_codec = 9999  # type: ignore[assignment]
    check("CompressionCodec: invalid value (9999)")
    frag.compression_codec = pb.INVALID
    check("CompressionCodec: invalid value (INVALID)")
    frag.compression_codec = pb.GZIP_OFFLOAD_DECOMPRESSION

    frag.stores[0] = "file:///a/root/"
    check("GZIP_OFFLOAD_DECOMPRESSION is incompatible with file:// stores (file:///a/root/)")
    frag.stores[0], frag.stores[1] = frag.stores[1], frag.stores[0]
    v.validate_journal_spec_fragment(frag)  # Only the first store matters.
    frag.compression_codec = pb.SNAPPY

    frag.refresh_interval.CopyFrom(dur(0.001))
    check("invalid RefreshInterval (1ms; expected 1s <= interval <= 24h0m0s)")
    frag.refresh_interval.CopyFrom(dur(25 * 3600))
    check("invalid RefreshInterval (25h0m0s; expected 1s <= interval <= 24h0m0s)")
    frag.refresh_interval.CopyFrom(dur(0))
    check("invalid RefreshInterval (0s; expected 1s <= interval <= 24h0m0s)")
    frag.refresh_interval.CopyFrom(dur(24 * 3600))
    v.validate_journal_spec_fragment(frag)
    frag.refresh_interval.CopyFrom(dur(1))
    v.validate_journal_spec_fragment(frag)
    frag.refresh_interval.CopyFrom(dur(3600))

    frag.flush_interval.CopyFrom(dur(1))
    check("invalid FlushInterval (1s; expected >= 1m0s)")
    frag.flush_interval.CopyFrom(dur(60))
    v.validate_journal_spec_fragment(frag)
    frag.flush_interval.CopyFrom(dur(7200))

    frag.path_postfix_template = "{{ bad template"
    check("PathPostfixTemplate: template: postfix:1: unclosed action")
    frag.path_postfix_template = "a={{ .X }}\nb={{ .Y"
    check("PathPostfixTemplate: template: postfix:2: unclosed action")
    frag.path_postfix_template = 'x={{ "}}" }}'
    v.validate_journal_spec_fragment(frag)
    frag.path_postfix_template = "literal }} text"
    v.validate_journal_spec_fragment(frag)
    frag.path_postfix_template = ""
    v.validate_journal_spec_fragment(frag)

    frag.stores.append("invalid")
    check("Stores[2]: not absolute (invalid)")


def test_journal_spec_retention_is_unconstrained() -> None:
    spec = minimal_spec()
    spec.fragment.retention.CopyFrom(dur(-5))
    v.validate_journal_spec(spec)


# Fragment stores (Go FragmentStoreSuite).


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ("s3://my-bucket/?query", None),
        ("s3://my-bucket/subpath/?query", None),
        ("file:///mnt/path/", None),
        ("file:///mnt/path/?query", None),
        ("azure://container/path/", None),
        ("azure-ad://tenant/account/container/", None),
        ("s3://my-bucket", "path component doesn't end in '/' ()"),
        ("s3://my-bucket/subpath?query", "path component doesn't end in '/' (/subpath)"),
        (":garbage: :garbage:", 'parse ":garbage: :garbage:": missing protocol scheme'),
        ("foobar://baz/", "invalid scheme (foobar)"),
        ("gcs://bucket/", "invalid scheme (gcs)"),
        ("/baz/bing/", "not absolute (/baz/bing/)"),
        ("invalid", "not absolute (invalid)"),
        ("gs:///baz/bing/", "missing bucket (gs:///baz/bing/)"),
        ("file://host/mnt/path/", "file scheme cannot have host (file://host/mnt/path/)"),
        ("file:///mnt/path", "path component doesn't end in '/' (/mnt/path)"),
        ("azure-ad:///account/container/", "missing tenant ID (azure-ad:///account/container/)"),
        ("azure-ad://tenant//container/", "missing storage account (azure-ad://tenant//container/)"),
        ("azure-ad://tenant/account/", "missing storage container (azure-ad://tenant/account/)"),
        ("azure-ad://tenant/account", "missing storage container (azure-ad://tenant/account)"),
    ],
)
def test_validate_fragment_store(store: str, message: str | None) -> None:
    if message is None:
        v.validate_fragment_store(store)
    else:
        expect_error(v.validate_fragment_store, store, message)


# Endpoints, process IDs, broker specs (Go EndpointSuite, BrokerSpecSuite).


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        ("http://host:1234/path?query", None),
        ("https://host", None),
        ("unix://localhost/tmp/broker.sock", None),
        (":garbage: :garbage:", 'parse ":garbage: :garbage:": missing protocol scheme'),
        ("/baz/bing", "not absolute: /baz/bing"),
        ("http:///baz/bing", "missing host: http:///baz/bing"),
    ],
)
def test_validate_endpoint(endpoint: str, message: str | None) -> None:
    if message is None:
        v.validate_endpoint(endpoint)
    else:
        expect_error(v.validate_endpoint, endpoint, message)


@pytest.mark.parametrize(
    ("zone", "suffix", "message"),
    [
        ("a-zone", "a-name", None),
        ("", "a-name", "Zone: invalid length (0; expected 1 <= length <= 32)"),
        ("&*", "a-name", "Zone: not a valid token (&*)"),
        (
            "a-very-very-very-very-looong-zone",
            "a-name",
            "Zone: invalid length (33; expected 1 <= length <= 32)",
        ),
        ("a-zone", "ae", "Suffix: invalid length (2; expected 4 <= length <= 128)"),
        ("a-zone", "&*($", "Suffix: not a valid token (&*($)"),
    ],
)
def test_validate_process_id(zone: str, suffix: str, message: str | None) -> None:
    process_id = pb.ProcessSpec.ID(zone=zone, suffix=suffix)
    if message is None:
        v.validate_process_id(process_id)
    else:
        expect_error(v.validate_process_id, process_id, message)


def test_validate_broker_spec() -> None:
    spec = pb.BrokerSpec(
        process_spec=pb.ProcessSpec(
            id=pb.ProcessSpec.ID(zone="a-zone", suffix="a-name"), endpoint="http://foo"
        ),
        journal_limit=5,
    )
    v.validate_broker_spec(spec)
    spec.process_spec.id.zone = ""
    expect_error(v.validate_broker_spec, spec, "Id.Zone: invalid length (0; expected 1 <= length <= 32)")
    spec.process_spec.id.zone = "a-zone"
    spec.process_spec.endpoint = "invalid"
    expect_error(v.validate_broker_spec, spec, "Endpoint: not absolute: invalid")
    spec.process_spec.endpoint = "http://foo"
    spec.journal_limit = (1 << 17) + 1
    expect_error(
        v.validate_broker_spec, spec, "invalid JournalLimit (131073; expected 0 <= JournalLimit <= 131072)"
    )
    spec.journal_limit = 1 << 17
    v.validate_broker_spec(spec)


# Routes and headers (Go RouteSuite, HeaderSuite).


def test_validate_route_progression() -> None:
    route = pb.Route(
        primary=-1,
        members=[
            pb.ProcessSpec.ID(zone="zone-a", suffix="member-1"),
            pb.ProcessSpec.ID(zone="zone-a", suffix="member-3"),
            pb.ProcessSpec.ID(zone="zone-b", suffix="member-2"),
        ],
        endpoints=["http://foo", "http://bar", "http://baz"],
    )
    v.validate_route(route)

    route.members[0].zone = "invalid zone"
    expect_error(v.validate_route, route, "Members[0].Zone: not a valid token (invalid zone)")
    route.members[0].zone = "zone-a"

    route.members[1].CopyFrom(pb.ProcessSpec.ID(zone="zone-b", suffix="member-2"))
    route.members[2].CopyFrom(pb.ProcessSpec.ID(zone="zone-a", suffix="member-3"))
    expect_error(
        v.validate_route,
        route,
        "Members not in unique, sorted order "
        "(index 2; {Zone:zone-b Suffix:member-2} <= {Zone:zone-a Suffix:member-3})",
    )
    route.members[2].CopyFrom(pb.ProcessSpec.ID(zone="zone-b", suffix="member-2"))
    expect_error(
        v.validate_route,
        route,
        "Members not in unique, sorted order "
        "(index 2; {Zone:zone-b Suffix:member-2} <= {Zone:zone-b Suffix:member-2})",
    )
    route.members[1].CopyFrom(pb.ProcessSpec.ID(zone="zone-a", suffix="member-3"))

    route.primary = -2
    expect_error(v.validate_route, route, "invalid Primary (-2; expected -1 <= Primary < 3)")
    route.primary = 3
    expect_error(v.validate_route, route, "invalid Primary (3; expected -1 <= Primary < 3)")
    route.primary = 2

    route.endpoints.append("http://bing")
    expect_error(v.validate_route, route, "len(Endpoints) != 0, and != len(Members) (4 vs 3)")
    del route.endpoints[3]
    route.endpoints[2] = "invalid"
    expect_error(v.validate_route, route, "Endpoints[2]: not absolute: invalid")
    route.endpoints[2] = ""  # Empty endpoints are allowed.
    v.validate_route(route)
    del route.endpoints[:]
    v.validate_route(route)


def test_validate_header_etcd_progression() -> None:
    header = pb.Header(
        route=pb.Route(primary=-1),
        etcd=pb.Header.Etcd(cluster_id=0, member_id=0, revision=-42, raft_term=0),
    )
    expect_error(v.validate_header, header, "Etcd: invalid ClusterId (expected != 0)")
    header.etcd.cluster_id = 12
    expect_error(v.validate_header, header, "Etcd: invalid MemberId (expected != 0)")
    header.etcd.member_id = 34
    expect_error(v.validate_header, header, "Etcd: invalid Revision (-42; expected 0 < revision)")
    header.etcd.revision = 56
    expect_error(v.validate_header, header, "Etcd: invalid RaftTerm (expected != 0)")
    header.etcd.raft_term = 78
    v.validate_header(header)


def test_validate_header_progression() -> None:
    header = pb.Header(
        process_id=pb.ProcessSpec.ID(zone="no-suffix", suffix=""),
        route=pb.Route(primary=2, members=[pb.ProcessSpec.ID(zone="zone", suffix="name")]),
        etcd=pb.Header.Etcd(cluster_id=0, member_id=34, revision=56, raft_term=78),
    )
    expect_error(
        v.validate_header, header, "ProcessId.Suffix: invalid length (0; expected 4 <= length <= 128)"
    )
    header.process_id.suffix = "name"
    expect_error(v.validate_header, header, "Route: invalid Primary (2; expected -1 <= Primary < 1)")
    header.route.primary = 0
    expect_error(v.validate_header, header, "Etcd: invalid ClusterId (expected != 0)")
    header.etcd.cluster_id = 12
    v.validate_header(header)
    header.ClearField("process_id")  # An empty ProcessId is allowed.
    v.validate_header(header)


def test_validate_header_zero_value_fails_like_go() -> None:
    expect_error(v.validate_header, pb.Header(), "Route: invalid Primary (0; expected -1 <= Primary < 0)")


# Fragments (Go FragmentSuite.TestValidationCases).


def test_validate_fragment_progression() -> None:
    frag = pb.Fragment(
        journal="a/journal/name",
        begin=1234567890,
        end=(1 << 63) - 1,
        sum=pb.SHA1Sum(part1=0x0102030405060708, part2=0x090A0B0C0D0E0F10, part3=0x11121314),
        compression_codec=pb.GZIP,
    )
    v.validate_fragment(frag)
    frag.begin, frag.end = frag.end, frag.begin
    expect_error(v.validate_fragment, frag, f"expected Begin <= End (have {(1 << 63) - 1}, 1234567890)")
    frag.begin, frag.end = frag.end, frag.begin
    frag.journal = "a"
    expect_error(v.validate_fragment, frag, "Journal: invalid length (1; expected 4 <= length <= 512)")
    frag.journal = "foo/bar;meta"  # Meta is allowed on fragments.
    v.validate_fragment(frag)
    frag.compression_codec = 1 << 20  # type: ignore[assignment]
    expect_error(v.validate_fragment, frag, "CompressionCodec: invalid value (1048576)")
    frag.compression_codec = pb.GZIP
    frag.path_postfix = "a=b/c=2"
    v.validate_fragment(frag)
    frag.path_postfix = "/a=b"
    expect_error(v.validate_fragment, frag, "PathPostfix: cannot begin with '/' (/a=b)")


@pytest.mark.parametrize("status", [0, 4, 5, 14, 15])
def test_validate_status_ok(status: int) -> None:
    v.validate_status(status)


def test_validate_status_rejects_unknown() -> None:
    expect_error(v.validate_status, 9101, "invalid status (9101)")
    expect_error(v.validate_status, 16, "invalid status (16)")


# RPC requests (Go RPCSuite).


def test_read_request_progression() -> None:
    req = pb.ReadRequest(header=bad_header(), journal="/bad", offset=-2, end_offset=-1)
    expect_error(v.validate_read_request, req, "Header.Etcd: invalid ClusterId (expected != 0)")
    req.header.etcd.cluster_id = 12
    expect_error(v.validate_read_request, req, "Journal: cannot begin with '/' (/bad)")
    req.journal = "good"
    expect_error(v.validate_read_request, req, "invalid Offset (-2; expected -1 <= Offset <= MaxInt64)")
    req.offset = -1
    expect_error(v.validate_read_request, req, "invalid EndOffset (-1; expected 0 or Offset <= EndOffset)")
    req.end_offset = 100
    v.validate_read_request(req)
    req.offset = 101
    expect_error(v.validate_read_request, req, "invalid EndOffset (100; expected 0 or Offset <= EndOffset)")
    req.end_offset = 101
    v.validate_read_request(req)
    req.end_offset = 0
    v.validate_read_request(req)
    req.ClearField("header")
    req.journal = "good;meta"
    v.validate_read_request(req)


def test_append_request_progression() -> None:
    bad_label = pb.LabelSet(labels=[pb.Label(name="inv alid")])
    good_label = pb.LabelSet(labels=[pb.Label(name="valid")])
    req = pb.AppendRequest(
        header=bad_header(),
        journal="/bad",
        do_not_proxy=True,
        offset=-1,
        content=b"foo",
        check_registers=pb.LabelSelector(include=bad_label),
        union_registers=bad_label,
        subtract_registers=bad_label,
    )

    def check(message: str) -> None:
        expect_error(v.validate_append_request, req, message)

    check("Header.Etcd: invalid ClusterId (expected != 0)")
    req.header.etcd.cluster_id = 12
    check("Journal: cannot begin with '/' (/bad)")
    req.journal = "good"
    check("invalid Offset (-1; expected >= 0)")
    req.offset = 100
    check("unexpected Content")
    req.content = b""
    check("CheckRegisters.Include.Labels[0].Name: not a valid token (inv alid)")
    req.check_registers.include.CopyFrom(good_label)
    check("UnionRegisters.Labels[0].Name: not a valid token (inv alid)")
    req.union_registers.CopyFrom(good_label)
    check("SubtractRegisters.Labels[0].Name: not a valid token (inv alid)")
    req.subtract_registers.CopyFrom(good_label)
    req.suspend = 9  # type: ignore[assignment]
    check("invalid Suspend (9)")
    req.suspend = pb.AppendRequest.SUSPEND_KEEP
    v.validate_append_request(req)

    # Without a journal, this is a content chunk.
    req.journal = ""
    req.content = b"foo"
    check("unexpected Header")
    req.ClearField("header")
    check("unexpected DoNotProxy")
    req.do_not_proxy = False
    check("unexpected Offset")
    req.offset = 0
    check("unexpected CheckRegisters")
    req.ClearField("check_registers")
    check("unexpected UnionRegisters")
    req.ClearField("union_registers")
    check("unexpected SubtractRegisters")
    req.ClearField("subtract_registers")
    check("unexpected Suspend")
    req.suspend = pb.AppendRequest.SUSPEND_RESUME
    v.validate_append_request(req)

    v.validate_append_request(pb.AppendRequest())  # An empty message commits.


def test_replicate_request_progression() -> None:
    req = pb.ReplicateRequest(
        deprecated_journal="bad",
        proposal=pb.Fragment(journal="/bad/name", compression_codec=pb.NONE),
        content=b"foo",
        content_delta=100,
        header=bad_header(),
    )

    def check(message: str) -> None:
        expect_error(v.validate_replicate_request, req, message)

    check("Header.Etcd: invalid ClusterId (expected != 0)")
    req.header.etcd.cluster_id = 12
    check("expected Acknowledge with Header")
    req.acknowledge = True
    check("Proposal.Journal: cannot begin with '/' (/bad/name)")
    req.proposal.journal = "journal"
    # Absent registers are tolerated, per Gazette's migration stub: the next error is about content.
    check("unexpected Content with Proposal (len 3)")
    req.registers.labels.add(name="in valid")
    check("Registers.Labels[0].Name: not a valid token (in valid)")
    req.registers.labels[0].name = "valid"
    check("unexpected Content with Proposal (len 3)")
    req.content = b""
    check("unexpected ContentDelta with Proposal (100)")
    req.content_delta = 0
    check("DeprecatedJournal and Proposal.Journal mismatch (bad vs journal)")
    req.deprecated_journal = "journal"
    v.validate_replicate_request(req)

    # Without a proposal, this is a content chunk.
    req.ClearField("proposal")
    req.content_delta = -1
    check("expected Content or Proposal")
    req.content = b"foo"
    check("invalid ContentDelta (-1; expected >= 0)")
    req.content_delta = 100
    with pytest.raises(ValidationError) as info:
        v.validate_replicate_request(req)
    assert str(info.value).startswith("unexpected Header with Content (process_id {")
    req.ClearField("header")
    with pytest.raises(ValidationError) as info:
        v.validate_replicate_request(req)
    assert str(info.value) == 'unexpected Registers with Content (labels { name: "valid" })'
    req.ClearField("registers")
    check("unexpected Acknowledge with Content")
    req.acknowledge = False
    check("unexpected DeprecatedJournal with Content")
    req.deprecated_journal = ""
    v.validate_replicate_request(req)


def test_list_request_progression() -> None:
    req = pb.ListRequest(
        selector=pb.LabelSelector(
            include=pb.LabelSet(
                labels=[
                    pb.Label(name="a invalid name", value="foo"),
                    pb.Label(name="prefix", value="no/trailing/slash"),
                ]
            ),
            exclude=pb.LabelSet(
                labels=[pb.Label(name="bar", value="baz"), pb.Label(name="prefix", value="no/trailing/slash")]
            ),
        )
    )
    expect_error(
        v.validate_list_request, req, "Selector.Include.Labels[0].Name: not a valid token (a invalid name)"
    )
    req.selector.include.labels[0].name = "a-valid-name"
    expect_error(
        v.validate_list_request,
        req,
        "Selector.Include.Labels[\"prefix\"]: expected trailing '/' (no/trailing/slash)",
    )
    req.selector.include.labels[1].value = "trailing/slash/"
    expect_error(
        v.validate_list_request,
        req,
        "Selector.Exclude.Labels[\"prefix\"]: expected trailing '/' (no/trailing/slash)",
    )
    req.selector.exclude.labels[1].value = "trailing/slash/"
    v.validate_list_request(req)
    # `name:prefix` written directly has no trailing-slash rule.
    req.selector.include.labels.add(name="zz", value="x")
    req.selector.exclude.labels.insert(1, pb.Label(name="name", value="no/slash", prefix=True))
    v.validate_list_request(req)
    v.validate_list_request(pb.ListRequest())


def test_apply_request_progression() -> None:
    req = pb.ApplyRequest(
        changes=[
            pb.ApplyRequest.Change(
                expect_mod_revision=-2, upsert=pb.JournalSpec(name="a/journal"), delete="a/journal"
            ),
            pb.ApplyRequest.Change(expect_mod_revision=0, delete="a/journal invalid name"),
            pb.ApplyRequest.Change(expect_mod_revision=1),
        ]
    )

    def check(message: str) -> None:
        expect_error(v.validate_apply_request, req, message)

    check("Changes[0]: both Upsert and Delete are set (expected exactly one)")
    req.changes[0].delete = ""
    check("Changes[0].Upsert: invalid Replication (0; expected 1 <= Replication <= 5)")
    req.changes[0].upsert.CopyFrom(minimal_spec())
    check("Changes[0]: invalid ExpectModRevision (-2; expected >= 0 or -1)")
    req.changes[0].expect_mod_revision = 0
    check("Changes[1].Delete: not a valid token (a/journal invalid name)")
    req.changes[1].delete = "a/journal"
    check("Changes[1]: invalid ExpectModRevision (0; expected > 0 or -1)")
    req.changes[1].expect_mod_revision = 1
    check("Changes[2]: neither Upsert nor Delete are set (expected exactly one)")
    req.changes[2].delete = "other/journal"
    v.validate_apply_request(req)
    req.changes[0].expect_mod_revision = -1
    req.changes[2].expect_mod_revision = -1
    v.validate_apply_request(req)


def test_apply_request_nested_context() -> None:
    spec = minimal_spec()
    spec.fragment.length = 1
    req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)])
    expect_error(
        v.validate_apply_request,
        req,
        "Changes[0].Upsert.Fragment: invalid Length (1; expected 1024 <= length <= 17179869184)",
    )


def test_fragments_request_progression() -> None:
    req = pb.FragmentsRequest(
        header=bad_header(),
        journal="/bad",
        signatureTTL=dur(0),
        begin_mod_time=10,
        end_mod_time=5,
        next_page_token=-1,
        page_limit=-1,
    )

    def check(message: str) -> None:
        expect_error(v.validate_fragments_request, req, message)

    check("Header.Etcd: invalid ClusterId (expected != 0)")
    req.header.etcd.cluster_id = 12
    check("Journal: cannot begin with '/' (/bad)")
    req.journal = "good"
    check("invalid EndModTime (5 must be after 10)")
    req.end_mod_time = 0
    check("invalid NextPageToken (-1; must be >= 0)")
    req.next_page_token = 10
    check("invalid PageLimit (-1; must be >= 0 and <= 10000)")
    req.page_limit = 10001
    check("invalid PageLimit (10001; must be >= 0 and <= 10000)")
    req.page_limit = 10
    check("invalid SignatureTTL (0s; must be > 0s)")
    req.signatureTTL.CopyFrom(dur(1))
    v.validate_fragments_request(req)
    req.ClearField("signatureTTL")  # Absent is allowed.
    v.validate_fragments_request(req)


def test_fragment_store_health_request() -> None:
    req = pb.FragmentStoreHealthRequest(fragment_store="invalid")
    expect_error(v.validate_fragment_store_health_request, req, "FragmentStore: not absolute (invalid)")
    req.fragment_store = "s3://bucket/root/"
    v.validate_fragment_store_health_request(req)
    req.check_delete_prefix = "probe/"
    expect_error(v.validate_fragment_store_health_request, req, "expected CheckDelete with CheckDeletePrefix")
    req.check_delete = True
    v.validate_fragment_store_health_request(req)

    for prefix, message in [
        ("probe", "CheckDeletePrefix: expected trailing '/' (probe)"),
        ("../", "CheckDeletePrefix: cannot begin with '..' (../)"),
        ("../x/", "CheckDeletePrefix: cannot begin with '..' (../x/)"),
        ("/", "CheckDeletePrefix: invalid length (0; expected 1 <= length <= 512)"),
        ("a//", "CheckDeletePrefix: must be a clean path (a/)"),
        ("/a/", "CheckDeletePrefix: cannot begin with '/' (/a)"),
        ("a b/", "CheckDeletePrefix: not a valid token (a b)"),
    ]:
        req.check_delete_prefix = prefix
        expect_error(v.validate_fragment_store_health_request, req, message)
    req.check_delete_prefix = "..a/b/"
    v.validate_fragment_store_health_request(req)


# RPC responses (Go RPCSuite).


def test_read_response_progression() -> None:
    frag = pb.Fragment(
        journal="/bad/name",
        begin=0x499602D2,
        end=0x8BD03835,
        sum=pb.SHA1Sum(part1=0x0102030405060708, part2=0x090A0B0C0D0E0F10, part3=0x11121314),
        compression_codec=pb.SNAPPY,
    )
    resp = pb.ReadResponse(
        status=9101,  # type: ignore[arg-type]
        header=bad_header(),
        offset=1234,
        write_head=5678,
        fragment=frag,
        fragment_url=":/bad/url",
    )

    def check(message: str) -> None:
        expect_error(v.validate_read_response, resp, message)

    check("Status: invalid status (9101)")
    resp.status = pb.OK
    check("Header.Etcd: invalid ClusterId (expected != 0)")
    resp.header.etcd.cluster_id = 12
    check("Fragment.Journal: cannot begin with '/' (/bad/name)")
    resp.fragment.journal = "a/journal"
    check("invalid Offset (1234; expected 1234567890 <= offset < 2345678901)")
    resp.offset = 1234567891
    check("invalid WriteHead (5678; expected >= 2345678901)")
    resp.write_head = 2345678901
    check('FragmentUrl: parse ":/bad/url": missing protocol scheme')
    resp.fragment_url = "http://foo"
    v.validate_read_response(resp)

    resp.ClearField("fragment")
    resp.write_head = -1
    check("invalid WriteHead (-1; expected >= 0)")
    resp.write_head = 1234
    check("unexpected Offset without Fragment or Content (1234567891)")
    resp.offset = 0
    check("unexpected FragmentUrl without Fragment (http://foo)")
    resp.fragment_url = ""
    v.validate_read_response(resp)

    resp.content = b"foobar"
    resp.fragment.CopyFrom(frag)
    resp.fragment.journal = "a/journal"
    resp.offset = 5678
    resp.fragment_url = "http://foo"
    resp.status = pb.WRONG_ROUTE
    check("unexpected Status with Content (WRONG_ROUTE)")
    resp.status = pb.OK
    with pytest.raises(ValidationError) as info:
        v.validate_read_response(resp)
    assert str(info.value).startswith("unexpected Header with Content (process_id {")
    resp.ClearField("header")
    check("unexpected WriteHead with Content (1234)")
    resp.write_head = 0
    with pytest.raises(ValidationError) as info:
        v.validate_read_response(resp)
    assert str(info.value).startswith('unexpected Fragment with Content (journal: "a/journal"')
    resp.ClearField("fragment")
    check("unexpected FragmentUrl with Content (http://foo)")
    resp.fragment_url = ""
    v.validate_read_response(resp)  # Content may carry an offset.


def test_read_response_non_ok_without_fragment_may_carry_offset() -> None:
    v.validate_read_response(pb.ReadResponse(status=pb.OFFSET_NOT_YET_AVAILABLE, offset=100, write_head=50))


def test_append_response_progression() -> None:
    resp = pb.AppendResponse(status=9101, header=bad_header())  # type: ignore[arg-type]

    def check(message: str) -> None:
        expect_error(v.validate_append_response, resp, message)

    check("Status: invalid status (9101)")
    resp.status = pb.OK
    check("Header.Etcd: invalid ClusterId (expected != 0)")
    resp.header.etcd.cluster_id = 12
    check("expected Commit")
    resp.commit.CopyFrom(pb.Fragment(journal="/bad/name", compression_codec=pb.NONE))
    check("expected Registers")
    resp.registers.labels.add(name="in valid")
    check("Commit.Journal: cannot begin with '/' (/bad/name)")
    resp.commit.journal = "good/name"
    check("Registers.Labels[0].Name: not a valid token (in valid)")
    resp.registers.labels[0].name = "valid"
    v.validate_append_response(resp)

    # REGISTER_MISMATCH needs registers but no commit.
    mismatch = pb.AppendResponse(status=pb.REGISTER_MISMATCH, header=resp.header)
    expect_error(v.validate_append_response, mismatch, "expected Registers")
    mismatch.registers.SetInParent()
    v.validate_append_response(mismatch)
    v.validate_append_response(pb.AppendResponse(status=pb.JOURNAL_NOT_FOUND, header=resp.header))


def test_replicate_response_progression() -> None:
    resp = pb.ReplicateResponse(
        status=9101,  # type: ignore[arg-type]
        header=bad_header(),
        fragment=pb.Fragment(journal="/bad/name", compression_codec=pb.NONE),
        registers=pb.LabelSet(),
    )

    def check(message: str) -> None:
        expect_error(v.validate_replicate_response, resp, message)

    check("Status: invalid status (9101)")
    resp.status = pb.OK
    with pytest.raises(ValidationError) as info:
        v.validate_replicate_response(resp)
    assert str(info.value).startswith("unexpected Header (process_id {")
    resp.ClearField("header")
    with pytest.raises(ValidationError) as info:
        v.validate_replicate_response(resp)
    assert str(info.value).startswith('unexpected Fragment (journal: "/bad/name"')
    resp.ClearField("fragment")
    check("unexpected Registers ()")
    resp.ClearField("registers")
    v.validate_replicate_response(resp)

    resp.status = pb.WRONG_ROUTE
    check("expected Header")
    resp.header.CopyFrom(bad_header())
    check("Header.Etcd: invalid ClusterId (expected != 0)")
    resp.header.etcd.cluster_id = 12
    v.validate_replicate_response(resp)

    resp.status = pb.PROPOSAL_MISMATCH
    resp.ClearField("header")
    check("expected Fragment")
    resp.fragment.CopyFrom(pb.Fragment(journal="/bad/name", compression_codec=pb.NONE))
    check("Fragment.Journal: cannot begin with '/' (/bad/name)")
    resp.fragment.journal = "journal"
    check("expected Registers")
    resp.registers.labels.add(name="in valid")
    check("Registers.Labels[0].Name: not a valid token (in valid)")
    resp.registers.labels[0].name = "valid"
    v.validate_replicate_response(resp)


def test_list_response_progression() -> None:
    spec = minimal_spec("a/journal invalid name")
    resp = pb.ListResponse(
        status=9101,  # type: ignore[arg-type]
        header=bad_header(),
        journals=[pb.ListResponse.Journal(mod_revision=0, spec=spec, route=pb.Route(primary=0))],
    )

    def check(message: str) -> None:
        expect_error(v.validate_list_response, resp, message)

    check("Status: invalid status (9101)")
    resp.status = pb.OK
    check("Header.Etcd: invalid ClusterId (expected != 0)")
    resp.header.etcd.cluster_id = 1234
    check("Journals[0].Spec.Name: not a valid token (a/journal invalid name)")
    resp.journals[0].spec.name = "a/journal"
    check("Journals[0]: invalid ModRevision (0; expected > 0)")
    resp.journals[0].mod_revision = 1
    check("Journals[0].Route: invalid Primary (0; expected -1 <= Primary < 0)")
    resp.journals[0].route.primary = -1
    v.validate_list_response(resp)


def test_apply_response_progression() -> None:
    resp = pb.ApplyResponse(status=9101, header=bad_header())  # type: ignore[arg-type]
    expect_error(v.validate_apply_response, resp, "Status: invalid status (9101)")
    resp.status = pb.OK
    expect_error(v.validate_apply_response, resp, "Header.Etcd: invalid ClusterId (expected != 0)")
    resp.header.etcd.cluster_id = 1234
    v.validate_apply_response(resp)


def test_fragments_response_progression() -> None:
    resp = pb.FragmentsResponse(
        status=9101,  # type: ignore[arg-type]
        header=bad_header(),
        fragments=[
            pb.FragmentsResponse._Fragment(
                spec=pb.Fragment(journal="in valid", compression_codec=pb.NONE), signed_url=":gar: :bage:"
            )
        ],
    )

    def check(message: str) -> None:
        expect_error(v.validate_fragments_response, resp, message)

    check("Status: invalid status (9101)")
    resp.status = pb.OK
    check("Header.Etcd: invalid ClusterId (expected != 0)")
    resp.header.etcd.cluster_id = 1234
    check("Fragments[0].Spec.Journal: not a valid token (in valid)")
    resp.fragments[0].spec.journal = "valid/name"
    check('Fragments[0].SignedUrl: parse ":gar: :bage:": missing protocol scheme')
    resp.fragments[0].signed_url = "http://host/path"
    v.validate_fragments_response(resp)
    resp.fragments[0].signed_url = ""
    v.validate_fragments_response(resp)


# Go duration formatting.


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (1, "1ns"),
        (1100, "1.1µs"),
        (2_200_000, "2.2ms"),
        (1_000_000, "1ms"),
        (10**9, "1s"),
        (3_300_000_000, "3.3s"),
        (60 * 10**9, "1m0s"),
        (4 * 60 * 10**9 + 5 * 10**9, "4m5s"),
        (5 * 3600 * 10**9 + 6 * 60 * 10**9 + 7_001_000_000, "5h6m7.001s"),
        (24 * 3600 * 10**9, "24h0m0s"),
        (-(10**9), "-1s"),
        (-1500, "-1.5µs"),
    ],
)
def test_go_duration(ns: int, text: str) -> None:
    assert v.go_duration(ns) == text
