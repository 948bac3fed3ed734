"""Go-compatible lexical path and URL rules: ports of Go's `path.Clean` and `net/url.Parse`.

Journal names, fragment stores and endpoints are validated by Gazette with these Go
functions, so Python equivalents (`os.path.normpath`, `urllib.parse`) would accept or reject
different inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.errors import GazetteError


def journal_of(name: str) -> str:
    """The journal a name refers to, dropping any `;meta` suffix (Gazette's `Journal.StripMeta`)."""
    return name.split(";", 1)[0]


def go_clean(path: str) -> str:
    """Return the shortest path equivalent to `path` by purely lexical processing (Go `path.Clean`).

    Repeated slashes collapse, `.` elements vanish, `x/..` pairs cancel, `..` at the root of a
    rooted path is dropped, a leading `..` of a relative path is kept, and "" becomes ".".
    """
    if path == "":
        return "."
    rooted = path[0] == "/"
    n = len(path)
    out: list[str] = []
    r = 0
    dotdot = 0  # Index in `out` below which `..` may not backtrack.
    if rooted:
        out.append("/")
        r, dotdot = 1, 1

    while r < n:
        if path[r] == "/":
            r += 1  # Empty path element.
        elif path[r] == "." and (r + 1 == n or path[r + 1] == "/"):
            r += 1  # `.` element.
        elif path[r] == "." and path[r + 1] == "." and (r + 2 == n or path[r + 2] == "/"):
            r += 2  # `..` element: remove up to the last `/`.
            if len(out) > dotdot:
                w = len(out) - 1
                while w > dotdot and out[w] != "/":
                    w -= 1
                del out[w:]
            elif not rooted:
                if out:
                    out.append("/")
                out.extend("..")
                dotdot = len(out)
        else:
            # A real path element: add a separator if needed, then copy it.
            if (rooted and len(out) != 1) or (not rooted and len(out) != 0):
                out.append("/")
            while r < n and path[r] != "/":
                out.append(path[r])
                r += 1

    if not out:
        return "."
    return "".join(out)


class URLError(GazetteError, ValueError):
    """A URL that Go's `net/url.Parse` rejects; str() matches Go's error text."""


@dataclass(frozen=True)
class GoURL:
    """The components of a URL as Go's `net/url.Parse` splits them (Path etc. unescaped)."""

    scheme: str = ""
    opaque: str = ""
    user: str | None = None
    host: str = ""
    path: str = ""
    raw_query: str = ""
    fragment: str = ""

    def is_abs(self) -> bool:
        """Whether the URL has a scheme (Go `URL.IsAbs`)."""
        return self.scheme != ""


def parse_url(raw: str) -> GoURL:
    """Parse `raw` as Go's `url.Parse` does, raising URLError with Go's message on failure."""
    base, sep, frag = raw.partition("#")
    try:
        url = _parse(base)
    except _ParseError as err:
        raise URLError(f"parse {go_quote(base)}: {err.message}") from None
    if not sep:
        return url
    try:
        fragment = _unescape(frag, _Mode.FRAGMENT)
    except _ParseError as err:
        raise URLError(f"parse {go_quote(raw)}: {err.message}") from None
    return GoURL(url.scheme, url.opaque, url.user, url.host, url.path, url.raw_query, fragment)


def path_unescape(s: str) -> str:
    """`s` with its %-escapes decoded, as Go's `url.PathUnescape` (a `+` stays a `+`).

    Raises URLError with Go's text (`invalid URL escape "%zz"`) for a `%` that is not followed
    by two hex digits. Bytes that are not UTF-8 come back as surrogate escapes.
    """
    return _unescape_or_raise(s, _Mode.PATH)


def query_unescape(s: str) -> str:
    """A key or value of a query string decoded as Go's `url.QueryUnescape`: a `+` is a space.

    Raises URLError as path_unescape does.
    """
    return _unescape_or_raise(s, _Mode.QUERY)


def _unescape_or_raise(s: str, mode: str) -> str:
    try:
        return _unescape(s, mode)
    except _ParseError as err:
        raise URLError(err.message) from None


def go_quote(s: str) -> str:
    """Quote `s` as Go's `%q` / `strconv.Quote` does."""
    out = ['"']
    for ch in s:
        code = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch.isprintable():
            # Python's isprintable excludes exactly the runes Go's unicode.IsPrint does.
            out.append(ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif code < 0x80 or 0xD800 <= code <= 0xDFFF:
            # Surrogates stand for undecodable bytes, which Go prints as \x escapes.
            out.append(f"\\x{code & 0xFF:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


class _ParseError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _Mode:
    PATH = "path"
    HOST = "host"
    USER = "user"
    FRAGMENT = "fragment"
    QUERY = "query"  # A query component: `+` is a space.


def _parse(raw: str) -> GoURL:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        raise _ParseError("net/url: invalid control character in URL")
    if raw == "*":
        return GoURL(path="*")

    scheme, rest = _get_scheme(raw)
    scheme = scheme.lower()

    if rest.endswith("?") and rest.count("?") == 1:
        rest, raw_query = rest[:-1], ""
    else:
        rest, _, raw_query = rest.partition("?")

    if not rest.startswith("/"):
        if scheme:
            # Rootless paths are opaque, per RFC 3986.
            return GoURL(scheme=scheme, opaque=rest, raw_query=raw_query)
        if ":" in rest.partition("/")[0]:
            raise _ParseError("first path segment in URL cannot contain colon")

    user: str | None = None
    host = ""
    if (scheme or not rest.startswith("///")) and rest.startswith("//"):
        authority, slash, tail = rest[2:].partition("/")
        rest = slash + tail
        user, host = _parse_authority(authority)

    return GoURL(scheme=scheme, user=user, host=host, path=_unescape(rest, _Mode.PATH), raw_query=raw_query)


def _get_scheme(raw: str) -> tuple[str, str]:
    for i, c in enumerate(raw):
        if "a" <= c <= "z" or "A" <= c <= "Z":
            continue
        if "0" <= c <= "9" or c in "+-.":
            if i == 0:
                return "", raw
            continue
        if c == ":":
            if i == 0:
                raise _ParseError("missing protocol scheme")
            return raw[:i], raw[i + 1 :]
        return "", raw  # An invalid character: there is no scheme.
    return "", raw


def _parse_authority(authority: str) -> tuple[str | None, str]:
    at = authority.rfind("@")
    host = _parse_host(authority[at + 1 :])
    if at < 0:
        return None, host
    userinfo = authority[:at]
    if any(not (c.isascii() and c.isalnum()) and c not in "-._:~!$&'()*+,;=%@" for c in userinfo):
        raise _ParseError("net/url: invalid userinfo")
    return _unescape(userinfo, _Mode.USER), host


def _parse_host(host: str) -> str:
    if host.startswith("["):
        end = host.rfind("]")
        if end < 0:
            raise _ParseError("missing ']' in host")
        colon_port = host[end + 1 :]
        if not _valid_optional_port(colon_port):
            raise _ParseError(f"invalid port {go_quote(colon_port)} after host")
    else:
        i = host.rfind(":")
        if i != -1 and not _valid_optional_port(host[i:]):
            raise _ParseError(f"invalid port {go_quote(host[i:])} after host")
    return _unescape(host, _Mode.HOST)


def _valid_optional_port(port: str) -> bool:
    if port == "":
        return True
    return port[0] == ":" and all("0" <= c <= "9" for c in port[1:])


_HEX = "0123456789abcdefABCDEF"
# ASCII characters that Go's shouldEscape leaves unescaped within a host.
_HOST_OK = frozenset("!$&'()*+,;=:[]<>\"-_.~")


def _unescape(s: str, mode: str) -> str:
    i = 0
    n = len(s)
    while i < n:
        c = s[i]
        if c == "%":
            if i + 2 >= n or s[i + 1] not in _HEX or s[i + 2] not in _HEX:
                raise _ParseError(f"invalid URL escape {go_quote(s[i : i + 3])}")
            # Hosts may %-encode only non-ASCII bytes, or `%` itself (RFC 6874 zones).
            if mode == _Mode.HOST and int(s[i + 1], 16) < 8 and s[i : i + 3] != "%25":
                raise _ParseError(f"invalid URL escape {go_quote(s[i : i + 3])}")
            i += 3
            continue
        if mode == _Mode.HOST and ord(c) < 0x80 and not (c.isalnum() or c in _HOST_OK):
            raise _ParseError(f"invalid character {go_quote(c)} in host name")
        i += 1
    if mode == _Mode.QUERY:
        s = s.replace("+", " ")
    if "%" not in s:
        return s
    return _decode_percents(s)


def _decode_percents(s: str) -> str:
    out = bytearray()
    i = 0
    while i < len(s):
        if s[i] == "%":
            out.append(int(s[i + 1 : i + 3], 16))
            i += 3
        else:
            out.extend(s[i].encode("utf-8", "surrogatepass"))
            i += 1
    # Go strings may hold any bytes; keep undecodable ones recoverable.
    return out.decode("utf-8", "surrogateescape")
