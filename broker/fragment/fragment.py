"""The Fragment model: a protocol Fragment plus, while it is local, the spool file holding it."""

from __future__ import annotations

import errno
import os
import tempfile
from dataclasses import dataclass
from typing import BinaryIO

from broker.fragment.errors import SpoolIOError
from broker.fragment.sums import digest_of
from broker.protocol import pb


class SpoolFile:
    """An unlinked temporary file holding a fragment's uncompressed bytes, addressed from 0.

    The file has no name, so its disk space is released once it is closed or collected. Positional
    I/O (pread/pwrite) lets readers share it with the spool that is still appending to it.
    """

    def __init__(self, directory: str | None = None) -> None:
        directory = directory or tempfile.gettempdir()
        try:
            self._file = _linkable_temporary_file(directory)
        except OSError as err:
            raise SpoolIOError(f"creating spool file in {directory}: {err}") from err

    def write_at(self, pos: int, data: bytes | memoryview) -> None:
        """Write all of `data` at byte `pos`."""
        view = memoryview(data)
        try:
            while view:
                n = os.pwrite(self._file.fileno(), view, pos)
                view, pos = view[n:], pos + n
        except (OSError, ValueError) as err:
            raise SpoolIOError(f"writing spool file at {pos}: {err}", offset=pos) from err

    def read_at(self, pos: int, n: int) -> bytes:
        """Read up to `n` bytes at byte `pos`; fewer only at the end of the file."""
        chunks: list[bytes] = []
        try:
            while n > 0:
                chunk = os.pread(self._file.fileno(), n, pos)
                if not chunk:
                    break
                chunks.append(chunk)
                pos, n = pos + len(chunk), n - len(chunk)
        except (OSError, ValueError) as err:
            raise SpoolIOError(f"reading spool file at {pos}: {err}", offset=pos) from err
        return b"".join(chunks)

    def fileno(self) -> int:
        """Return the file descriptor, e.g. to stream the file to a store."""
        return self._file.fileno()

    def link(self, target: str, length: int) -> None:
        """Give the file's first `length` bytes the name `target`, durably, without copying them.

        Only for content that no longer changes. Raises OSError where the file cannot be linked:
        another filesystem, or a platform without O_TMPFILE.
        """
        fd = self._file.fileno()
        if os.fstat(fd).st_size > length:
            os.ftruncate(fd, length)  # Drop rolled-back bytes past the fragment's end.
        os.fsync(fd)
        # linkat(2) through /proc with AT_SYMLINK_FOLLOW names the open file itself; plain link(2),
        # which os.link uses without a directory descriptor, would link the /proc symlink.
        proc = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.link(str(fd), target, src_dir_fd=proc, follow_symlinks=True)
        finally:
            os.close(proc)

    @property
    def closed(self) -> bool:
        """Whether close() was called."""
        return self._file.closed

    def close(self) -> None:
        """Close the file, releasing its disk space."""
        self._file.close()


def _linkable_temporary_file(directory: str) -> BinaryIO:
    """An unnamed file in `directory` that `link` can name later: O_TMPFILE without O_EXCL."""
    tmpfile = getattr(os, "O_TMPFILE", 0)
    if tmpfile:
        try:
            return os.fdopen(os.open(directory, tmpfile | os.O_RDWR, 0o600), "w+b")
        except IsADirectoryError:
            pass  # Linux without O_TMPFILE support in this filesystem: it opened the directory.
        except OSError as err:
            if err.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
    return tempfile.TemporaryFile(dir=directory)


@dataclass(eq=False)
class Fragment:
    """A journal fragment: its protocol description, and its local bytes while it has any.

    `spec` is owned by this object: producers hand over a copy and nobody mutates it after.
    `file` holds the uncompressed bytes [begin, end) at file offsets [0, end - begin); it is
    None for a fragment known only from a store listing.
    """

    spec: pb.Fragment
    file: SpoolFile | None = None

    @property
    def begin(self) -> int:
        """First journal offset of the fragment."""
        return self.spec.begin

    @property
    def end(self) -> int:
        """Journal offset one past the fragment's last byte."""
        return self.spec.end

    @property
    def mod_time(self) -> int:
        """Unix seconds of the store object's last change; 0 while not persisted."""
        return self.spec.mod_time

    @property
    def content_length(self) -> int:
        """Number of uncompressed content bytes."""
        return self.spec.end - self.spec.begin

    @property
    def is_local(self) -> bool:
        """Whether the bytes are readable from a local spool file."""
        return self.file is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Fragment):
            return NotImplemented
        return self.file is other.file and spec_equal(self.spec, other.spec)

    def __repr__(self) -> str:
        where = "local" if self.file is not None else (self.spec.backing_store or "remote")
        return f"Fragment({self.spec.journal}@[{self.spec.begin}, {self.spec.end}), {where})"


def spec_equal(a: pb.Fragment, b: pb.Fragment) -> bool:
    """Whether two protocol Fragments are equal in every field, as Go compares them.

    Protobuf equality also compares the presence of `sum`, which Go's non-nullable field lacks:
    an absent sum and an all-zero one are the same fragment.
    """
    return a.end == b.end and digest_of(a.sum) == digest_of(b.sum) and equal_but_end_and_sum(a, b)


def equal_but_end_and_sum(a: pb.Fragment, b: pb.Fragment) -> bool:
    """Whether two protocol Fragments agree in every field but the two a commit changes."""
    return (
        a.journal == b.journal
        and a.begin == b.begin
        and a.compression_codec == b.compression_codec
        and a.backing_store == b.backing_store
        and a.mod_time == b.mod_time
        and a.path_postfix == b.path_postfix
    )
