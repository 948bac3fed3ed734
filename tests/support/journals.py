"""Journals of a real broker through the client library: unique names, creating journals and waiting
for their primaries; the broker's /debug/metrics counters."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
import urllib.request
import uuid

from broker.client import JournalClient, apply_journals, list_journals, upsert
from broker.protocol import pb
from tests.support.harness import BrokerProcess, journal_spec


def unique(prefix: str) -> str:
    """A journal name no other test uses."""
    return f"{prefix}/{uuid.uuid4().hex[:12]}"


async def create_journal(client: JournalClient, spec: pb.JournalSpec, timeout: float = 20.0) -> pb.JournalSpec:
    """Apply `spec` and wait until the journal has a primary."""
    await apply_journals(client, [upsert(spec)])
    await wait_for_primary(client, spec.name, timeout)
    return spec


async def wait_for_primary(client: JournalClient, journal: str, timeout: float = 20.0) -> pb.Route:
    """Poll List until `journal` has a primary: assignments change no spec, so no watch reports them."""
    sel = pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="name", value=journal)]))
    async with asyncio.timeout(timeout):
        while True:
            for j in (await list_journals(client, sel)).journals:
                if j.route.primary >= 0:
                    return j.route
            await asyncio.sleep(0.05)


async def new_journal(
    client: JournalClient, prefix: str = "client", *, content_type: str | None = None, **fragment: object
) -> str:
    """Create a journal under `prefix` with the tutorial's settings (labelled `content_type`, if given),
    overridden by JournalSpec.Fragment fields; its name."""
    name = unique(prefix)
    spec = journal_spec(name) if content_type is None else journal_spec(name, content_type=content_type)
    for key, value in fragment.items():
        if key == "stores":
            spec.fragment.stores[:] = value  # type: ignore[index]
        elif key == "refresh_interval":
            spec.fragment.refresh_interval.seconds = int(value)  # type: ignore[call-overload]
        elif key == "flush_interval":
            spec.fragment.flush_interval.seconds = int(value)  # type: ignore[call-overload]
        else:
            setattr(spec.fragment, key, value)
    await create_journal(client, spec)
    return spec.name


def metric(broker: BrokerProcess, name: str, journal: str) -> int:
    """A per-journal counter of the broker's /debug/metrics, e.g. `gazette_append_requests_total`."""
    return _counter(broker, name, f'journal="{re.escape(journal)}"')


def http_puts(broker: BrokerProcess) -> int:
    """The broker gateway's count of PUTs answered 204."""
    return _counter(broker, "gazette_http_requests_total", 'code="204",method="PUT"')


def http_gets(broker: BrokerProcess) -> int:
    """The broker gateway's count of GETs of journals answered (206, or an error; not this one's 200)."""
    return _counter(broker, "gazette_http_requests_total", r'code="(?!200")\d+",method="GET"')


def _counter(broker: BrokerProcess, name: str, labels: str) -> int:
    """The sum of counter `name` over the series whose labels match the pattern `labels` (0 if none)."""
    with urllib.request.urlopen(f"{broker.url}/debug/metrics", timeout=10) as resp:
        text = resp.read().decode()
    pattern = rf"^{re.escape(name)}{{{labels}}} (?P<value>\S+)$"
    return sum(int(float(m.group("value"))) for m in re.finditer(pattern, text, re.MULTILINE))


def append_rpcs(broker: BrokerProcess, journal: str) -> int:
    """The broker's count of committed Append RPCs of `journal`."""
    return metric(broker, "gazette_append_requests_total", journal)


def read_rpcs(broker: BrokerProcess, journal: str) -> int:
    """The broker's count of the Read RPCs of `journal` it started."""
    return metric(broker, "gazette_read_requests_total", journal)


async def wait_for_read_rpcs(broker: BrokerProcess, journal: str, count: int, timeout: float = 20.0) -> None:
    """Wait until the broker started `count` Read RPCs of `journal`: a blocking read at -1 sends
    nothing before content arrives, and this counter is the only sign that it reached the broker."""
    async with asyncio.timeout(timeout):
        while await asyncio.to_thread(read_rpcs, broker, journal) < count:
            await asyncio.sleep(0.05)


def wait_for_process_read(
    broker: BrokerProcess, journal: str, count: int, reader: subprocess.Popen[str], context: object,
    timeout: float = 30.0,
) -> None:
    """wait_for_read_rpcs for a reading process (e.g. `gazctl journals read`), from a test's thread:
    fails with `context` if `reader` exits first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while read_rpcs(broker, journal) < count:
        assert time.monotonic() < deadline and reader.poll() is None, context
        time.sleep(0.05)
