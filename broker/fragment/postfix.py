"""The Go text/template subset that `JournalSpec.fragment.path_postfix_template` needs (section 5.3).

Template data is Gazette's `struct{ Spool; *JournalSpec }`: `.Spool.*`, `.JournalSpec.*` and their promoted
fields, with field chains, time.Time methods and Go layouts, `printf`, pipelines, trim markers and comments.
"""

from __future__ import annotations

import calendar
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from google.protobuf.message import Message

from broker.fragment.errors import FragmentError
from broker.protocol import pb


class PostfixTemplateError(FragmentError):
    """A path postfix template that does not parse or execute; `action` is the failing `{{...}}` text."""

    def __init__(self, message: str, *, action: str = "", line: int = 0, column: int = 0, journal: str = "") -> None:
        super().__init__(message, journal=journal)
        self.action = action
        self.line = line
        self.column = column


@dataclass(frozen=True)
class SpoolData:
    """What `.Spool` exposes."""

    journal: str
    begin: int
    end: int
    first_append_time: float  # Unix seconds (UTC) of the spool's first commit.
    registers: pb.LabelSet


class _Fail(Exception):
    """A failure inside one action; the caller adds the action's text and position."""


class _Named(int):
    """A Go integer type with a String() method (time.Month, time.Weekday, time.Duration, enums)."""

    name: str

    def __new__(cls, value: int, name: str) -> _Named:
        self = super().__new__(cls, value)
        self.name = name
        return self


@dataclass(frozen=True)
class _Lit:
    value: object


@dataclass(frozen=True)
class _Chain:
    names: tuple[str, ...]  # Field and method names from the template data; () is `.` or `$`.


@dataclass(frozen=True)
class _Cmd:
    head: _Lit | _Chain | None  # None is the `printf` function.
    args: tuple[_Lit | _Chain, ...]


@dataclass(frozen=True)
class _Action:
    text: str
    line: int
    column: int
    pipeline: tuple[_Cmd, ...]


@dataclass(frozen=True)
class _Data:
    spool: SpoolData
    spec: pb.JournalSpec


_WS = " \t\r\n"
_WS_CHARS = frozenset(_WS)  # Sets, so that "" (past the end of a string) is never a member.
_DIGITS, _LOWER = frozenset("0123456789"), frozenset("abcdefghijklmnopqrstuvwxyz")
_TOKEN = re.compile(
    r"""(?P<space>\s+) | (?P<str>"(?:[^"\\\n]|\\.)*") | (?P<raw>`[^`]*`) | (?P<chain>\$?(?:\.[^\W\d]\w*)+)
    | (?P<var>\$\w*) | (?P<dot>\.) | (?P<num>[-+]?\d[\w.]*) | (?P<ident>[^\W\d]\w*) | (?P<pipe>\|) | (?P<bad>.)""",
    re.X | re.S,
)
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|.)", re.S)
_SIMPLE_ESCAPES = dict(zip('abfnrtv\\"', '\a\b\f\n\r\t\v\\"', strict=True))
_KEYWORDS = frozenset({"if", "else", "end", "range", "with", "define", "template", "block", "break", "continue"})
_VERB = re.compile(r"%([-+# 0]*)(\d*)(?:\.(\d*))?(.?)", re.S)
_SPOOL_FIELDS = {"Journal", "Begin", "End", "FirstAppendTime", "Registers"}
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")  # fmt: skip
_DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_GO_TIME_STRING = "2006-01-02 15:04:05.999999999 -0700 MST"


def _layout_chunks(t: datetime) -> dict[str, str]:
    """Go's layout chunks rendered for UTC time `t`, in the order nextStdChunk tries those sharing a first letter."""
    month, day, h12, yday = _MONTHS[t.month - 1], _weekday(t).name, t.hour % 12 or 12, t.timetuple().tm_yday
    pm = "PM" if t.hour >= 12 else "AM"
    return {
        "January": month, "Jan": month[:3], "Monday": day, "Mon": day[:3], "MST": "UTC",
        "01": f"{t.month:02d}", "02": f"{t.day:02d}", "03": f"{h12:02d}", "04": f"{t.minute:02d}",
        "05": f"{t.second:02d}", "06": f"{t.year % 100:02d}", "002": f"{yday:03d}", "15": f"{t.hour:02d}",
        "1": str(t.month), "2006": f"{t.year:04d}", "2": str(t.day),
        "_2006": f"_{t.year:04d}",  # Go reads "_2006" as a literal "_" then the year.
        "_2": f"{t.day:2d}", "__2": f"{yday:3d}", "3": str(h12), "4": str(t.minute), "5": str(t.second),
        "PM": pm, "pm": pm.lower(),
        # A UTC time has a zero offset.
        "-070000": "+000000", "-07:00:00": "+00:00:00", "-0700": "+0000", "-07:00": "+00:00", "-07": "+00",
        "Z070000": "Z", "Z07:00:00": "Z", "Z0700": "Z", "Z07:00": "Z", "Z07": "Z",
    }  # fmt: skip


