"""LabelSet construction and algebra, and selector matching, following Gazette's LabelSuite."""

import pytest

from broker.protocol import labels as lbl
from broker.protocol import pb
from broker.protocol.validation import validate_label_set


def ls(*nv: str) -> pb.LabelSet:
    """A LabelSet from alternating names and values, as Go's MustLabelSet."""
    return lbl.label_set(*zip(nv[::2], nv[1::2], strict=True))


def pairs(set_: pb.LabelSet) -> list[tuple[str, str, bool]]:
    return [(label.name, label.value, label.prefix) for label in set_.labels]


def test_constants() -> None:
    assert lbl.CONTENT_TYPE == "content-type"
    assert lbl.CONTENT_TYPE_CSV == "text/csv"
    assert lbl.CONTENT_TYPE_JSON_LINES == "application/x-ndjson"
    assert lbl.CONTENT_TYPE_PROTO_FIXED == "application/x-protobuf-fixed"
    assert lbl.CONTENT_TYPE_RECOVERY_LOG == "application/x-gazette-recoverylog"
    assert lbl.MESSAGE_TYPE == "app.gazette.dev/message-type"
    assert lbl.MESSAGE_SUB_TYPE == "app.gazette.dev/message-subtype"
    assert lbl.TAG == "app.gazette.dev/tag"
    assert lbl.MANAGED_BY == "app.gazette.dev/managed-by"
    assert lbl.INSTANCE == "app.gazette.dev/instance"
    assert lbl.REGION == "app.gazette.dev/region"
    assert (lbl.META_NAME, lbl.META_PREFIX) == ("name", "prefix")
    assert (
        frozenset(
            {
                "content-type",
                "app.gazette.dev/instance",
                "app.gazette.dev/managed-by",
                "app.gazette.dev/message-subtype",
                "app.gazette.dev/message-type",
                "app.gazette.dev/region",
            }
        )
        == lbl.SINGLE_VALUE_LABELS
    )


def test_label_set_sorts_and_dedups() -> None:
    set_ = lbl.label_set(("bb", "2"), ("aa", "1"), ("bb", "1"), ("aa", "1"))
    assert pairs(set_) == [("aa", "1", False), ("bb", "1", False), ("bb", "2", False)]
    validate_label_set(set_)


def test_label_set_from_mapping() -> None:
    set_ = lbl.label_set_from_mapping({"zz": "1", "aa": ["3", "2"], "mm": []})
    assert pairs(set_) == [("aa", "2", False), ("aa", "3", False), ("zz", "1", False)]


@pytest.mark.parametrize(
    ("name", "values", "value"),
    [
        ("aa", [], None),
        ("aaa", ["222", "333", "444"], "222"),
        ("bbb", [], None),
        ("ccc", [""], ""),
        ("ddd", [], None),
        ("DDDD", ["111"], "111"),
        ("eee", [], None),
        ("ff", ["555"], "555"),
    ],
)
def test_values_of_and_value_of(name: str, values: list[str], value: str | None) -> None:
    set_ = pb.LabelSet(
        labels=[
            pb.Label(name="DDDD", value="111"),
            pb.Label(name="aaa", value="222"),
            pb.Label(name="aaa", value="333"),
            pb.Label(name="aaa", value="444"),
            pb.Label(name="ccc", value=""),
            pb.Label(name="ff", value="555"),
        ]
    )
    validate_label_set(set_)
    assert lbl.values_of(set_, name) == values
    assert lbl.value_of(set_, name) == value


