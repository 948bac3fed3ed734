"""Journalspace YAML: strict decoding and its errors, flattening, hoisting and round trips."""

from __future__ import annotations

import textwrap
from typing import TypeVar

import pytest
from google.protobuf import text_format
from google.protobuf.message import Message

from broker.protocol import labels, pb
from broker.specs import SpecError
from broker.specs.durations import DurationError, parse_duration, to_proto
from gazctl.specs import journalspace as js

# The round-trip fixture of Gazette's node_test.go, with its `gcs://` store dropped (not a valid
# scheme) and `revision: 17` added to the delete (a delete needs a revision).
FIXTURE = """\
name: foo/
replication: 3
labels:
- name: a-name
  value: a-val
fragment:
  length: 1234
  compression_codec: SNAPPY
  stores:
  - s3://a-bucket/
  refresh_interval: 1m0s
  retention: 1h0m0s
  flush_interval: 2m0s
flags: O_RDWR
max_append_rate: 11223344
children:
- delete: true
  name: foo/bar
  revision: 17
- name: foo/baz/1
- name: foo/baz/2
  labels:
  - name: other-name
    value: ""
  revision: 1234
"""

# A complete, valid spec which children below override.
VALID = """\
name: ab/
replication: 2
fragment:
  length: 1048576
  compression_codec: NONE
  refresh_interval: 1m
children:
"""


M = TypeVar("M", bound=Message)


def canon(msg: M) -> M:
    """A copy without empty sub-messages: their presence means nothing to Gazette (nullable=false)."""
    out = type(msg)()
    out.CopyFrom(msg)
    _strip(out)
    return out


def _strip(msg: Message) -> None:
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        items = value if field.is_repeated else [value]
        for item in items:
            _strip(item)
        if not field.is_repeated and value.ByteSize() == 0:
            msg.ClearField(field.name)


def spec(text: str) -> pb.JournalSpec:
    return canon(text_format.Parse(text, pb.JournalSpec()))


def full_spec(name: str, **overrides: object) -> pb.JournalSpec:
    """A valid spec as a broker would list it."""
    out = pb.JournalSpec(name=name, replication=3, flags=pb.JournalSpec.O_RDWR, max_append_rate=1000)
    out.labels.CopyFrom(labels.label_set(("app.gazette.dev/message-type", "Msg"), ("content-type", "text/csv")))
    out.fragment.length = 1 << 20
    out.fragment.compression_codec = pb.SNAPPY
    out.fragment.stores.extend(["s3://bucket/prefix/", "file:///backup/"])
    out.fragment.refresh_interval.CopyFrom(to_proto(30 * 10**9))
    out.fragment.retention.CopyFrom(to_proto(720 * 3600 * 10**9))
    out.fragment.flush_interval.CopyFrom(to_proto(600 * 10**9))
    out.fragment.path_postfix_template = 'date={{.Spool.FirstAppendTime.Format "2006-01-02"}}'
    for key, value in overrides.items():
        if key == "labels":
            assert isinstance(value, pb.LabelSet)
            out.labels.CopyFrom(value)
        elif key in ("stores",):
            assert isinstance(value, list)
            del out.fragment.stores[:]
            out.fragment.stores.extend(value)
        elif key in ("length", "compression_codec"):
            setattr(out.fragment, key, value)
        elif key == "suspend":
            assert isinstance(value, pb.JournalSpec.Suspend)
            out.suspend.CopyFrom(value)
        else:
            setattr(out, key, value)
    return out


def flat(text: str, validate: bool = True) -> list[tuple[pb.JournalSpec, int, bool]]:
    return [(canon(f.spec), f.expect_mod_revision, f.delete) for f in js.flatten(js.load(text, "t.yaml"), validate)]


def error_of(text: str, validate: bool = True) -> SpecError:
    with pytest.raises(SpecError) as info:
        js.flatten(js.load(text, "specs/j.yaml"), validate)
    return info.value


# Flattening.


def test_fixture_flattens_with_inheritance() -> None:
    fragment = (
        'fragment { length: 1234 compression_codec: SNAPPY stores: "s3://a-bucket/" '
        "refresh_interval { seconds: 60 } retention { seconds: 3600 } flush_interval { seconds: 120 } } "
        "flags: 4 max_append_rate: 11223344"
    )
    a_label = 'labels { labels { name: "a-name" value: "a-val" } }'
    assert flat(FIXTURE) == [
        (spec(f'name: "foo/bar" replication: 3 {a_label} {fragment}'), 17, True),
        (spec(f'name: "foo/baz/1" replication: 3 {a_label} {fragment}'), 0, False),
        (
            spec(
                'name: "foo/baz/2" replication: 3 labels { labels { name: "a-name" value: "a-val" } '
                f'labels {{ name: "other-name" }} }} {fragment}'
            ),
            1234,
            False,
        ),
    ]


