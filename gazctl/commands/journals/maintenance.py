"""`gazctl journals reset-head`, `suspend` and `store-health`: operators' maintenance commands.

reset-head and suspend act on each selected journal (fully suspended ones are skipped), a few
at a time, and log what happened to each: at info level when it went as asked, as a warning
when it did not (raced writes; not idle enough to suspend), as an error when it failed. They
exit non-zero, naming the failed journals, if any failed.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated

import grpc
import typer

from broker.client import (
    ClientError,
    JournalClient,
    Suspended,
    TransportError,
    WrongAppendOffset,
    append,
    list_journals,
)
from broker.protocol import pb
from broker.protocol.validation import ValidationError, validate_fragment_store_health_request
from gazctl.bounded import map_bounded
from gazctl.commands.common import BrokerAddressOption, LogFormatOption, LogLevelOption, reported, setup
from gazctl.commands.journals._app import app
from gazctl.errors import GazctlError
from gazctl.heads import head_metadata
from gazctl.selectors import RequiredSelectorOption, require_selector

log = logging.getLogger("gazctl")

Journal = pb.ListResponse.Journal
Level = pb.JournalSpec.Suspend


@dataclass(frozen=True)
class Outcome:
    """What happened to one journal: its log message, the level to log it at, and whether it failed."""

    journal: str
    text: str
    level: int = logging.INFO
    failed: bool = False


@app.command("reset-head")
def reset_head_command(
    ctx: typer.Context,
    selector: RequiredSelectorOption = "",
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Reset the append offset of journals to their largest indexed offset (disaster recovery).

    Brokers refuse appends to a journal whose fragment index holds an offset beyond the one its
    replicas agreed on, which happens only after as many broker failures as its replication.
    Once every fragment of the journal is persisted (e.g. all previous brokers exited), reset-head
    reads the head of each journal's index and appends nothing at that offset, moving the append
    offset forward so appends proceed. It is safe on journals which are consistent and being
    appended to: a head raced by other writes is reported, not an error.
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        parsed = require_selector(selector)
        _report(settings.run(lambda client: _each_journal(client, parsed, _reset_head)))


@app.command("suspend")
def suspend_command(
    ctx: typer.Context,
    selector: RequiredSelectorOption = "",
    force: Annotated[
        bool, typer.Option("--force", "-f", help="Suspend journals even if they have fragments not yet persisted")
    ] = False,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Suspend idle journals so they use fewer or no broker replicas.

    Each journal gets an empty append asking to suspend once its fragments are persisted (or
    right away with --force). Suspension sets the `suspend` field of the JournalSpec (its level
    and resume offset): when applying other changes to suspended journals, carry that field
    through, as `journals edit` does. A journal that is not idle stays unsuspended, and says so.
    """
    mode = pb.AppendRequest.SUSPEND_NOW if force else pb.AppendRequest.SUSPEND_IF_FLUSHED
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        parsed = require_selector(selector)

        async def suspend_all(client: JournalClient) -> list[Outcome]:
            outcomes = await _each_journal(client, parsed, lambda c, j: _suspend(c, j, mode))
            # The append's reply does not say whether the level changed: the spec does.
            after = {j.spec.name: j.spec.suspend for j in (await list_journals(client, parsed)).journals}
            return [_suspend_result(o, after.get(o.journal)) for o in outcomes]

        _report(settings.run(suspend_all))