def _format_time(t: datetime, layout: str) -> str:
    """Go's time.Time.Format of a UTC time."""
    chunks, out, i = _layout_chunks(t), [], 0
    while i < len(layout):
        rest = layout[i:]
        if rest[0] in ".," and rest[1:2] in ("0", "9"):
            n = len(rest) - 1 - len(rest[1:].lstrip(rest[1]))
            if rest[1 + n : 2 + n] not in _DIGITS:  # Fractional seconds only if the run ends the number.
                digits = f"{t.microsecond * 1000:09d}"[:n]
                digits = digits.rstrip("0") if rest[1] == "9" else digits
                out.append(rest[0] + digits if digits else "")
                i += 1 + n
                continue
        # "Jan" and "Mon" followed by a lower-case letter are words, not chunks ("Janet", "Monthly").
        word = rest[:3] in ("Jan", "Mon") and rest[3:4] in _LOWER
        chunk = next((c for c in chunks if rest.startswith(c) and not (word and len(c) == 3)), "")
        out.append(chunks[chunk] if chunk else rest[0])
        i += len(chunk) or 1
    return "".join(out)


def _weekday(t: datetime) -> _Named:
    day = (t.weekday() + 1) % 7  # Go counts from Sunday, Python from Monday.
    return _Named(day, _DAYS[day])


def _unix(t: datetime) -> int:
    return calendar.timegm(t.utctimetuple())


_ONE_ARG = frozenset({"Format", "ValueOf", "ValuesOf"})  # All other methods take no arguments.
_METHODS: dict[type, dict[str, Callable[..., object]]] = {
    datetime: {
        "Format": _format_time, "String": lambda t: _format_time(t, _GO_TIME_STRING), "UTC": lambda t: t,
        "Unix": _unix, "UnixMilli": lambda t: _unix(t) * 1000 + t.microsecond // 1000,
        "UnixMicro": lambda t: _unix(t) * 10**6 + t.microsecond,
        "UnixNano": lambda t: _unix(t) * 10**9 + t.microsecond * 1000,
        "Year": lambda t: t.year, "Month": lambda t: _Named(t.month, _MONTHS[t.month - 1]), "Day": lambda t: t.day,
        "Hour": lambda t: t.hour, "Minute": lambda t: t.minute, "Second": lambda t: t.second,
        "Nanosecond": lambda t: t.microsecond * 1000, "YearDay": lambda t: t.timetuple().tm_yday,
        "Weekday": _weekday,
    },
    pb.LabelSet: {
        "ValueOf": lambda ls, name: next((label.value for label in ls.labels if label.name == name), ""),
        "ValuesOf": lambda ls, name: [label.value for label in ls.labels if label.name == name],
    },
}  # fmt: skip


def _go_duration(ns: int) -> str:
    """Go's time.Duration.String()."""
    sign, u = "-" if ns < 0 else "", abs(ns)

    def frac(v: int, scale: int) -> str:
        whole, part = divmod(v, scale)
        digits = f"{part:0{len(str(scale)) - 1}d}".rstrip("0") if scale > 1 else ""
        return f"{whole}.{digits}" if digits else str(whole)

    if u < 10**9:
        unit, scale = next((un, sc) for un, sc in (("ms", 10**6), ("µs", 10**3), ("ns", 1)) if u >= sc or sc == 1)
        return sign + frac(u, scale) + unit if u else "0s"
    hours, rem = divmod(u, 3600 * 10**9)
    minutes, rem = divmod(rem, 60 * 10**9)
    return sign + (f"{hours}h{minutes}m" if hours else f"{minutes}m" if minutes else "") + frac(rem, 10**9) + "s"


def _type_name(v: object) -> str:
    if isinstance(v, Message):
        return v.DESCRIPTOR.name
    names = {_Data: "template data", SpoolData: "Spool", datetime: "time.Time", str: "string", list: "slice"}
    return names.get(type(v), type(v).__name__)