def test_fixture_round_trips_through_push_down_and_hoist() -> None:
    tree = js.load(FIXTURE, "t.yaml")
    assert js.dump(js.hoist_tree(js.push_down(tree))) == FIXTURE


@pytest.mark.parametrize("root", ["", "shared-root/"])
def test_push_down_overrides_and_delete_inheritance(root: str) -> None:
    # Gazette's TestPushDown.
    text = textwrap.dedent(f"""\
        name: "{root}"
        replication: 1
        children:
        - name: {root}aaa/
          flags: O_RDWR
          children:
          - name: {root}aaa/111
            flags: O_RDONLY
          - name: {root}aaa/222
        - name: {root}bbb/
          children:
          - name: {root}bbb/333/
            replication: 2
            children:
            - name: {root}bbb/333/a/
              delete: true
              children:
              - name: {root}bbb/333/a/x
              - name: {root}bbb/333/a/y
                delete: false
            - name: {root}bbb/333/z
          - name: {root}bbb/444
            replication: 3
            flags: O_WRONLY
        """)
    assert flat(text, validate=False) == [
        (spec(f'name: "{root}aaa/111" replication: 1 flags: 1'), 0, False),
        (spec(f'name: "{root}aaa/222" replication: 1 flags: 4'), 0, False),
        (spec(f'name: "{root}bbb/333/a/x" replication: 2'), 0, True),
        (spec(f'name: "{root}bbb/333/a/y" replication: 2'), 0, False),
        (spec(f'name: "{root}bbb/333/z" replication: 2'), 0, False),
        (spec(f'name: "{root}bbb/444" replication: 3 flags: 2'), 0, False),
    ]


def test_labels_merge_by_name_and_child_wins() -> None:
    text = VALID + textwrap.dedent("""\
        - name: ab/x
          labels:
          - {name: keep, value: child}
          - {name: own, value: "1"}
        """)
    text = text.replace(
        "replication: 2\n", "replication: 2\nlabels:\n- {name: inherited, value: v}\n- {name: keep, value: parent}\n"
    )
    ((got, _, _),) = flat(text)
    assert [(lb.name, lb.value) for lb in got.labels.labels] == [
        ("inherited", "v"),
        ("keep", "child"),
        ("own", "1"),
    ]


def test_stores_inherit_unless_given_even_empty() -> None:
    text = VALID.replace("  refresh_interval", "  stores: [s3://parent/]\n  refresh_interval") + textwrap.dedent("""\
        - name: ab/inherits
        - name: ab/none
          fragment: {stores: []}
        - name: ab/own
          fragment: {stores: ["s3://own/"]}
        """)
    assert [list(s.fragment.stores) for s, _, _ in flat(text)] == [["s3://parent/"], [], ["s3://own/"]]
    # `stores: []` survives a dump, so re-loading still opts out.
    tree = js.load(text, "t.yaml")
    assert [list(s.fragment.stores) for s, _, _ in flat(js.dump(tree))] == [["s3://parent/"], [], ["s3://own/"]]


def test_suspend_is_not_inherited() -> None:
    text = VALID.replace("replication: 2\n", "replication: 2\nsuspend: {level: FULL, offset: 5}\n") + "- name: ab/x\n"
    ((got, _, _),) = flat(text)
    assert not got.HasField("suspend")


def test_journal_suspend_and_numbers() -> None:
    text = VALID + "- name: ab/x\n  suspend: {level: PARTIAL, offset: 99}\n  flags: 4\n  revision: -1\n"
    ((got, revision, delete),) = flat(text)
    assert (got.suspend.level, got.suspend.offset, got.flags, revision, delete) == (1, 99, 4, -1, False)


def test_single_journal_without_tree() -> None:
    text = "name: solo\nreplication: 1\nfragment: {length: 1024, compression_codec: GZIP, refresh_interval: 1h30m}\n"
    ((got, revision, delete),) = flat(text)
    assert got.name == "solo" and revision == 0 and not delete
    assert got.fragment.refresh_interval.seconds == 5400


def test_change_maps_upserts_and_deletes() -> None:
    upsert, delete = js.flatten(
        js.load(VALID + "- name: ab/x\n  revision: 3\n- name: ab/y\n  delete: true\n  revision: 4\n")
    )
    assert js.change(upsert) == pb.ApplyRequest.Change(expect_mod_revision=3, upsert=upsert.spec)
    assert js.change(delete) == pb.ApplyRequest.Change(expect_mod_revision=4, delete="ab/y")