@app.command("store-health")
def store_health_command(
    ctx: typer.Context,
    store_url: Annotated[
        str,
        typer.Argument(
            metavar="STORE_URL",
            help="Fragment store URL to check, e.g. s3://bucket/prefix/ or file:///",
            show_default=False,
        ),
    ],
    check_delete_prefix: Annotated[
        str | None,
        typer.Option(
            "--check-delete-prefix",
            help="Also check that objects can be deleted, by writing and deleting a probe object under this"
            " prefix of the store (ending in '/'; \"\" for the store root)",
            show_default=False,
        ),
    ] = None,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Check the health of a fragment store, as the broker sees it.

    The broker writes, reads, lists and signs a probe object in the store (and deletes one, with
    --check-delete-prefix). Prints that the store is healthy, or exits non-zero with the store's error.
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        req = pb.FragmentStoreHealthRequest(
            fragment_store=store_url,
            check_delete=check_delete_prefix is not None,
            check_delete_prefix=check_delete_prefix or "",
        )
        try:
            validate_fragment_store_health_request(req)
        except ValidationError as err:
            raise GazctlError(f"invalid fragment store {store_url!r}: {err}") from None
        resp = settings.run(lambda client: _store_health(client, req))
        if resp.status == pb.FRAGMENT_STORE_UNHEALTHY:
            raise GazctlError(f"fragment store {store_url} is unhealthy: {resp.store_health_error}")
        if resp.status != pb.OK:
            raise GazctlError(
                f"fragment store {store_url} health check failed with status {pb.Status.Name(resp.status)}"
            )
        sys.stdout.write(f"Fragment store {store_url} is healthy\n")


async def _store_health(client: JournalClient, req: pb.FragmentStoreHealthRequest) -> pb.FragmentStoreHealthResponse:
    try:
        resp: pb.FragmentStoreHealthResponse = await client.stub().FragmentStoreHealth(req)
    except grpc.aio.AioRpcError as exc:
        raise TransportError.from_rpc_error(exc, endpoint=client.address) from exc
    return resp


async def _each_journal(
    client: JournalClient,
    selector: pb.LabelSelector,
    work: Callable[[JournalClient, Journal], Awaitable[Outcome]],
) -> list[Outcome]:
    """Run `work` on each selected journal which is not fully suspended; a ClientError is its outcome."""
    listed = await list_journals(client, selector)
    if not listed.journals:
        log.warning("no journals match the selector")
    outcomes: list[Outcome] = []
    active: list[Journal] = []
    for journal in listed.journals:
        if journal.spec.suspend.level == Level.FULL:
            outcomes.append(Outcome(journal.spec.name, "skipped: fully suspended"))
        else:
            active.append(journal)

    async def one(journal: Journal) -> Outcome:
        try:
            return await work(client, journal)
        except ClientError as err:
            return Outcome(journal.spec.name, f"failed: {err}", logging.ERROR, failed=True)

    outcomes.extend(await map_bounded(active, one))
    return sorted(outcomes, key=lambda o: o.journal)


async def _reset_head(client: JournalClient, journal: Journal) -> Outcome:
    """Append nothing at the head of `journal`'s fragment index, which moves its append offset there."""
    name = journal.spec.name
    head = await _index_head(client, name)
    try:
        await append(client, name, b"", offset=head, suspend=pb.AppendRequest.SUSPEND_KEEP)
    except WrongAppendOffset:
        return Outcome(name, f"did not reset: raced writes (the head moved past {head})", logging.WARNING)
    return Outcome(name, f"reset write head to {head}")


async def _index_head(client: JournalClient, journal: str) -> int:
    """The end of `journal`'s fragment index."""
    return (await head_metadata(client, journal)).offset


async def _suspend(client: JournalClient, journal: Journal, mode: int) -> Outcome:
    """Ask the broker to suspend `journal`; a SUSPENDED reply means it already is."""
    name = journal.spec.name
    try:
        await append(client, name, b"", suspend=mode)
    except Suspended:
        return Outcome(name, "already suspended")
    return Outcome(name, "requested suspension")


def _suspend_result(outcome: Outcome, after: pb.JournalSpec.Suspend | None) -> Outcome:
    """Complete a suspend outcome with the journal's suspend level after the request."""
    if outcome.failed or after is None or outcome.text.startswith("skipped"):
        return outcome
    if after.level == Level.NONE:
        return Outcome(
            outcome.journal,
            "not suspended: it has fragments not yet persisted, or persisted within its flush interval"
            " (--force suspends it anyway)",
            logging.WARNING,
        )
    level = Level.Level.Name(after.level)
    verb = "already suspended" if outcome.text == "already suspended" else "suspended"
    return Outcome(outcome.journal, f"{verb} ({level}, resume offset {after.offset})")


def _report(outcomes: Sequence[Outcome]) -> None:
    """Log each journal's outcome; raise GazctlError naming the journals that failed."""
    for outcome in outcomes:
        log.log(outcome.level, outcome.text, extra={"journal": outcome.journal})
    failed = [o.journal for o in outcomes if o.failed]
    if failed:
        raise GazctlError(f"{len(failed)} of {len(outcomes)} journals failed: {', '.join(failed)}")

