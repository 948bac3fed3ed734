"""What a request asks: its target's path and query, decoded as Go's net/http and net/url do.

Go's server rejects a malformed target before any handler runs (BadTarget); a bad query is the
route's 400 (BadRequest), with `url.ParseQuery`'s error text. A path that is not clean is
redirected as Go's http.ServeMux does (`clean_redirect`, `redirect_body`).
"""

from __future__ import annotations

import html
import string

from broker.errors import GatewayError
from broker.protocol.paths import URLError, go_clean, parse_url, path_unescape, query_unescape


class BadRequest(GatewayError):
    """A request answered with 400 and this error text."""


class BadTarget(GatewayError):
    """A request target that Go's net/http rejects before any handler runs."""


def split_target(target: str) -> tuple[str, str]:
    """Split a request target into its percent-decoded path and its raw query."""
    if target.startswith("/"):
        raw_path, _, query = target.partition("?")
        try:
            return path_unescape(raw_path), query
        except URLError:
            raise BadTarget(target) from None
    try:
        url = parse_url(target)  # The absolute form, as sent to proxies.
    except URLError:
        raise BadTarget(target) from None
    if not url.scheme or not url.host:
        raise BadTarget(target)
    return url.path or "/", url.raw_query


_PATH_SAFE = frozenset((string.ascii_letters + string.digits + "-_.~$&+,/:;=@").encode())
"""Bytes Go's net/url leaves unescaped in a path (`shouldEscape` with encodePath)."""
_VALID_ENCODED = _PATH_SAFE | frozenset(b"!'()*[]%")
"""Bytes of a raw path that Go's net/url keeps as sent (`validEncoded`)."""


def clean_redirect(method: str, target: str) -> str | None:
    """Where Go's http.ServeMux sends a request whose path is not clean (`/a//b`, `/a/./b`, `/a/../b`):
    the cleaned path, with the query, which it answers with a 307 (Go 1.25's `findHandler`); None
    for a clean path. `target` is a request target `split_target` took."""
    if method == "CONNECT" or not target.startswith("/"):
        return None  # CONNECT is not cleaned; the absolute form is left alone here.
    raw_path, _, query = target.partition("?")
    escaped = raw_path
    if not all(ord(c) < 0x80 and ord(c) in _VALID_ENCODED for c in raw_path):
        escaped = _escape_path(path_unescape(raw_path))  # Go's URL.EscapedPath re-escapes it.
    cleaned = _clean_path(escaped)
    if cleaned == escaped:
        return None
    # The mux builds the URL from the cleaned *escaped* path, so URL.String() escapes it again.
    return _escape_path(cleaned) + ("?" + query if query else "")


def redirect_body(method: str, location: str, status_text: str) -> tuple[list[tuple[str, str]], bytes]:
    """The headers (besides Location) and body of Go's `http.Redirect`: a GET gets a short HTML
    link, a HEAD its Content-Type only, any other method neither."""
    if method not in ("GET", "HEAD"):
        return [], b""
    href = html.escape(location).replace("&#x27;", "&#39;").replace("&quot;", "&#34;")  # Go's htmlEscape.
    body = f'<a href="{href}">{status_text}</a>.\n\n'
    return [("Content-Type", "text/html; charset=utf-8")], body.encode() if method == "GET" else b""


def _clean_path(p: str) -> str:
    """Go's ServeMux `cleanPath`: `path.Clean` of a rooted path, keeping a trailing slash."""
    if not p:
        return "/"
    if p[0] != "/":
        p = "/" + p
    cleaned = go_clean(p)
    if p.endswith("/") and cleaned != "/":
        cleaned += "/"
    return cleaned


def _escape_path(path: str) -> str:
    """`path` escaped as Go's net/url escapes a URL's path."""
    return "".join(chr(b) if b in _PATH_SAFE else f"%{b:02X}" for b in path.encode("utf-8", "surrogateescape"))


def parse_query(raw: str) -> dict[str, list[str]]:
    """Values by key of a raw query, as Go's `url.ParseQuery` (raising its first error)."""
    values: dict[str, list[str]] = {}
    error: str | None = None
    for part in raw.split("&"):
        if ";" in part:
            error = "invalid semicolon separator in query"
            continue
        if not part:
            continue
        raw_key, _, raw_value = part.partition("=")
        try:
            key = query_unescape(raw_key)
            value = query_unescape(raw_value)
        except URLError as err:
            error = error or str(err)
            continue
        values.setdefault(key, []).append(value)
    if error is not None:
        raise BadRequest(error)
    return values
