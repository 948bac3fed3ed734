"""Gazette's recovery log (Gazette's `consumer/recoverylog`): a directory's file operations recorded as an op
stream in a journal, and played back into another directory, byte for byte.

- `ops`: the wire format. Each RecordedOp is a protobuf fixed frame (a write op's payload follows
  it); checksums chain CRC-32C over the marshalled ops. Authors and their register fence
  (`author_fence`: `author=<base 32>`), `new_random_author`, `encode_op` / `decode_op`.
- `segments`: `Segment` validation and the `SegmentSet` (reduction of overlapping or adjacent
  segments of one author and log).
- `fsm`: the `FSM` applying ops in order (hinted authors, seq_no, checksum, then the op), its
  live Fnodes, links, properties and segments, and `build_hints`.
- `recorder`: `Recorder` (`await Recorder.open(log, fsm, author, dir, ajc)`) records creates,
  writes, links, renames and removals through an AppendService, fenced by the author register;
  `FileRecorder`; `barrier`, `build_hints`.
- `player`: `Player.play(hints, dir, client)` plays a log back (`.fnodes` staging, then hard links),
  sets `tailing` at the write head, and ends at `finish_at_write_head()` or after
  `inject_handoff(author)` fenced the log to a new author; an op that breaks the history it must
  continue (corrupt or missing content) fails playback. `check_log_content_type`.
- `hints`: FSMHints in etcd: `fetch_hints`, `store_recorded_hints`, `store_recovered_hints`
  (backup rotation), `pick_first_hints`, and Gazette's JSON (`encode_hints` / `decode_hints`).
- `errors`: `RecoveryLogError` and its subclasses, each carrying the log, offset, seq_no and author.

A shard recovers with a Player, hands off with `inject_handoff`, then records with a Recorder
continuing the Player's FSM; its hints go to etcd so the next Player can skip dead files.
"""

from consumer.recoverylog.errors import (
    BrokenHistoryError,
    ChecksumMismatchError,
    ContentTypeError,
    ExpectedHintedFnodeError,
    FnodeNotTrackedError,
    FSMError,
    HintsError,
    LinkExistsError,
    NoSuchLinkError,
    NotHintedAuthorError,
    OpDecodeError,
    PlaybackError,
    PropertyExistsError,
    RecorderError,
    RecorderFailedError,
    RecoveryLogError,
    SegmentError,
    WrongSeqNoError,
)
from consumer.recoverylog.fsm import FSM, FnodeState, FSMHints, live_log_segments
from consumer.recoverylog.hints import (
    FetchedHints,
    decode_hints,
    encode_hints,
    fetch_hints,
    pick_first_hints,
    store_recorded_hints,
    store_recovered_hints,
)
from consumer.recoverylog.ops import (
    RecordedOp,
    author_fence,
    author_selector,
    crc32c,
    decode_op,
    encode_op,
    format_author,
    new_random_author,
)
from consumer.recoverylog.player import FNODE_STAGING_DIR, Player, Resolved, check_log_content_type
from consumer.recoverylog.recorder import PROPERTY_FILES, FileRecorder, Recorder
from consumer.recoverylog.segments import Segment, SegmentSet, validate_segment

__all__ = [
    "FNODE_STAGING_DIR",
    "FSM",
    "PROPERTY_FILES",
    "BrokenHistoryError",
    "ChecksumMismatchError",
    "ContentTypeError",
    "ExpectedHintedFnodeError",
    "FSMError",
    "FSMHints",
    "FetchedHints",
    "FileRecorder",
    "FnodeNotTrackedError",
    "FnodeState",
    "HintsError",
    "LinkExistsError",
    "NoSuchLinkError",
    "NotHintedAuthorError",
    "OpDecodeError",
    "PlaybackError",
    "Player",
    "PropertyExistsError",
    "RecordedOp",
    "Recorder",
    "RecorderError",
    "RecorderFailedError",
    "RecoveryLogError",
    "Resolved",
    "Segment",
    "SegmentError",
    "SegmentSet",
    "WrongSeqNoError",
    "author_fence",
    "author_selector",
    "check_log_content_type",
    "crc32c",
    "decode_hints",
    "decode_op",
    "encode_hints",
    "encode_op",
    "fetch_hints",
    "format_author",
    "live_log_segments",
    "new_random_author",
    "pick_first_hints",
    "store_recorded_hints",
    "store_recovered_hints",
    "validate_segment",
]