def _proto_field(msg: Message, name: str) -> object:
    """Field `name` (its Go name) of `msg` as the Go value Gazette's struct holds; KeyError if there is none."""
    for fd in msg.DESCRIPTOR.fields:
        go_name = fd.camelcase_name[:1].upper() + fd.camelcase_name[1:]
        if isinstance(msg, pb.JournalSpec) and fd.name == "labels":
            go_name = "LabelSet"  # Gazette embeds the LabelSet (gogoproto.embed).
        if go_name != name:
            continue
        value, enum = getattr(msg, fd.name), fd.enum_type
        if isinstance(msg, pb.JournalSpec) and fd.name == "flags":
            enum = pb.JournalSpec.Flag.DESCRIPTOR  # A JournalSpec_Flag in Go.
        if fd.is_repeated and fd.message_type is not None:
            raise _Fail(f"field {name} (repeated {fd.message_type.name}) is not supported")
        if enum is not None:
            known = enum.values_by_number.get(value)
            return _Named(value, known.name if known else str(value))  # Go prints an unknown enum as its number.
        if fd.message_type is not None and fd.message_type.full_name == "google.protobuf.Duration":
            ns = value.seconds * 10**9 + value.nanos  # A time.Duration in Go (gogoproto.stdduration).
            return _Named(ns, _go_duration(ns))
        return list(value) if fd.is_repeated else value
    raise KeyError(name)


def _get(obj: object, name: str, args: tuple[object, ...]) -> object:
    """Evaluate `.name` on `obj` as Go does: a field, or a method called with `args`."""
    if isinstance(obj, _Data) and name not in ("Spool", "JournalSpec", "Fragment"):
        # Go promotes the fields of both embedded structs; `Fragment` is in both, so it is ambiguous.
        return _get(obj.spool if name in _SPOOL_FIELDS else obj.spec, name, args)
    if isinstance(obj, pb.JournalSpec) and name in ("Labels", "ValueOf", "ValuesOf"):
        return _get(obj.labels, name, args)  # Promoted from the embedded LabelSet.
    if method := _METHODS.get(type(obj), {}).get(name):
        want = 1 if name in _ONE_ARG else 0
        if len(args) != want:
            raise _Fail(f"wrong number of args for {name}: want {want} got {len(args)}")
        if args and not isinstance(args[0], str):
            raise _Fail(f"wrong type for value; expected string; got {_type_name(args[0])}")
        return method(obj, *args)
    try:
        if isinstance(obj, _Data) and name != "Fragment":
            value: object = obj.spool if name == "Spool" else obj.spec
        elif isinstance(obj, SpoolData) and name == "FirstAppendTime":
            value = datetime.fromtimestamp(obj.first_append_time, UTC)
        elif isinstance(obj, SpoolData) and name in _SPOOL_FIELDS:
            value = getattr(obj, name.lower())
        elif isinstance(obj, Message):
            value = _proto_field(obj, name)
        else:
            raise KeyError(name)
    except KeyError:
        raise _Fail(f"can't evaluate field {name} in type {_type_name(obj)}") from None
    if args:
        raise _Fail(f"{name} is a field, not a method, and takes no arguments")
    return value