def test_comment_passes_through() -> None:
    text = "comment: hello\nname: ab/\nchildren:\n- comment: leaf\n  name: ab/b\n"
    tree = js.load(text)
    assert (tree.comment, tree.children[0].comment) == ("hello", "leaf")
    assert js.dump(tree) == text


# Hoisting.


def test_shared_prefix_cases() -> None:
    cases = [
        ("foo/bar", "foo/baz", 4),
        ("foo/bar/baz", "foo/bar/bing", 8),
        ("foo/bar/baz/1", "foo/bar/baz/2", 12),
        ("foo/bar/baz/match", "foo/bar/baz/match", 12),
        ("foo/bar/", "foo/baz/", 4),
        ("foo/bar/", "foo/bar/", 8),
        ("miss/", "match/", 0),
    ]
    for a, b, length in cases:
        assert js._shared_prefix(a, b) == length
        assert js._shared_prefix(b, a) == length


def shape(node: js.Node) -> object:
    return (node.name, [shape(c) for c in node.children]) if node.children else node.name


def test_tree_extraction() -> None:
    names = [
        "root/aaa/000",
        "root/aaa/111/foo/i",
        "root/aaa/111/foo/j",
        "root/aaa/222",
        "root/bbb/333/a/x",
        "root/bbb/333/a/y",
        "root/bbb/333/z",
        "root/bbb/444",
    ]
    tree = js.hoist((pb.JournalSpec(name=n), 1) for n in reversed(names))
    assert shape(tree) == (
        "root/",
        [
            (
                "root/aaa/",
                ["root/aaa/000", ("root/aaa/111/foo/", ["root/aaa/111/foo/i", "root/aaa/111/foo/j"]), "root/aaa/222"],
            ),
            (
                "root/bbb/",
                [
                    (
                        "root/bbb/333/",
                        [("root/bbb/333/a/", ["root/bbb/333/a/x", "root/bbb/333/a/y"]), "root/bbb/333/z"],
                    ),
                    "root/bbb/444",
                ],
            ),
        ],
    )


def test_hoisting_moves_common_fields_and_delete_up() -> None:
    # Gazette's TestSpecHoisting.
    common = 'replication: 2 flags: 1 labels { labels { name: "name-1" value: "val-1" } }'
    tree = js.Node(
        spec=pb.JournalSpec(name="node/"),
        children=[
            js.Node(spec=spec(f'name: "node/aaa" {common}'), delete=True),
            js.Node(
                spec=spec(
                    'name: "node/bbb" replication: 2 flags: 1 labels { labels { name: "name-1" value: "val-1" } '
                    'labels { name: "name-2" value: "val-2" } }'
                ),
                delete=True,
            ),
        ],
    )
    hoisted = js.hoist_tree(tree)
    assert canon(hoisted.spec) == spec(f'name: "node/" {common}')
    assert hoisted.delete is True
    assert [(canon(c.spec), c.delete) for c in hoisted.children] == [
        (spec('name: "node/aaa"'), None),
        (spec('name: "node/bbb" labels { labels { name: "name-2" value: "val-2" } }'), None),
    ]


def test_hoisted_list_dumps_minimal_tree() -> None:
    journals = [
        (full_spec("ex/a/1"), 5),
        (full_spec("ex/a/2", max_append_rate=0), 6),
        (full_spec("ex/b", stores=["s3://other/"]), 7),
    ]
    assert js.dump(js.hoist(journals)) == textwrap.dedent("""\
        name: ex/
        replication: 3
        labels:
        - name: app.gazette.dev/message-type
          value: Msg
        - name: content-type
          value: text/csv
        fragment:
          length: 1048576
          compression_codec: SNAPPY
          refresh_interval: 30s
          retention: 720h0m0s
          flush_interval: 10m0s
          path_postfix_template: date={{.Spool.FirstAppendTime.Format "2006-01-02"}}
        flags: O_RDWR
        children:
        - name: ex/a/
          fragment:
            stores:
            - s3://bucket/prefix/
            - file:///backup/
          children:
          - name: ex/a/1
            max_append_rate: 1000
            revision: 5
          - name: ex/a/2
            revision: 6
        - name: ex/b
          fragment:
            stores:
            - s3://other/
          max_append_rate: 1000
          revision: 7
        """)


