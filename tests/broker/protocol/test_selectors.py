"""Selector string grammar, errors and canonical form, following Gazette's TestSelectorParsingCases."""

import pytest

from broker.protocol import labels as lbl
from broker.protocol import pb
from broker.protocol.selectors import SelectorError, format_selector, parse_selector
from broker.protocol.validation import ValidationError


def ls(*nv: str) -> pb.LabelSet:
    """A LabelSet from alternating names and values, as Go's MustLabelSet."""
    return lbl.label_set(*zip(nv[::2], nv[1::2], strict=True))


def sel(include: pb.LabelSet | None = None, exclude: pb.LabelSet | None = None) -> pb.LabelSelector:
    return pb.LabelSelector(include=include or pb.LabelSet(), exclude=exclude or pb.LabelSet())


GO_PARSE_CASES = [
    ("foo = bar", sel(include=ls("foo", "bar"))),
    ("foo != bar", sel(exclude=ls("foo", "bar"))),
    ("foo ", sel(include=ls("foo", ""))),
    (" !foo", sel(exclude=ls("foo", ""))),
    (" foo in (bing, baz,bar)", sel(include=ls("foo", "bar", "foo", "baz", "foo", "bing"))),
    (" foo not in ( pear, apple )", sel(exclude=ls("foo", "apple", "foo", "pear"))),
    (
        "foo==bar, baz !=bing ,apple in (fruit, banana)",
        sel(include=ls("apple", "banana", "apple", "fruit", "foo", "bar"), exclude=ls("baz", "bing")),
    ),
    (
        "!foo,baz,bing not in (thing-one, thing-2),!bar,",
        sel(
            include=ls("baz", ""),
            exclude=ls("bar", "", "bing", "thing-2", "bing", "thing-one", "foo", ""),
        ),
    ),
    # Label values may include '='.
    (
        "foo = ba=ar, baz=bi=ngo,exc!=who=ops",
        sel(include=ls("foo", "ba=ar", "baz", "bi=ngo"), exclude=ls("exc", "who=ops")),
    ),
    (
        "foo in (bi=ng,ba=ar), exc notin (who=ops,oth=er)",
        sel(include=ls("foo", "bi=ng", "foo", "ba=ar"), exclude=ls("exc", "who=ops", "exc", "oth=er")),
    ),
    # Further spacing and operator forms.
    ("foo=bar", sel(include=ls("foo", "bar"))),
    ("foo =bar", sel(include=ls("foo", "bar"))),
    ("foo== bar", sel(include=ls("foo", "bar"))),
    ("foo!=bar", sel(exclude=ls("foo", "bar"))),
    ("foo notin (a,b)", sel(exclude=ls("foo", "a", "foo", "b"))),
    ("foo in (a)", sel(include=ls("foo", "a"))),
    ("foo=", sel(include=ls("foo", ""))),  # An empty value is existence.
    ("foo = a%20b", sel(include=ls("foo", "a%20b"))),
    ("app.gazette.dev/message-type=Foo", sel(include=ls("app.gazette.dev/message-type", "Foo"))),
    ("foo=bar,foo=bar", sel(include=ls("foo", "bar"))),  # Duplicates collapse.
    ("", sel()),
    # Letters and numbers of any script.
    ("région=île-de-france,日本=東京", sel(include=ls("région", "île-de-france", "日本", "東京"))),
]


@pytest.mark.parametrize(("text", "expect"), GO_PARSE_CASES)
def test_parse(text: str, expect: pb.LabelSelector) -> None:
    assert parse_selector(text) == expect


@pytest.mark.parametrize(("text", "expect"), GO_PARSE_CASES)
def test_round_trip_through_format(text: str, expect: pb.LabelSelector) -> None:
    parsed = parse_selector(text)
    assert parse_selector(format_selector(parsed)) == parsed


def test_prefix_names() -> None:
    parsed = parse_selector("name:prefix=examples/, name:prefix in (a/,b/), !tag:prefix")
    assert [(x.name, x.value, x.prefix) for x in parsed.include.labels] == [
        ("name", "a/", True),
        ("name", "b/", True),
        ("name", "examples/", True),
    ]
    assert [(x.name, x.value, x.prefix) for x in parsed.exclude.labels] == [("tag", "", True)]
    assert format_selector(parsed) == "name:prefix in (a/,b/,examples/),!tag:prefix"
    assert parse_selector(format_selector(parsed)) == parsed


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("foo==bar, baz !=bing ,apple in (fruit, banana)", "apple in (banana,fruit),foo=bar,baz!=bing"),
        ("!foo,baz,bing not in (thing-one, thing-2),!bar,", "baz,!bar,bing notin (thing-2,thing-one),!foo"),
        ("foo in (b,a)", "foo in (a,b)"),
        ("!a-label", "!a-label"),
        ("foo != bar", "foo!=bar"),
        # Groups sort by printed name: `name-x` < `name:prefix` < `namex`.
        ("namex=1, name:prefix=a/, name-x=2, name=z", "name=z,name-x=2,name:prefix=a/,namex=1"),
        ("", ""),
    ],
)
def test_format_canonical(text: str, canonical: str) -> None:
    assert format_selector(parse_selector(text)) == canonical


def test_format_of_built_selector() -> None:
    built = sel(include=ls("aa", "", "bb", "1", "cc", "2", "cc", "1"), exclude=ls("dd", "", "ee", "3"))
    assert format_selector(built) == "aa,bb=1,cc in (1,2),!dd,ee!=3"
    assert format_selector(sel(exclude=ls("ee", "3", "ee", "4"))) == "ee notin (3,4)"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "apple,banana err in (bar)",
            'could not match "banana err in (bar)" to a label selector expression',
        ),
        (
            "apple,banana in (bar,err baz)",
            'parsing "banana in (bar,err baz)": could not match "err baz" to a label selector set expression',
        ),
        ("ban=ana in (bar)", 'could not match "ban=ana in (bar)" to a label selector expression'),
        ("foo, foo in (bar)", "Include: Label has empty & non-empty values (index 1; label foo value bar)"),
        (
            "!foo, foo notin (bar)",
            "Exclude: Label has empty & non-empty values (index 1; label foo value bar)",
        ),
        ("a=b", 'could not match "a=b" to a label selector expression'),  # Names need 2+ characters.
        ("foo  = bar", 'could not match "foo  = bar" to a label selector expression'),  # Two spaces.
        ("foo = bar,,", 'could not match "," to a label selector expression'),
        ("foo:prefixx=1", 'could not match "foo:prefixx=1" to a label selector expression'),
        ("foo:bar=1", 'could not match "foo:bar=1" to a label selector expression'),
        ("foo=bar\n", 'could not match "foo=bar\\n" to a label selector expression'),
        ("foo=a b", 'could not match "foo=a b" to a label selector expression'),
        ("foo in ()", 'could not match "foo in ()" to a label selector expression'),
        ("x" * 65, "Include.Labels[0].Name: invalid length (65; expected 2 <= length <= 64)"),
    ],
)
def test_parse_errors(text: str, message: str) -> None:
    with pytest.raises(SelectorError) as info:
        parse_selector(text)
    assert str(info.value) == message
    assert isinstance(info.value, ValidationError)
    assert isinstance(info.value, ValueError)