def _go_str(v: object) -> str:
    """Print `v` as text/template does (fmt's %v, or String() where Go has one)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, _Named):
        return v.name
    if isinstance(v, int | str):
        return str(v)
    if isinstance(v, datetime):
        return _format_time(v, _GO_TIME_STRING)
    if isinstance(v, list):
        return "[" + " ".join(map(_go_str, v)) + "]"
    raise _Fail(f"can't print a value of type {_type_name(v)}")


def _printf(args: tuple[object, ...]) -> str:
    """Go's fmt.Sprintf for the verbs %d %s %v %x %X, with flags, width and precision."""
    if not args or not isinstance(args[0], str):
        raise _Fail("printf needs a format string as its first argument")
    fmt, rest = args[0], list(args[1:])

    def verb(m: re.Match[str]) -> str:
        flags, width, prec, v = m.groups()
        if v == "%":
            return "%"
        if not v or v not in "dsvxX":
            raise _Fail(f"printf verb {m.group()!r} is not supported")
        if not rest:
            raise _Fail(f"printf {fmt!r}: missing argument for {m.group()}")
        arg = rest.pop(0)
        if v in "svxX" and isinstance(arg, _Named | datetime):
            arg = _go_str(arg)  # Go formats a Stringer's String() under these verbs.
        is_int = isinstance(arg, int) and not isinstance(arg, bool)
        if v == "v":
            v, arg = ("d", arg) if is_int else ("s", _go_str(arg))
        if v in "dxX" and is_int:
            return f"%{flags}{width}{'' if prec is None else '.' + (prec or '0')}{v}" % arg
        if v in "xX" and isinstance(arg, str):
            text = arg.encode()[: None if prec is None else int(prec or 0)].hex()  # Precision counts bytes.
            text = text.upper() if v == "X" else text
        elif v == "s" and isinstance(arg, str):
            text = arg if prec is None else arg[: int(prec or 0)]
        else:
            raise _Fail(f"printf {m.group()!r} can't format a {_type_name(arg)}")
        w = int(width or 0)  # Go also zero-pads strings under the 0 flag; Python's % does not.
        return text.ljust(w) if "-" in flags else text.rjust(w, "0" if "0" in flags else " ")

    out = _VERB.sub(verb, fmt)
    if rest:
        raise _Fail(f"printf {fmt!r}: {len(rest)} extra argument(s)")
    return out


def _unquote(body: str) -> str:
    """Go's strconv.Unquote of a double-quoted string's body."""

    def one(m: re.Match[str]) -> str:
        e = m.group(1)
        if e in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[e]
        if len(e) > 1 and (code := int(e[1:], 16) if e[0] in "xuU" else int(e, 8)) <= 0x10FFFF:
            return chr(code)
        raise _Fail(f"invalid escape \\{e} in string")

    return _ESCAPE.sub(one, body)


def _operand(kind: str, text: str) -> _Lit | _Chain:
    if kind == "chain":
        return _Chain(tuple(text.lstrip("$").split(".")[1:]))
    if kind == "dot" or text == "$":
        return _Chain(())
    if kind in ("str", "raw"):
        return _Lit(_unquote(text[1:-1]) if kind == "str" else text[1:-1])
    if kind == "ident" and text in ("true", "false"):
        return _Lit(text == "true")
    if kind == "num":
        try:  # Go reads a leading 0 as octal; Python refuses it.
            return _Lit(int(text, 8) if re.fullmatch(r"[-+]?0[0-7_]+", text) else int(text, 0))
        except ValueError:
            raise _Fail(f"number {text} is not supported") from None
    if kind == "var":
        raise _Fail(f"variable {text} is not supported")
    if text in _KEYWORDS:
        raise _Fail(f"{{{{{text}}}}} actions are not supported")
    if kind == "ident":
        hint = "it must start a command" if text == "printf" else "only printf is"
        raise _Fail(f'function "{text}" is not supported here ({hint})')
    raise _Fail(f"unexpected {text!r} (not supported)")


def _parse_pipeline(body: str) -> tuple[_Cmd, ...]:
    commands: list[list[tuple[str, str]]] = [[]]
    for m in _TOKEN.finditer(body):
        if m.lastgroup == "pipe":
            commands.append([])
        elif m.lastgroup != "space":
            commands[-1].append((m.lastgroup or "", m.group()))
    pipeline = []
    for i, tokens in enumerate(commands):
        if not tokens:
            raise _Fail("missing value for command")
        kind, text = tokens[0]
        head = None if (kind, text) == ("ident", "printf") else _operand(kind, text)
        args = tuple(_operand(k, t) for k, t in tokens[1:])
        if isinstance(head, _Lit) and (args or i > 0):  # After a pipe, a command gets an argument.
            raise _Fail(f"can't give argument to non-function {text}")
        pipeline.append(_Cmd(head, args))
    return tuple(pipeline)


def _eval(arg: _Lit | _Chain, data: _Data, args: tuple[object, ...]) -> object:
    if isinstance(arg, _Lit):
        return arg.value
    if not arg.names and args:
        raise _Fail("can't give argument to non-function .")
    obj: object = data
    for i, name in enumerate(arg.names):
        obj = _get(obj, name, args if i == len(arg.names) - 1 else ())
    return obj


def _position(template: str, start: int) -> tuple[int, int]:
    """1-based line and column of index `start`."""
    return template.count("\n", 0, start) + 1, start - template.rfind("\n", 0, start)


def _error(detail: str, action: str, line: int, column: int, journal: str = "") -> PostfixTemplateError:
    message = f"template: postfix:{line}:{column}: at {action}: {detail}"
    return PostfixTemplateError(message, action=action, line=line, column=column, journal=journal)


