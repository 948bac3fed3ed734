"""Recovery log test fixtures: log journals of the module's real broker (`client` and `ajc` are the
conftests' above)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from broker.client import JournalClient, Reader
from broker.protocol import labels
from tests.support.harness import journal_spec
from tests.support.journals import create_journal, unique

NewLog = Callable[..., Awaitable[str]]


@pytest.fixture
def new_log(client: JournalClient) -> NewLog:
    """Creates a journal labelled as a recovery log (or with `content_type`), returning its name."""

    async def make(prefix: str = "recovery/logs", content_type: str = labels.CONTENT_TYPE_RECOVERY_LOG) -> str:
        spec = journal_spec(unique(prefix), content_type=content_type)
        await create_journal(client, spec)
        return spec.name

    return make


async def read_all(client: JournalClient, journal: str, offset: int = 0) -> bytes:
    """The journal's content from `offset` to its write head."""
    out = b""
    async with Reader(client, journal, offset=offset, block=False) as reader:
        async for chunk in reader:
            out += chunk
    return out