@pytest.mark.parametrize(
    "journals",
    [
        pytest.param([(full_spec("one/journal"), 3)], id="single"),
        pytest.param(
            [
                (full_spec("ex/a/1"), 5),
                (full_spec("ex/a/2", replication=1, compression_codec=pb.ZSTANDARD), 6),
                (full_spec("ex/b/x", stores=[]), 7),
                (full_spec("ex/b/y", stores=["s3://other/"], flags=pb.JournalSpec.O_RDONLY), 8),
                (
                    full_spec(
                        "ex/c",
                        labels=labels.label_set(("content-type", "text/csv"), ("x-tag", "1"), ("x-tag", "2")),
                        suspend=pb.JournalSpec.Suspend(level=pb.JournalSpec.Suspend.FULL, offset=123),
                    ),
                    9,
                ),
                (full_spec("other/z", length=4096), 10),
            ],
            id="mixed",
        ),
        pytest.param(
            [(full_spec(f"p/{i:02d}", suspend=pb.JournalSpec.Suspend(level=1)), i + 1) for i in range(3)],
            id="all-suspended",
        ),
    ],
)
def test_list_yaml_applies_back_unchanged(journals: list[tuple[pb.JournalSpec, int]]) -> None:
    text = js.dump(js.hoist(journals))
    assert flat(text) == [(canon(s), revision, False) for s, revision in journals]


def test_empty_list_dumps_empty_mapping() -> None:
    assert js.dump(js.hoist([])) == "{}\n"


# Decoding errors: each names the file, line, column and field.

ERRORS = [
    ("unknown-field", VALID + "- name: ab/x\n  colour: red\n", 9, 3, "children[0].colour", "unknown field 'colour'"),
    ("unknown-nested", VALID.replace("  length:", "  lenght:"), 4, 3, "fragment.lenght", "unknown field 'lenght'"),
    (
        "label-field",
        VALID + "- name: ab/x\n  labels: [{name: ab, val: x}]\n",
        9,
        23,
        "children[0].labels[0].val",
        "unknown field",
    ),
    (
        "duration-words",
        VALID.replace("1m\n", "10 minutes\n"),
        6,
        21,
        "fragment.refresh_interval",
        "unknown unit ' minutes'",
    ),
    ("duration-days", VALID.replace("1m\n", "1d\n"), 6, 21, "fragment.refresh_interval", "unknown unit 'd'"),
    ("duration-no-unit", VALID.replace("1m\n", "'60'\n"), 6, 21, "fragment.refresh_interval", "missing unit"),
    ("duration-int", VALID.replace("1m\n", "60\n"), 6, 21, "fragment.refresh_interval", "got integer 60"),
    ("codec", VALID.replace("NONE", "LZ4"), 5, 22, "fragment.compression_codec", "invalid value 'LZ4'"),
    ("codec-number", VALID.replace("NONE", "3"), 5, 22, "fragment.compression_codec", "invalid value integer 3"),
    ("flags", VALID + "- name: ab/x\n  flags: RW\n", 9, 10, "children[0].flags", "invalid value 'RW'"),
    (
        "suspend-level",
        VALID + "- name: ab/x\n  suspend: {level: ALL}\n",
        9,
        20,
        "children[0].suspend.level",
        "invalid value 'ALL'",
    ),
    ("int-string", VALID.replace("replication: 2", "replication: two"), 2, 14, "replication", "expected an integer"),
    ("int-float", VALID.replace("replication: 2", "replication: 2.0"), 2, 14, "replication", "got number 2.0"),
    ("int-range", VALID.replace("replication: 2", "replication: 3000000000"), 2, 14, "replication", "out of range"),
    ("bool", VALID + "- name: ab/x\n  delete: yes\n", 9, 11, "children[0].delete", "expected true or false"),
    ("string", VALID.replace("name: ab/", "name: [a]"), 1, 7, "name", "expected a string"),
    (
        "not-list",
        VALID + "- name: ab/x\n  fragment: {stores: s3://b/}\n",
        9,
        22,
        "children[0].fragment.stores",
        "expected a list",
    ),
    ("not-mapping", VALID + "- ab/x\n", 8, 3, "children[0]", "expected a mapping"),
    ("root-list", "- a\n", 1, 1, "", "expected a mapping"),
    ("empty", "", 1, 1, "", "empty document"),
    ("duplicate-key", VALID + "- name: ab/x\n  name: ab/y\n", 9, 3, "", 'duplicate key "name"'),
    ("syntax", VALID + "- name: [ab/x\n", 9, 1, "", "invalid YAML"),
    ("two-documents", VALID + "- name: ab/x\n---\nname: b\n", 9, 1, "", "single document"),
    (
        "label-name",
        VALID + "- name: ab/x\n  labels: [{value: x}]\n",
        9,
        12,
        "children[0].labels[0]",
        "label has no name",
    ),
    (
        "label-order",
        VALID + "- name: ab/x\n  labels: [{name: bb}, {name: aa}]\n",
        9,
        11,
        "children[0].labels",
        "not in unique, sorted order",
    ),
]