def _right_delim(template: str, i: int) -> tuple[int, int, bool] | None:
    """(i, index after the delimiter, whether it trims) if `}}` or ` -}}` is at `i`."""
    if template[i : i + 1] in _WS_CHARS and template.startswith("-}}", i + 1):
        return i, i + 4, True
    return (i, i + 2, False) if template.startswith("}}", i) else None


def _action_end(template: str, start: int, body: int) -> tuple[int, int, bool]:
    """(end of the body, index after the closing delimiter, whether it trims) of the action at `start`."""
    pos = _position(template, start)
    if template.startswith("/*", body):  # Go sees a comment only right after `{{` or `{{- `.
        close = template.find("*/", body + 2)
        if close == -1:
            raise _error("unclosed comment", template[start:], *pos)
        if (end := _right_delim(template, close + 2)) is None:
            raise _error("comment ends before closing delimiter", template[start : close + 2], *pos)
        return end
    i = body
    while i < len(template):
        if (end := _right_delim(template, i)) is not None:
            return end
        if (quote := template[i]) in "\"'`":  # A `}}` inside a quoted string does not close the action.
            i += 1
            while i < len(template) and template[i] != quote:
                if quote != "`" and template[i] == "\n":
                    raise _error("unterminated quoted string", template[start:i], *pos)
                i += 2 if quote != "`" and template[i] == "\\" else 1
            if i >= len(template):
                raise _error("unterminated quoted string", template[start:], *pos)
        i += 1
    raise _error("unclosed action", template[start:], *pos)


class PostfixTemplate:
    """A parsed path postfix template."""

    def __init__(self, source: str, nodes: tuple[str | _Action, ...]) -> None:
        self.source = source
        self._nodes = nodes

    def render(self, spool: SpoolData, journal_spec: pb.JournalSpec) -> str:
        """Execute over `{Spool, JournalSpec}`; a PostfixTemplateError names the failing action."""
        data, out = _Data(spool, journal_spec), []
        for node in self._nodes:
            if isinstance(node, str):
                out.append(node)
                continue
            try:
                piped: tuple[object, ...] = ()
                for cmd in node.pipeline:  # Each command's result is the next one's final argument.
                    args = tuple(_eval(a, data, ()) for a in cmd.args) + piped
                    piped = (_printf(args) if cmd.head is None else _eval(cmd.head, data, args),)
                out.append(_go_str(piped[0]))
            # Python's own errors here come from the data (a time out of range) or a huge printf width.
            except (_Fail, ValueError, OverflowError, OSError) as exc:
                raise _error(str(exc), node.text, node.line, node.column, spool.journal) from None
        return "".join(out)


_ZERO_SPOOL = SpoolData(journal="", begin=0, end=0, first_append_time=0.0, registers=pb.LabelSet())


def parse_postfix_template(template: str) -> PostfixTemplate:
    """Parse `template`, then run it over zero-valued data so that, as in Gazette, unknown fields fail here."""
    nodes: list[str | _Action] = []
    pos, trim_next = 0, False
    while (start := template.find("{{", pos)) != -1:
        text, body = template[pos:start], start + 2
        if template[body : body + 1] == "-" and template[body + 1 : body + 2] in _WS_CHARS:
            text, body = text.rstrip(_WS), body + 2
        nodes.append(text.lstrip(_WS) if trim_next else text)
        body_end, pos, trim_next = _action_end(template, start, body)
        if not template.startswith("/*", body):
            try:
                pipeline = _parse_pipeline(template[body:body_end])
            except _Fail as exc:
                raise _error(str(exc), template[start:pos], *_position(template, start)) from None
            nodes.append(_Action(template[start:pos], *_position(template, start), pipeline))
    nodes.append(template[pos:].lstrip(_WS) if trim_next else template[pos:])
    parsed = PostfixTemplate(template, tuple(n for n in nodes if n != ""))
    parsed.render(_ZERO_SPOOL, pb.JournalSpec())
    return parsed


@functools.lru_cache(maxsize=256)
def _parse_cached(template: str) -> PostfixTemplate:
    return parse_postfix_template(template)


def render_path_postfix(template: str, spool: SpoolData, journal_spec: pb.JournalSpec) -> str:
    """Render `template` ("" gives ""), reusing parsed templates."""
    return _parse_cached(template).render(spool, journal_spec) if template else ""
