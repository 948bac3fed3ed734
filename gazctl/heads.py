"""Where a journal ends: one non-blocking metadata read at offset -1 asks its broker."""

from __future__ import annotations

from broker.client import JournalClient, OffsetJump, OffsetNotYetAvailable, ProtocolError, Reader
from broker.protocol import pb


async def head_metadata(client: JournalClient, journal: str) -> pb.ReadResponse:
    """The broker's reply to a metadata read at the head of `journal`: its `offset` is the end of
    the fragment index, its `write_head` the offset the next append will take."""
    async with Reader(client, journal, offset=-1, block=False, metadata_only=True) as reader:
        while True:
            try:
                await reader.read()
            except OffsetJump:
                continue  # -1 resolves to the head: the broker says where that is.
            except OffsetNotYetAvailable:
                return reader.response
            raise ProtocolError("metadata read at the head returned content or ended early", journal=journal)


async def write_head(client: JournalClient, journal: str) -> int:
    """The offset the next append to `journal` will take."""
    return (await head_metadata(client, journal)).write_head