@pytest.mark.parametrize(
    ("text", "line", "column", "field", "message"),
    [pytest.param(*case[1:], id=case[0]) for case in ERRORS],
)
def test_decode_errors_name_file_line_and_field(text: str, line: int, column: int, field: str, message: str) -> None:
    err = error_of(text)
    assert (err.file, err.line, err.column, err.field) == ("specs/j.yaml", line, column, field), str(err)
    assert message in err.message
    assert str(err).startswith(f"specs/j.yaml:{line}:{column}: ")


TREE_ERRORS = [
    ("order", VALID + "- name: ab/y\n- name: ab/x\n", 9, "children[1].name", "expected children to be ordered"),
    ("prefix", VALID + "- name: b/x\n", 8, "children[0].name", "expected parent name to prefix child (ab/ vs b/x)"),
    ("empty-dir", VALID + "- name: ab/d/\n", 8, "children[0].name", "directory 'ab/d/' has no children"),
    (
        "journal-children",
        VALID + "- name: ab/j\n  children: [{name: ab/j/1}]\n",
        9,
        "children[0].children",
        "cannot have children",
    ),
    (
        "dir-revision",
        VALID.replace("replication", "revision: 3\nreplication") + "- name: ab/x\n",
        2,
        "revision",
        "unexpected revision (3)",
    ),
    ("journal-name", VALID + "- name: ab/x y\n", 8, "children[0].name", "not a valid token (ab/x y)"),
    (
        "delete-revision",
        VALID + "- name: ab/x\n  delete: true\n",
        8,
        "children[0].name",
        "ExpectModRevision (0; expected > 0 or -1)",
    ),
    (
        "upsert-revision",
        VALID + "- name: ab/x\n  revision: -2\n",
        9,
        "children[0].revision",
        "ExpectModRevision (-2; expected >= 0 or -1)",
    ),
    (
        "invalid-spec",
        VALID.replace("1m\n", "0s\n") + "- name: ab/x\n",
        8,
        "children[0].name",
        "Fragment: invalid RefreshInterval (0s",
    ),
    (
        "invalid-store",
        VALID + "- name: ab/x\n  fragment: {stores: [s3://b]}\n",
        8,
        "children[0].name",
        "Fragment.Stores[0]",
    ),
    (
        "duplicate",
        VALID + "- name: ab/b/\n  children: [{name: ab/b/c}]\n- name: ab/b/c\n",
        10,
        "children[1].name",
        "appears more than once",
    ),
]


@pytest.mark.parametrize(
    ("text", "line", "field", "message"),
    [pytest.param(*case[1:], id=case[0]) for case in TREE_ERRORS],
)
def test_tree_and_spec_errors_point_at_the_node(text: str, line: int, field: str, message: str) -> None:
    err = error_of(text)
    assert (err.file, err.line, err.field) == ("specs/j.yaml", line, field), str(err)
    assert message in err.message


def test_spec_error_names_the_journal() -> None:
    err = error_of(VALID.replace("replication: 2", "replication: 9") + "- name: ab/x\n")
    assert "invalid spec of journal 'ab/x': invalid Replication (9" in err.message


# Scalars.


@pytest.mark.parametrize(
    ("text", "ns"),
    [("10m", 600 * 10**9), ("1h30m", 5400 * 10**9), ("60s", 60 * 10**9), ("0", 0), ("1.5h", 5400 * 10**9),
     ("300ms", 300 * 10**6), ("-2m", -120 * 10**9), ("1h0m0s", 3600 * 10**9), ("2us", 2000), ("2µs", 2000)],
)  # fmt: skip
def test_go_durations(text: str, ns: int) -> None:
    assert parse_duration(text) == ns


@pytest.mark.parametrize("text", ["", "10", "1d", "1 h", ".s", "-", "h", "1h30", "99999999999h"])
def test_bad_go_durations(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)


def test_plain_scalars_decode_as_strings_and_nulls_as_zero() -> None:
    text = VALID + "- name: ab/x\n  labels: [{name: num, value: 12}, {name: yes, value: true}, {name: zz, value: }]\n"
    text += "  max_append_rate:\n"
    ((got, _, _),) = flat(text)
    assert [(lb.name, lb.value) for lb in got.labels.labels] == [("num", "12"), ("yes", "true"), ("zz", "")]
    assert got.max_append_rate == 0