def test_add_set_and_remove() -> None:
    set_ = pb.LabelSet()
    set_ = lbl.add_value(set_, "bb", "3")  # Insert into empty.
    set_ = lbl.add_value(set_, "aa", "0")  # Insert at beginning.
    set_ = lbl.add_value(set_, "bb", "1")  # Insert in middle.
    set_ = lbl.add_value(set_, "aa", "2")  # Insert in middle.
    set_ = lbl.add_value(set_, "bb", "3")  # Repeat.
    set_ = lbl.add_value(set_, "bb", "4")  # Insert at end.
    assert set_ == ls("aa", "0", "aa", "2", "bb", "1", "bb", "3", "bb", "4")

    set_ = lbl.set_value(set_, "bb", "5")  # Replace at end.
    set_ = lbl.set_value(set_, "cc", "6")  # Insert at end.
    set_ = lbl.set_value(set_, "00", "6")  # Insert at beginning.
    assert set_ == ls("00", "6", "aa", "0", "aa", "2", "bb", "5", "cc", "6")

    set_ = lbl.set_value(set_, "00", "7")  # Replace at beginning.
    set_ = lbl.set_value(set_, "aa", "8")  # Replace in middle.
    assert set_ == ls("00", "7", "aa", "8", "bb", "5", "cc", "6")

    set_ = lbl.add_value(set_, "bb", "9")
    set_ = lbl.add_value(set_, "00", "00")
    set_ = lbl.remove(set_, "bb")  # Remove from middle.
    set_ = lbl.remove(set_, "bb")  # Repeat: not found.
    assert set_ == ls("00", "00", "00", "7", "aa", "8", "cc", "6")

    set_ = lbl.remove(set_, "0")  # Not found (before beginning).
    set_ = lbl.remove(set_, "00")  # Remove from beginning.
    assert set_ == ls("aa", "8", "cc", "6")
    set_ = lbl.remove(set_, "dd")  # Not found (past end).
    set_ = lbl.remove(set_, "cc")  # Remove from end.
    assert set_ == ls("aa", "8")
    set_ = lbl.remove(set_, "aa")
    assert set_ == pb.LabelSet()


def test_mutations_return_new_sets() -> None:
    original = ls("aa", "1", "bb", "2")
    snapshot = pb.LabelSet()
    snapshot.CopyFrom(original)
    lbl.add_value(original, "cc", "3")
    lbl.set_value(original, "aa", "9")
    lbl.remove(original, "bb")
    lbl.union(original, ls("zz", "1"))
    assert original == snapshot


def test_prefix_suffix_sets_prefix_flag() -> None:
    set_ = lbl.add_value(pb.LabelSet(), "name:prefix", "a/b/")
    set_ = lbl.add_value(set_, "name", "a/c")
    assert pairs(set_) == [("name", "a/b/", True), ("name", "a/c", False)]
    assert lbl.add_value(set_, "name:prefix", "a/b/") == set_  # An exact duplicate.
    set_ = lbl.set_value(set_, "name:prefix", "x/")
    assert pairs(set_) == [("name", "x/", True)]
    assert lbl.split_prefix("foo:prefix") == ("foo", True)
    assert lbl.split_prefix("foo") == ("foo", False)


def test_union() -> None:
    got = lbl.union(
        ls("bbb", "val-1", "bbb", "val-2", "ccc", "val-3"),
        ls("aaa", "val-4", "aaa", "val-5", "bbb", "val-6", "ddd", "val-7"),
    )
    assert got == ls(
        "aaa", "val-4", "aaa", "val-5", "bbb", "val-1", "bbb", "val-2", "ccc", "val-3", "ddd", "val-7"
    )  # fmt: skip


LHS = (
    "aaa", "val",  # Matched.
    "bbb", "val-1",  # Differs on value.
    "ccc", "val-1",
    "ccc", "val-2",  # Value only on LHS.
    "ddd", "val-1",  # Matched.
    "ddd", "val-2",  # Matched.
    "eee", "val",  # Only on LHS.
    "ggg", "val",  # Matched.
)  # fmt: skip
RHS = (
    "aaa", "val",
    "bbb", "val-2",
    "ccc", "val-1",
    "ddd", "val-1",
    "ddd", "val-2",
    "fff", "val",  # Only on RHS.
    "ggg", "val",
)  # fmt: skip


def test_intersect() -> None:
    assert lbl.intersect(ls(*LHS), ls(*RHS)) == ls("aaa", "val", "ddd", "val-1", "ddd", "val-2", "ggg", "val")


def test_subtract() -> None:
    assert lbl.subtract(ls(*LHS), ls(*RHS)) == ls(
        "bbb", "val-1", "ccc", "val-1", "ccc", "val-2", "eee", "val"
    )  # fmt: skip


SELECTOR = pb.LabelSelector(
    include=ls("inc-1", "a-val", "inc-2", "", "inc-3", "val-1", "inc-3", "val-2"),
    exclude=ls("exc-1", "", "exc-2", "val-3", "exc-2", "val-4"),
)


