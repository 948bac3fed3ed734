"""Go `path.Clean`, `net/url.Parse` and `%q` ports, checked against Go's own test tables."""

import pytest

from broker.protocol.paths import GoURL, URLError, go_clean, go_quote, parse_url

# Go's path_test.go `cleantests`.
GO_CLEAN_CASES = [
    # Already clean.
    ("", "."),
    ("abc", "abc"),
    ("abc/def", "abc/def"),
    ("a/b/c", "a/b/c"),
    (".", "."),
    ("..", ".."),
    ("../..", "../.."),
    ("../../abc", "../../abc"),
    ("/abc", "/abc"),
    ("/", "/"),
    # Remove trailing slash.
    ("abc/", "abc"),
    ("abc/def/", "abc/def"),
    ("a/b/c/", "a/b/c"),
    ("./", "."),
    ("../", ".."),
    ("../../", "../.."),
    ("/abc/", "/abc"),
    # Remove doubled slash.
    ("abc//def//ghi", "abc/def/ghi"),
    ("//abc", "/abc"),
    ("///abc", "/abc"),
    ("//abc//", "/abc"),
    ("abc//", "abc"),
    # Remove . elements.
    ("abc/./def", "abc/def"),
    ("/./abc/def", "/abc/def"),
    ("abc/.", "abc"),
    # Remove .. elements.
    ("abc/def/ghi/../jkl", "abc/def/jkl"),
    ("abc/def/../ghi/../jkl", "abc/jkl"),
    ("abc/def/..", "abc"),
    ("abc/def/../..", "."),
    ("/abc/def/../..", "/"),
    ("abc/def/../../..", ".."),
    ("/abc/def/../../..", "/"),
    ("abc/def/../../../ghi/jkl/../../../mno", "../../mno"),
    # Combinations.
    ("abc/./../def", "def"),
    ("abc//./../def", "def"),
    ("abc/../../././../def", "../../def"),
]


@pytest.mark.parametrize(("path", "expect"), GO_CLEAN_CASES)
def test_go_clean_matches_go_table(path: str, expect: str) -> None:
    assert go_clean(path) == expect


@pytest.mark.parametrize(("path", "expect"), GO_CLEAN_CASES)
def test_go_clean_is_idempotent(path: str, expect: str) -> None:
    assert go_clean(expect) == expect


def test_go_clean_differs_from_normpath_where_go_does() -> None:
    assert go_clean("../x") == "../x"  # A leading `..` is kept, so `../x` is a clean journal name.
    assert go_clean("//abc") == "/abc"  # os.path.normpath keeps a POSIX double slash.
    assert go_clean("a/b/../../../c") == "../c"
    assert go_clean("/../a") == "/a"
    assert go_clean("a=b/c%20d") == "a=b/c%20d"


@pytest.mark.parametrize(
    ("raw", "expect"),
    [
        (
            "s3://my-bucket/sub/path/?query",
            GoURL(scheme="s3", host="my-bucket", path="/sub/path/", raw_query="query"),
        ),
        ("file:///mnt/path/", GoURL(scheme="file", path="/mnt/path/")),
        ("HTTP://Host:8080/p#frag", GoURL(scheme="http", host="Host:8080", path="/p", fragment="frag")),
        ("http://user:pw@host/", GoURL(scheme="http", user="user:pw", host="host", path="/")),
        ("unix://localhost/tmp/sock", GoURL(scheme="unix", host="localhost", path="/tmp/sock")),
        ("s3:bucket/", GoURL(scheme="s3", opaque="bucket/")),
        ("/baz/bing/", GoURL(path="/baz/bing/")),
        ("invalid", GoURL(path="invalid")),
        ("gs:///baz/bing/", GoURL(scheme="gs", path="/baz/bing/")),
        ("http://h/a%20b?x", GoURL(scheme="http", host="h", path="/a b", raw_query="x")),
        ("http://[::1]:80/", GoURL(scheme="http", host="[::1]:80", path="/")),
        ("", GoURL()),
        ("*", GoURL(path="*")),
    ],
)
def test_parse_url_components(raw: str, expect: GoURL) -> None:
    assert parse_url(raw) == expect


def test_parse_url_is_abs() -> None:
    assert parse_url("http://foo").is_abs()
    assert not parse_url("/baz/bing").is_abs()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (":garbage: :garbage:", 'parse ":garbage: :garbage:": missing protocol scheme'),
        (":/bad/url", 'parse ":/bad/url": missing protocol scheme'),
        (":gar: :bage:", 'parse ":gar: :bage:": missing protocol scheme'),
        ("http://h:x/", 'parse "http://h:x/": invalid port ":x" after host'),
        ("http://h%zz/", 'parse "http://h%zz/": invalid URL escape "%zz"'),
        ("http://%41/", 'parse "http://%41/": invalid URL escape "%41"'),
        ("http://a b/", 'parse "http://a b/": invalid character " " in host name'),
        ("http://h/%", 'parse "http://h/%": invalid URL escape "%"'),
        ("http://h/\n", 'parse "http://h/\\n": net/url: invalid control character in URL'),
        ("a:b/c", None),  # A scheme "a" with an opaque part: valid.
        ("1a:b/c", 'parse "1a:b/c": first path segment in URL cannot contain colon'),
        ("http://[::1/", "parse \"http://[::1/\": missing ']' in host"),
        ("http://h/#%zz", 'parse "http://h/#%zz": invalid URL escape "%zz"'),
        ("http://us er@h/", 'parse "http://us er@h/": net/url: invalid userinfo'),
    ],
)
def test_parse_url_errors(raw: str, message: str | None) -> None:
    if message is None:
        parse_url(raw)
        return
    with pytest.raises(URLError) as info:
        parse_url(raw)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("s", "quoted"),
    [
        ("plain", '"plain"'),
        ('say "hi"\\', '"say \\"hi\\"\\\\"'),
        ("tab\there\n", '"tab\\there\\n"'),
        ("\x00\x7f", '"\\x00\\x7f"'),
        ("été", '"été"'),
        ("\u200b", '"\\u200b"'),
        ("\U000e0001", '"\\U000e0001"'),
    ],
)
def test_go_quote(s: str, quoted: str) -> None:
    assert go_quote(s) == quoted
