"""A gRPC error as text, in grpc-go's words: how the HTTP gateway reports a failed call (as
Gazette's gateway does, e.g. `rpc error: code = Unavailable desc = ...`), and how the client's
HTTP paths take that text back to its code."""

from __future__ import annotations

import re

import grpc


def _go_name(code: grpc.StatusCode) -> str:
    if code is grpc.StatusCode.OK:
        return "OK"
    if code is grpc.StatusCode.CANCELLED:
        return "Canceled"
    return "".join(part.capitalize() for part in code.name.split("_"))


_GO_NAMES = {code: _go_name(code) for code in grpc.StatusCode}
_CODES = {name: code for code, name in _GO_NAMES.items()}
_TEXT = re.compile(r"rpc error: code = (\w+) desc = (.*)", re.DOTALL)


def rpc_error_text(code: grpc.StatusCode, details: str) -> str:
    """`code` and `details` as grpc-go formats a failed call's error."""
    return f"rpc error: code = {_GO_NAMES[code]} desc = {details}"


def parse_rpc_error_text(text: str) -> tuple[grpc.StatusCode, str] | None:
    """The code (UNKNOWN for a name grpc-go does not use) and details of `rpc_error_text`'s text,
    or None for any other text."""
    match = _TEXT.fullmatch(text)
    if match is None:
        return None
    return _CODES.get(match.group(1), grpc.StatusCode.UNKNOWN), match.group(2)


__all__ = ["parse_rpc_error_text", "rpc_error_text"]