@pytest.mark.parametrize(
    ("set_", "expect"),
    [
        (ls(), False),
        (ls("foo", "bar", "inc-1", "a-val", "inc-2", "any", "inc-3", "val-1"), True),
        (ls("foo", "bar", "inc-1", "a-val", "inc-2", "foo", "inc-3", "val-1"), True),  # Any inc-2 value.
        (ls("foo", "bar", "inc-1", "a-val", "inc-2", "any", "inc-3", "val-2"), True),  # Alternate inc-3.
        (ls("foo", "bar", "inc-1", "bad-val", "inc-2", "any", "inc-3", "val-1"), False),  # inc-1 unmatched.
        (ls("foo", "bar", "inc-1", "a-val", "inc-3", "val-1"), False),  # inc-2 missing.
        (ls("foo", "bar", "inc-1", "a-val", "inc-2", "any", "inc-3", "val-other"), False),  # inc-3 unmatched.
        (ls("exc-1", "any", "foo", "bar", "inc-1", "a-val", "inc-2", "any", "inc-3", "val-1"), False),
        (ls("exc-2", "val-4", "foo", "bar", "inc-1", "a-val", "inc-2", "any", "inc-3", "val-1"), False),
        (ls("exc-2", "val-ok", "foo", "bar", "inc-1", "a-val", "inc-2", "any", "inc-3", "val-1"), True),
    ],
)
def test_matches(set_: pb.LabelSet, expect: bool) -> None:
    assert lbl.matches(SELECTOR, set_) is expect


def test_matches_exclude_only_selector() -> None:
    sel = pb.LabelSelector(exclude=SELECTOR.exclude)
    assert lbl.matches(sel, ls())
    assert lbl.matches(sel, ls("foo", "bar"))
    assert lbl.matches(sel, ls("exc-2", "val-ok", "foo", "bar"))
    assert not lbl.matches(sel, ls("exc-2", "val-3", "foo", "bar"))
    assert not lbl.matches(sel, ls("exc-1", "any", "foo", "bar"))
    assert lbl.matches(pb.LabelSelector(), ls("anything", "x"))


def test_matches_multi_valued_set() -> None:
    sel = pb.LabelSelector(include=ls("tag", "b"))
    assert lbl.matches(sel, ls("tag", "a", "tag", "b"))
    assert not lbl.matches(pb.LabelSelector(exclude=ls("tag", "a", "tag", "z")), ls("tag", "a", "tag", "b"))


def test_matches_prefix_labels() -> None:
    include = lbl.add_value(pb.LabelSet(), "name:prefix", "examples/")
    sel = pb.LabelSelector(include=include)
    assert lbl.matches(sel, ls("name", "examples/a"))
    assert lbl.matches(sel, ls("name", "examples/"))
    assert not lbl.matches(sel, ls("name", "example"))
    assert not lbl.matches(sel, ls("name", "other/examples/a"))
    assert not lbl.matches(sel, ls())

    # Mixed with an exact value in one group: either may match.
    mixed = pb.LabelSelector(include=lbl.add_value(include, "name", "zzz/exact"))
    assert lbl.matches(mixed, ls("name", "zzz/exact"))
    assert lbl.matches(mixed, ls("name", "examples/b"))
    assert not lbl.matches(mixed, ls("name", "zzz/exact/sub"))

    exclude = pb.LabelSelector(exclude=include)
    assert not lbl.matches(exclude, ls("name", "examples/a"))
    assert lbl.matches(exclude, ls("name", "other"))


def test_journal_label_set_adds_name() -> None:
    spec = pb.JournalSpec(name="a/journal", labels=ls("aaa", "1", "zzz", "2"))
    assert lbl.journal_label_set(spec) == ls("aaa", "1", "name", "a/journal", "zzz", "2")
    assert lbl.matches(pb.LabelSelector(include=ls("name", "a/journal")), lbl.journal_label_set(spec))
    assert spec.labels == ls("aaa", "1", "zzz", "2")


def test_rewrite_prefix_meta_label() -> None:
    sel = pb.LabelSelector(
        include=ls("aaa", "1", "prefix", "examples/", "prefix", "other/"),
        exclude=ls("prefix", "examples/private/"),
    )
    out = lbl.rewrite_prefix_meta_label(sel)
    assert pairs(out.include) == [
        ("aaa", "1", False),
        ("name", "examples/", True),
        ("name", "other/", True),
    ]
    assert pairs(out.exclude) == [("name", "examples/private/", True)]
    assert sel.include == ls("aaa", "1", "prefix", "examples/", "prefix", "other/")  # Unchanged.

    def journal(name: str) -> pb.LabelSet:
        return lbl.journal_label_set(pb.JournalSpec(name=name, labels=ls("aaa", "1")))

    assert lbl.matches(out, journal("examples/a"))
    assert lbl.matches(out, journal("other/b"))
    assert not lbl.matches(out, journal("examples/private/a"))
    assert not lbl.matches(out, journal("elsewhere/a"))
