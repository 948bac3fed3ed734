"""Strict decoding of round-trip YAML: typed scalars, known keys only, and errors naming file:line:column.

Each decoded value travels with an `At`, its position in the file and its field path, such as
`children[1].fragment.retention`, so that any later error can point back at it.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.composer import Composer
from ruamel.yaml.constructor import ConstructorError, RoundTripConstructor, SafeConstructor
from ruamel.yaml.error import MarkedYAMLError, YAMLError, YAMLWarning
from ruamel.yaml.events import CollectionEndEvent, CollectionStartEvent, StreamEndEvent
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from ruamel.yaml.parser import Parser as PureParser
from ruamel.yaml.reader import ReaderError

from broker.errors import GazetteError
from broker.specs.durations import DurationError, parse_duration

T = TypeVar("T")


class SpecError(GazetteError, ValueError):
    """A spec file which does not decode or validate, naming the file, line, column and field."""

    def __init__(self, message: str, *, file: str, line: int, column: int, field: str = "") -> None:
        self.message = message
        self.file = file
        self.line = line
        self.column = column
        self.field = field
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}"
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


@dataclass(frozen=True)
class At:
    """Where a value sits: file, 1-based line and column, and its field path (empty at the root)."""

    file: str
    line: int
    column: int
    field: str = ""

    def error(self, message: str) -> SpecError:
        """Return a SpecError at this position."""
        return SpecError(message, file=self.file, line=self.line, column=self.column, field=self.field)

    def child(self, segment: str, pos: tuple[int, int] | None) -> At:
        """Return the position of a field (`name`) or item (`[i]`) at 0-based `pos` (default: here)."""
        field = f"{self.field}{segment}" if segment.startswith("[") or not self.field else f"{self.field}.{segment}"
        line, column = (pos[0] + 1, pos[1] + 1) if pos else (self.line, self.column)
        return At(self.file, line, column, field)


MAX_DEPTH = 100
"""The deepest nesting of mappings and lists a document may have (a journalspace directory takes two)."""
MAX_EXPANSION = 20
"""How many times over aliases may repeat a document's values (past `MIN_EXPANDED_VALUES` values)."""
MIN_EXPANDED_VALUES = 100_000
"""Values a document may hold once aliases are expanded, however few distinct values it has."""

_C_SAFE_DEPTH = 5000
# libyaml's composer recurses on the C stack (a segfault past ~25,000 levels with 8 MiB): a text whose
# nesting may exceed this is measured from its events before the C loader composes it.


def load(text: str, file: str, *, fast: bool = False) -> tuple[Any, At]:
    """Parse one YAML document; return it and the position of its root.

    Round-trip mode keeps every value's line and column for errors. `fast` parses with the
    C-accelerated safe loader instead (5x faster on large trees, same YAML 1.2 rules), whose
    values carry no positions: use it when errors are rare, and parse again without it to
    report one (see `with_positions`).

    Whatever the text, the result is a finite tree of valid Unicode text, or a SpecError: lone
    surrogates (`"\\ud800"`), nesting deeper than `MAX_DEPTH`, a recursive alias (`&a [*a]`),
    aliases that multiply the document (more than `MAX_EXPANSION` times, past
    `MIN_EXPANDED_VALUES` values) and lists or mappings as mapping keys are errors at their line
    and column, so decoders may recurse.
    """
    _require_unicode(text, file)
    try:
        doc = _load_checked(text, fast)
    except _ShapeError as err:
        raise _error_at(err.message, file, err.mark) from None
    except MarkedYAMLError as err:
        message = " ".join(p for p in (err.context, err.problem) if p) or "invalid YAML"
        raise _error_at(f"invalid YAML: {_one_line(message)}", file, err.problem_mark or err.context_mark) from None
    except ReaderError as err:
        raise _reader_error(err, text, file) from None
    except YAMLError as err:
        raise SpecError(f"invalid YAML: {_one_line(err)}", file=file, line=1, column=1) from None
    line, column = _own_position(doc)
    return doc, At(file, line, column)


