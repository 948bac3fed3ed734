"""The default reader of a shard's sources: one task per source journal, reading read-uncommitted
envelopes from the checkpointed offset into the shard's `MessageChannel` (Gazette's
`startReadingMessages`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from broker.client import JournalClient
from broker.protocol import pb
from consumer.application import Application
from consumer.channel import ChannelClosed, MessageChannel
from consumer.message import fetch_journal_spec, read_uncommitted_batches
from consumer.protocol import pb as cpb
from consumer.shard import Shard


def message_factory(app: Application, spec: pb.JournalSpec) -> Callable[[str], Any]:
    new_message = app.new_message  # Bound once: this runs once per message read.
    return lambda _journal: new_message(spec)


def start_reading_messages(
    shard: Shard, app: Application, checkpoint: cpb.Checkpoint, channel: MessageChannel
) -> list[asyncio.Task[None]]:
    """Read each source of the shard's spec into `channel`, from its checkpointed offset (at
    least the source's `min_offset`), one task per source; a reader's error is sent to the channel
    and ends that reader. Cancel the tasks to stop reading."""
    tasks = []
    for source in shard.spec.sources:
        offset = checkpoint.sources[source.journal].read_through if source.journal in checkpoint.sources else 0
        offset = max(offset, source.min_offset)
        tasks.append(
            asyncio.ensure_future(_read_source(shard.journal_client, app, source.journal, offset, channel))
        )
    return tasks


async def _read_source(
    client: JournalClient, app: Application, journal: str, offset: int, channel: MessageChannel
) -> None:
    try:
        spec = await fetch_journal_spec(client, journal)
        async for batch in read_uncommitted_batches(client, journal, offset, message_factory(app, spec), spec=spec):
            await channel.send_all(batch)
    except ChannelClosed:
        return  # Nobody reads any more.
    except Exception as e:
        with contextlib.suppress(ChannelClosed):
            await channel.send(e)


__all__ = ["message_factory", "start_reading_messages"]
