"""AppendService retry rules under injected faults, from an in-process Journal server.

A real broker cannot be made to fail at a chosen point of an append; this server can. Each
Append follows the next step of a script: reply with a status, commit, or fail the transport
after reading the whole stream (the commit was asked for: the outcome is unknown to the client).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from broker.client import (
    AppendOutcomeUnknown,
    AppendService,
    JournalClient,
    NotJournalPrimaryBroker,
    ServiceClosed,
    append,
)
from broker.protocol import pb, pb_grpc
from tests.support.harness import free_port

JOURNAL = "faults/journal"


class ScriptedJournal(pb_grpc.JournalServicer):
    """Answers each Append with the next step of `script`; keeps what it committed."""

    def __init__(self, script: list[str]) -> None:
        self.script = script
        self.attempts = 0
        self.committed = b""

    async def Append(
        self, request_iterator: AsyncIterator[pb.AppendRequest], context: grpc.aio.ServicerContext
    ) -> pb.AppendResponse:
        step = self.script[min(self.attempts, len(self.script) - 1)]
        self.attempts += 1
        first = await anext(request_iterator)
        assert first.journal == JOURNAL
        if step.startswith("status:"):
            return pb.AppendResponse(status=pb.Status.Value(step.split(":", 1)[1]))
        content = b""
        marker = False
        async for req in request_iterator:
            assert not marker, "content after the commit chunk"
            marker = not req.content
            content += req.content
        assert marker, "end of stream without the commit chunk"
        if step == "fail-after-commit":
            self.committed += content  # Committed, but the reply is lost.
            await context.abort(grpc.StatusCode.UNAVAILABLE, "injected: connection lost")
        begin = len(self.committed)
        self.committed += content
        return pb.AppendResponse(
            status=pb.OK, commit=pb.Fragment(journal=JOURNAL, begin=begin, end=len(self.committed))
        )


async def serve(script: list[str]) -> tuple[grpc.aio.Server, ScriptedJournal, str]:
    server = grpc.aio.server()
    journal = ScriptedJournal(script)
    pb_grpc.add_JournalServicer_to_server(journal, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, journal, f"http://127.0.0.1:{port}"


async def test_transient_statuses_are_retried_without_duplicates() -> None:
    server, journal, url = await serve(
        ["status:NOT_JOURNAL_PRIMARY_BROKER", "status:INSUFFICIENT_JOURNAL_BROKERS", "commit"]
    )
    try:
        async with JournalClient(url) as client:
            with pytest.raises(NotJournalPrimaryBroker):  # A lone Appender reports the status.
                await append(client, JOURNAL, b"x")
            journal.attempts = 0
            async with AppendService(client, max_backoff=0.1) as service:
                done = service.append(JOURNAL, b"hello")
                resp = await done
            assert resp.status == pb.OK and (done.begin, done.end) == (0, 5)
            assert service.stats.retries == 2 and journal.attempts == 3
            assert journal.committed == b"hello"
    finally:
        await server.stop(None)


async def test_unknown_outcome_is_not_retried_by_default() -> None:
    server, journal, url = await serve(["fail-after-commit", "commit"])
    try:
        async with JournalClient(url) as client, AppendService(client, max_backoff=0.1) as service:
            with pytest.raises(AppendOutcomeUnknown) as info:
                await service.append(JOURNAL, b"once")
            assert info.value.journal == JOURNAL and "UNAVAILABLE" in str(info.value)
            assert service.stats.retries == 0 and journal.attempts == 1
            # The journal is not poisoned: the next append goes ahead.
            await service.append(JOURNAL, b";next")
        assert journal.committed == b"once;next"
    finally:
        await server.stop(None)


async def test_unknown_outcome_retried_when_asked_may_duplicate() -> None:
    server, journal, url = await serve(["fail-after-commit", "commit"])
    try:
        async with JournalClient(url) as client:
            async with AppendService(client, max_backoff=0.1, retry_unknown_outcome=True) as service:
                await service.append(JOURNAL, b"dup;")
        assert journal.attempts == 2 and journal.committed == b"dup;dup;"  # At-least-once, as documented.
    finally:
        await server.stop(None)


async def test_an_empty_append_of_unknown_outcome_is_retried() -> None:
    """An empty append (a write barrier, e.g. a recovery log's head) writes nothing: retried whatever
    the service's setting, so a broker lost mid-barrier does not fail its caller."""
    server, journal, url = await serve(["fail-after-commit", "commit"])
    try:
        async with JournalClient(url) as client, AppendService(client, max_backoff=0.1) as service:
            barrier = service.append(JOURNAL, b"")
            resp = await barrier
            assert resp.status == pb.OK and (barrier.begin, barrier.end) == (0, 0)
            assert service.stats.retries == 1 and journal.attempts == 2
        assert journal.committed == b""
    finally:
        await server.stop(None)


async def test_close_with_cancel_fails_pending_appends() -> None:
    async with JournalClient(f"http://127.0.0.1:{free_port()}") as client:  # Nothing listens there.
        service = AppendService(client, max_backoff=0.05)
        first = service.append(JOURNAL, b"retried")
        queued = service.append(JOURNAL, b"queued", dependencies=[asyncio.get_running_loop().create_future()])
        async with asyncio.timeout(30):
            while service.stats.retries < 1:
                await asyncio.sleep(0.01)
        await service.close(cancel=True)
        with pytest.raises(ServiceClosed, match="in flight"):
            await first
        with pytest.raises(ServiceClosed, match="before the append was attempted"):
            await queued
        assert service.memory_bytes == 0 and service.pending == 0