def _load_checked(text: str, fast: bool) -> Any:
    c_parser = YAML(typ="safe", pure=False).Parser
    if c_parser is PureParser:  # No libyaml: the pure-Python loaders limit their depth themselves.
        pass
    elif fast and _nesting_bound(text) > _C_SAFE_DEPTH:
        _require_depth(_c_events(c_parser, text))
    elif not fast and text.count("[") + text.count("{") > MAX_DEPTH:
        # The pure-Python scanner slows with each open flow collection (a second for `[` * 1000): measure
        # the depth with libyaml first. Its errors are left to the round-trip loader, whose they are.
        with contextlib.suppress(YAMLError):
            _require_depth(_c_events(c_parser, text))
    yaml = YAML(typ="safe", pure=False) if fast else YAML(typ="rt")
    yaml.Constructor = _CheckedSafeConstructor if fast else _CheckedRoundTripConstructor
    yaml.Composer = _DepthLimitedComposer  # Used by the pure-Python loaders (not libyaml's).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", YAMLWarning)  # A reused anchor is valid YAML: the last one counts.
        return yaml.load(text)


def decode_utf8(data: bytes, file: str) -> str:
    """`data` as UTF-8 text; invalid UTF-8 is a SpecError at the line and column of its first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = len(data[data.rfind(b"\n", 0, err.start) + 1 : err.start].decode("utf-8", "replace")) + 1
        raise SpecError(
            f"invalid UTF-8 (byte 0x{data[err.start]:02x}): the file must be UTF-8 text",
            file=file, line=line, column=column,
        ) from None


class _ShapeError(Exception):
    """A composed document which is not a finite tree of Unicode text (see `load`), at a ruamel mark."""

    def __init__(self, message: str, mark: Any) -> None:
        super().__init__(message)
        self.message = message
        self.mark = mark


def _check_graph(root: Node) -> None:
    """Raise _ShapeError unless the node graph `root` composes to is a tree `load` accepts.

    One pass over the distinct nodes (an alias is the node it names): a node met again while its
    own children are being visited is a recursive alias; collection heights and expanded sizes are
    computed bottom-up, so aliases are measured without being expanded.
    """
    visiting: set[int] = set()
    height: dict[int, int] = {}
    size: dict[int, int] = {}
    order: list[Node] = []
    stack: list[tuple[Node, int, list[Node] | None]] = [(root, 1, None)]  # Children once visited.
    while stack:
        node, depth, children = stack.pop()
        key = id(node)
        if children is not None:  # Leaving the node: its children are done.
            visiting.discard(key)
            height[key] = 1 + max((height[id(child)] for child in children), default=0)
            size[key] = 1 + sum(size[id(child)] for child in children)
            order.append(node)
            continue
        if key in visiting:
            raise _ShapeError("recursive alias: the value anchored here contains an alias of itself", node.start_mark)
        if key in height:  # An alias of a value visited already.
            if depth - 1 + height[key] > MAX_DEPTH:
                raise _ShapeError(f"nested deeper than {MAX_DEPTH} levels (through an alias)", node.start_mark)
            continue
        if isinstance(node, ScalarNode):
            _require_text(node)
            height[key], size[key] = 0, 1
            continue
        if depth > MAX_DEPTH:
            raise _ShapeError(f"nested deeper than {MAX_DEPTH} levels", node.start_mark)
        visiting.add(key)
        children = _node_children(node)
        stack.append((node, depth, children))
        stack.extend((child, depth + 1, None) for child in reversed(children))
    limit = max(MIN_EXPANDED_VALUES, MAX_EXPANSION * len(height))
    if size[id(root)] > limit:
        blamed = next(node for node in order if size[id(node)] > limit)
        raise _ShapeError(
            f"aliases expand this value to {size[id(blamed)]:,} values (the document has {len(height):,};"
            f" at most {limit:,})",
            blamed.start_mark,
        )


def _node_children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        for key, _ in node.value:
            if not isinstance(key, ScalarNode):  # ruamel cannot always hash them; no spec needs one.
                raise _ShapeError("a mapping key must be a scalar, not a list or mapping", key.start_mark)
        return [child for pair in node.value for child in pair]
    if isinstance(node, SequenceNode):
        return list(node.value)
    return []


def _require_text(node: ScalarNode) -> None:
    value = node.value
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise _ShapeError(
                f"invalid character U+{ord(value[err.start]):04X} in a string (a lone surrogate is not Unicode text)",
                node.start_mark,
            ) from None


class _DepthLimitedComposer(Composer):
    """The pure-Python composer, refusing to recurse past MAX_DEPTH (Python's stack, and a scanner that
    slows with each open flow collection, would otherwise take seconds to fail on `[[[[...`)."""

    nesting = 0

    def compose_sequence_node(self, anchor: Any) -> Any:
        return self._nested(super().compose_sequence_node, anchor)

    def compose_mapping_node(self, anchor: Any) -> Any:
        return self._nested(super().compose_mapping_node, anchor)

    def _nested(self, compose: Callable[[Any], Any], anchor: Any) -> Any:
        self.nesting += 1
        try:
            if self.nesting > MAX_DEPTH:
                raise _ShapeError(f"nested deeper than {MAX_DEPTH} levels", self.parser.peek_event().start_mark)
            return compose(anchor)
        finally:
            self.nesting -= 1


class _Checked:
    """A ruamel constructor that checks the composed graph first, and reports what it cannot build at its mark.

    ruamel's constructors raise plain Python errors for some tagged scalars (`!!int x` is a ValueError):
    those become ConstructorErrors, which `load` reports as invalid YAML at the value's line and column.
    """

    def construct_document(self, node: Any) -> Any:
        _check_graph(node)
        try:
            return super().construct_document(node)  # type: ignore[misc]
        except (YAMLError, _ShapeError):
            raise
        except Exception as err:  # In the constructors' deferred steps: blamed on the document.
            raise _construct_error(node, err) from None

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)  # type: ignore[misc]
        except (YAMLError, _ShapeError):
            raise
        except Exception as err:
            raise _construct_error(node, err) from None


def _construct_error(node: Node, err: Exception) -> ConstructorError:
    tag = str(node.tag).replace("tag:yaml.org,2002:", "!!")
    problem = f"cannot construct a {tag} value: {type(err).__name__}: {err}"
    return ConstructorError(None, None, problem, node.start_mark)


class _CheckedSafeConstructor(_Checked, SafeConstructor):
    pass


class _CheckedRoundTripConstructor(_Checked, RoundTripConstructor):
    pass


def _require_unicode(text: str, file: str) -> None:
    """Refuse text holding a lone surrogate (e.g. undecodable bytes read with `surrogateescape`)."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        line, column = _text_position(text, err.start)
        raise SpecError(
            f"invalid character U+{ord(text[err.start]):04X} (a lone surrogate, not Unicode text: is the input UTF-8?)",
            file=file, line=line, column=column,
        ) from None


def _nesting_bound(text: str) -> int:
    """An upper bound of the text's nesting: block levels need columns, and flow levels brackets."""
    longest = max(map(len, text.split("\n")))
    return 2 * (longest + 1) + text.count("[") + text.count("{")


def _c_events(c_parser: Any, text: str) -> Iterator[Any]:
    """The events of `text` from libyaml's parser (which is iterative; only its composer recurses)."""
    parser = c_parser(text)
    try:
        while (event := parser.get_event()) is not None:
            yield event
            if isinstance(event, StreamEndEvent):
                return
    finally:
        parser.dispose()


def _require_depth(events: Iterable[Any]) -> None:
    """Raise _ShapeError at the first collection nested deeper than MAX_DEPTH (or a YAMLError before it)."""
    depth = 0
    for event in events:
        if isinstance(event, CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise _ShapeError(f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        elif isinstance(event, CollectionEndEvent):
            depth -= 1


def _error_at(message: str, file: str, mark: Any) -> SpecError:
    line, column = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
    return SpecError(message, file=file, line=line, column=column)


def _reader_error(err: ReaderError, text: str, file: str) -> SpecError:
    """A character YAML does not allow (control characters), at its line and column."""
    found = text.find(chr(err.character)) if isinstance(err.character, int) else -1
    line, column = _text_position(text, found) if found >= 0 else (1, 1)
    name = f"U+{err.character:04X}" if isinstance(err.character, int) else repr(err.character)
    message = f"invalid YAML: unacceptable character {name} ({err.reason})"
    return SpecError(message, file=file, line=line, column=column)


def _one_line(message: object) -> str:
    """A message as one line (a user sees it as `error: ...`)."""
    return " ".join(str(message).split())


def _text_position(text: str, index: int) -> tuple[int, int]:
    return text.count("\n", 0, index) + 1, index - (text.rfind("\n", 0, index) + 1) + 1


def with_positions(decode: Callable[[bool], T]) -> T:
    """`decode(fast=True)`; if that raises a SpecError, `decode(fast=False)`, so the error names its line.

    The second run raises the same error with positions (or, should the loaders ever disagree,
    returns the round-trip result, which is authoritative).
    """
    try:
        return decode(True)
    except SpecError:
        return decode(False)


def mapping(value: Any, at: At, fields: Collection[str]) -> dict[str, tuple[Any, At]]:
    """Decode a mapping whose keys must be among `fields`; return key -> (value, position)."""
    if not isinstance(value, Mapping):
        raise at.error(f"expected a mapping with fields {_listing(fields)}; got {_kind(value)}")
    positions = value.lc if isinstance(value, CommentedMap) else None
    out: dict[str, tuple[Any, At]] = {}
    for key, item in value.items():
        key_at = at.child(str(key), _lookup(positions, "key", key))
        if not isinstance(key, str) or key not in fields:
            raise key_at.error(f"unknown field {str(key)!r} (expected one of {_listing(fields)})")
        out[key] = (item, at.child(key, _lookup(positions, "value", key) or _lookup(positions, "key", key)))
    return out


def names(value: Mapping[Any, Any], at: At, what: str = "name") -> dict[str, tuple[Any, At]]:
    """Decode a mapping whose keys are names of the user's choosing: each must be a string."""
    positions = value.lc if isinstance(value, CommentedMap) else None
    out: dict[str, tuple[Any, At]] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            shown = "null" if key is None else str(key).lower() if isinstance(key, bool) else str(key)
            key_at = at.child(shown, _lookup(positions, "key", key))
            raise key_at.error(f"a {what} must be a string; got {_kind(key)}")
        out[str(key)] = (item, at.child(key, _lookup(positions, "key", key)))
    return out


def sequence(value: Any, at: At) -> list[tuple[Any, At]]:
    """Decode a sequence (null is empty); return its (item, position) pairs."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise at.error(f"expected a list; got {_kind(value)}")
    positions = value.lc if isinstance(value, CommentedSeq) else None
    return [(item, at.child(f"[{i}]", _lookup(positions, "item", i))) for i, item in enumerate(value)]


def string(value: Any, at: At) -> str:
    """Decode a string; null is empty, and a plain integer or boolean is taken as its YAML text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    raise at.error(f"expected a string; got {_kind(value)} (quote the value)")


def integer(value: Any, at: At, low: int, high: int) -> int:
    """Decode an integer in [low, high]; null is zero."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise at.error(f"expected an integer; got {_kind(value)}")
    if not low <= value <= high:
        raise at.error(f"integer {int(value)} out of range [{low}, {high}]")
    return int(value)


def boolean(value: Any, at: At) -> bool | None:
    """Decode `true` or `false`; null is None (unset)."""
    if value is None or isinstance(value, bool):
        return value
    raise at.error(f"expected true or false; got {_kind(value)}")


def duration(value: Any, at: At) -> int:
    """Decode a Go duration string (`10m`, `1h30m`, `60s`) into nanoseconds; null and 0 are zero."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 0):
        return 0
    if not isinstance(value, str):
        raise at.error(f"expected a duration such as 90s, 10m or 1h30m; got {_kind(value)}")
    try:
        return parse_duration(str(value))
    except DurationError as err:
        raise at.error(f"{err}; expected a Go duration such as 90s, 10m or 1h30m (units ns, us, ms, s, m, h)") from None


def enum(value: Any, at: At, names: Mapping[str, int], allow_number: bool) -> int:
    """Decode an enum by name (or, if `allow_number`, by number); null is zero."""
    if value is None:
        return 0
    if isinstance(value, str) and str(value) in names:
        return names[str(value)]
    if allow_number and isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32:
        return int(value)
    options = _listing(names) + (" or a number" if allow_number else "")
    shown = repr(str(value)) if isinstance(value, str) else _kind(value)
    raise at.error(f"invalid value {shown} (expected one of {options})")


def _lookup(positions: Any, kind: str, key: Any) -> tuple[int, int] | None:
    """A ruamel LineCol `key`, `value` or `item` position, or None (e.g. for merged `<<` keys)."""
    if positions is None:
        return None
    try:
        line, column = getattr(positions, kind)(key)
    except (KeyError, IndexError, TypeError):
        return None
    return int(line), int(column)


def _own_position(doc: Any) -> tuple[int, int]:
    lc = getattr(doc, "lc", None)
    if lc is None or lc.line is None:
        return 1, 1
    return int(lc.line) + 1, int(lc.col) + 1


def describe(value: Any) -> str:
    """What a decoded value is, for messages: `null`, `integer 3`, `string 'x'`, `a list`, ..."""
    return _kind(value)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {'true' if value else 'false'}"
    if isinstance(value, int):
        return f"integer {int(value)}"
    if isinstance(value, float):
        return f"number {float(value)}"
    if isinstance(value, str):
        return f"string {str(value)!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):  # A tuple: a list as a mapping key.
        return "a list"
    return type(value).__name__


def _listing(names: Collection[str]) -> str:
    return ", ".join(names)
