"""word-count (examples/word_count), Gazette's n-gram counter, and with it the "Building APIs" surface
(`init_application`: an application's gRPC service and HTTP routes on the consumer's port, and
requests proxied to the shard's primary), against real parts: the session's etcd, the module's
`gazette serve` broker, and `gazette consume examples.word_count:counter` processes whose shards
keep their counts in SQLite stores recorded to recovery logs.
"""

from __future__ import annotations

import ast
import asyncio
import filecmp
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_tools import protoc

from broker.client import JournalClient
from consumer.message import PROTO_FIXED_FRAMING, Flags, build_uuid
from consumer.protocol import pb as cpb
from consumer.protocol import pb_grpc as cpb_grpc
from examples.word_count import NGramCount, n_grams, tokenize
from examples.word_count import word_count_pb2 as wpb
from examples.word_count import word_count_pb2_grpc as wpb_grpc
from examples.word_count.counter import ENV_N, ENV_PREFIX
from examples.word_count.specs import apply, delta_journals, shard_ids
from gazctl.heads import write_head
from tests.support.harness import ROOT, BrokerProcess, free_port, wait_http_ready
from tests.support.journals import wait_for_primary

Code = cpb.ReplicaStatus.Code
WAIT = 30.0
PARTITIONS = 4
TEXT = "How much wood would a wood chuck chuck if a wood chuck could chuck wood?"


# -- units ----------------------------------------------------------------------------------------


def test_n_grams_are_gazettes() -> None:
    assert tokenize("How much wood? A wood-chuck, 42 times: Éclair!") == [
        "how", "much", "wood", "a", "wood", "chuck", "times", "éclair"]
    assert n_grams("a b", 2) == ["START a", "a b", "b END", "END END"]
    assert n_grams("", 1) == ["END"]
    grams = n_grams(TEXT, 2)
    assert grams.count("wood chuck") == 2 and grams.count("a wood") == 2 and grams[0] == "START how"


def test_ngram_count_is_proto_fixed_framed() -> None:
    u = build_uuid(bytes.fromhex("010203040506"), 160, Flags.OUTSIDE_TXN)
    msg = NGramCount("wood chuck", 2)
    msg.set_uuid(u)
    frame = PROTO_FIXED_FRAMING.marshal(msg)
    proto = wpb.NGramCount()
    proto.ParseFromString(frame[8:])
    assert (proto.uuid, proto.n_gram, proto.count) == (u.bytes, "wood chuck", 2)
    assert PROTO_FIXED_FRAMING.unmarshal(frame, NGramCount()) == msg
    assert NGramCount().new_acknowledgement("j") == NGramCount()


PROTO = "examples/word_count/word_count.proto"
GENERATED = ["word_count_pb2.py", "word_count_pb2.pyi", "word_count_pb2_grpc.py"]


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    for proto in ("broker/protocol/protocol.proto", PROTO):
        (tmp_path / proto).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / proto, tmp_path / proto)
    include = Path(protoc.__file__).parent / "_proto"
    assert protoc.main([
        "protoc", f"-I{tmp_path}", f"-I{include}", f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}",
        f"--mypy_out={tmp_path}", PROTO,
    ]) == 0
    stale = [n for n in GENERATED
             if not filecmp.cmp(tmp_path / "examples/word_count" / n, ROOT / "examples/word_count" / n, shallow=False)]
    assert not stale, f"regenerate as {PROTO}'s header says: stale {stale}"
    # The hand-written type stub of the gRPC module names exactly the NGram RPCs.
    rpcs = {m.name for m in wpb.DESCRIPTOR.services_by_name["NGram"].methods}
    tree = ast.parse((ROOT / "examples/word_count/word_count_pb2_grpc.pyi").read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    for name in ("NGramServicer", "NGram"):
        assert {n.name for n in classes[name].body if isinstance(n, ast.FunctionDef)} == rpcs


# -- consume processes ----------------------------------------------------------------------------


class Member:
    """`python -m consumer consume examples.word_count:counter` (what `gazette consume` runs)."""

    def __init__(self, tmp: Path, broker: BrokerProcess, etcd: str, root: str, prefix: str, name: str) -> None:
        self.name = name
        self.port = free_port()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CONSUMER_", "ETCD_", "BROKER_", "LOG_", "WORD_COUNT_"))}
        env.update({"PYTHONPATH": str(ROOT), ENV_PREFIX: prefix, ENV_N: "2", "TMPDIR": str(tmp)})
        args = [
            sys.executable, "-m", "consumer", "consume", "examples.word_count:counter",
            "--consumer.id", name, "--consumer.port", str(self.port), "--consumer.host", "127.0.0.1",
            "--consumer.bind", "127.0.0.1", "--broker.address", broker.url, "--etcd.address", etcd,
            "--etcd.prefix", root, "--etcd.lease", "5", "--consumer.watch-delay", "0.01", "--log.level", "info",
        ]
        self.log_path = tmp / f"member-{name}-{self.port}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        self.ngram = wpb_grpc.NGramStub(self.channel)
        self.shards = cpb_grpc.ShardStub(self.channel)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = WAIT) -> None:
        wait_http_ready(self.name, f"http://127.0.0.1:{self.port}", self.proc, self.logs, timeout)

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        """Signal the process (unless it has exited) and wait for its exit; then close the channel
        once the requests in flight through it have ended: answered, or failed, as the process
        decided (its exit fails those it left, at once)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return await asyncio.to_thread(self.proc.wait, 60.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return await asyncio.to_thread(self.proc.wait)
        finally:
            # With a grace: grpc.aio's close cancels the calls still open, and a cancelled call
            # raises asyncio.CancelledError in its caller, so a call sent just before the exit
            # whose failure the channel had yet to see ended its caller's task (the rolling
            # restart's clients then stopped sending, and the test timed out waiting for them).
            await self.channel.close(grace=WAIT)

    def http(self, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(f"{self.url}{path}", data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=WAIT) as resp:
                return resp.status, dict(resp.headers.items()), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers.items()), err.read()


class WordCount:
    """word-count's journals and shards under unique names, and its consume processes."""

    def __init__(self, tmp: Path, broker: BrokerProcess, etcd: str, etcd_client: Any, root: str,
                 client: JournalClient) -> None:
        self.tmp, self.broker, self.etcd, self.etcd_client, self.root = tmp, broker, etcd, etcd_client, root
        self.client = client
        self.prefix = f"test/word-count/{uuid.uuid4().hex[:12]}/"
        self.shards = shard_ids(PARTITIONS, "shard-")
        self.journals = delta_journals(self.prefix, PARTITIONS)
        self.members: dict[str, Member] = {}

    async def create(self, **kwargs: Any) -> None:
        journals, _ = await apply(self.client, self.etcd_client, self.root, self.prefix, partitions=PARTITIONS,
                                  shard_prefix="shard-", hint_prefix=f"/test-hints/{uuid.uuid4().hex}",
                                  max_txn_ms=50, **kwargs)
        for spec in journals:
            await wait_for_primary(self.client, spec.name)

    async def start(self, *names: str) -> None:
        started = [Member(self.tmp, self.broker, self.etcd, self.root, self.prefix, n) for n in names]
        for m in started:
            self.members[m.name] = m
        await asyncio.gather(*(asyncio.to_thread(m.wait_ready) for m in started))

    async def stop(self, name: str, sig: int = signal.SIGTERM) -> int:
        return await self.members.pop(name).stop(sig)

    async def primaries(self, via: Member) -> dict[str, str]:
        """Shard -> the member serving it as PRIMARY (shards with none left out)."""
        listed = await via.shards.List(cpb.ListRequest(), timeout=WAIT)
        out = {}
        for shard in listed.shards:
            r = shard.route
            if 0 <= r.primary < len(r.members) and shard.status[r.primary].code == Code.PRIMARY:
                out[shard.spec.id] = r.members[r.primary].suffix
        return out

    async def wait_primaries(self, via: Member, members: set[str]) -> dict[str, str]:
        """Wait until every shard has a PRIMARY, on exactly `members`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while True:
            got = await self.primaries(via)
            if sorted(got) == self.shards and set(got.values()) == members:
                return got
            if loop.time() > deadline:
                pytest.fail(f"primaries {got}, wanted every shard on {sorted(members)}\n{self.all_logs()}")
            await asyncio.sleep(0.05)

    async def wait_caught_up(self, via: Member) -> None:
        """Gazette's consumertest.WaitForShards: Stat each shard through its source's write head."""
        for shard, journal in zip(self.shards, self.journals, strict=True):
            head = await write_head(self.client, journal)
            resp = await via.shards.Stat(cpb.StatRequest(shard=shard, read_through={journal: head}), timeout=WAIT)
            assert resp.status == cpb.OK, resp

    def all_logs(self) -> str:
        return "\n".join(f"--- {name}:\n{m.logs()[-5000:]}" for name, m in self.members.items())

    async def close(self) -> None:
        await asyncio.gather(*(m.stop(signal.SIGKILL) for m in self.members.values()), return_exceptions=True)


@pytest.fixture
async def word_count(
    tmp_path: Path, broker: BrokerProcess, etcd_endpoint: str, etcd_client: Any, etcd_prefix: str,
    client: JournalClient,
) -> AsyncIterator[WordCount]:
    wc = WordCount(tmp_path, broker, etcd_endpoint, etcd_client, etcd_prefix, client)
    try:
        yield wc
    finally:
        await wc.close()


async def query(member: Member, prefix: str, shard: str = "") -> list[tuple[str, int]]:
    resp = await member.ngram.Query(wpb.QueryRequest(prefix=prefix, shard=shard), timeout=WAIT)
    return [(g.n_gram, g.count) for g in resp.grams]


async def test_publish_and_query(word_count: WordCount) -> None:
    """Gazette's TestPublishAndQuery (4 partitions, N=2), served by two `gazette consume` processes:
    each answers every query, proxying those of the other's shards; the HTTP routes answer too."""
    wc = word_count
    await wc.create()
    await wc.start("wc-a", "wc-b")
    a, b = wc.members["wc-a"], wc.members["wc-b"]
    primaries = await wc.wait_primaries(a, {"wc-a", "wc-b"})

    await a.ngram.Publish(wpb.PublishRequest(text=TEXT), timeout=WAIT)
    await wc.wait_caught_up(a)

    s0, s1 = wc.shards[0], wc.shards[1]
    cases: list[tuple[str, str, list[tuple[str, int]]]] = [
        # Point lookups, implicitly resolved to the shard the n-gram maps to.
        ("START how", "", [("START how", 1)]),
        ("wood chuck", "", [("wood chuck", 2)]),
        ("chuck chuck", "", [("chuck chuck", 1)]),
        ("a wood", "", [("a wood", 2)]),
        ("wood END", "", [("wood END", 1)]),
        # Point lookups with an explicit shard.
        ("START how", s0, []),
        ("START how", s1, [("START how", 1)]),
        # Range lookups with an explicit shard.
        ("wood", s0, [("wood chuck", 2)]),
        ("wood", s1, [("wood END", 1), ("wood would", 1)]),
    ]
    for member in (a, b):  # Whichever member is asked, the shard's primary answers.
        for prefix, shard, expect in cases:
            assert await query(member, prefix, shard) == expect, (member.name, prefix, shard)
    # Every n-gram, once, whichever shard holds it.
    everything: dict[str, int] = {}
    for shard in wc.shards:
        for n_gram, count in await query(b, "", shard):
            assert n_gram not in everything
            everything[n_gram] = count
    expected: dict[str, int] = {}
    for g in n_grams(TEXT, 2):
        expected[g] = expected.get(g, 0) + 1
    assert everything == expected

    # The queries of the other member's shards were proxied: both members serve primaries, and a
    # proxied request is answered by the primary alone (it is not proxied again).
    assert set(primaries.values()) == {"wc-a", "wc-b"}
    remote = next(s for s, m in primaries.items() if m == "wc-b")
    listed = await a.shards.List(cpb.ListRequest(), timeout=WAIT)
    proxied = wpb.QueryRequest(prefix="", shard=remote)
    proxied.header.etcd.CopyFrom(listed.header.etcd)
    proxied.header.process_id.zone, proxied.header.process_id.suffix = "local", "wc-a"
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await a.ngram.Query(proxied, timeout=WAIT)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert refused.value.details() == f"shard {remote}: NOT_SHARD_PRIMARY"
    proxied.header.process_id.suffix = "wc-b"  # A header naming another process is refused.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await a.ngram.Query(proxied, timeout=WAIT)
    assert "ProcessId doesn't match our own" in (refused.value.details() or "")

    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await a.ngram.Query(wpb.QueryRequest(prefix="x", shard="no-such-shard"), timeout=WAIT)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert missing.value.details() == "shard no-such-shard: SHARD_NOT_FOUND"

    # The HTTP routes, on the same port: a publish, then a query proxied (or not) to the primary.
    status, _, body = await asyncio.to_thread(
        b.http, "POST", "/word_count/publish", json.dumps({"text": "Wood chuck!"}).encode(),
        {"Content-Type": "application/json"},
    )
    assert (status, json.loads(body)) == (200, {"published": 4}), body  # START wood, wood chuck, chuck END, END END
    await wc.wait_caught_up(b)
    for member in (a, b):
        status, headers, body = await asyncio.to_thread(member.http, "GET", f"/word_count/query?prefix=wood&shard={s0}")
        assert status == 200 and headers["Content-Type"] == "application/json", body
        assert json.loads(body) == {"grams": [{"n_gram": "wood chuck", "count": 3}]}
    status, _, body = await asyncio.to_thread(a.http, "GET", "/word_count/query?prefix=wood&shard=nope")
    assert (status, body) == (404, b"shard nope: SHARD_NOT_FOUND\n")
    status, headers, body = await asyncio.to_thread(a.http, "PUT", "/word_count/query")
    assert status == 405 and headers["Allow"] == "GET, HEAD", body
    status, _, body = await asyncio.to_thread(
        a.http, "POST", "/word_count/publish", b"{", {"Content-Type": "application/json"})
    assert status == 400 and body.startswith(b'expected a JSON object {"text": "..."}'), body
    # The consumer's own routes and gRPC service are unchanged.
    status, _, body = await asyncio.to_thread(a.http, "GET", "/debug/ready")
    assert (status, body) == (200, b"ok")

    codes = {name: await wc.stop(name) for name in list(wc.members)}
    assert codes == {"wc-a": 0, "wc-b": 0}


async def test_rolling_restart_fails_no_query_and_loses_no_count(word_count: WordCount) -> None:
    """Every member of three is SIGTERMed in turn and replaced while clients keep publishing and
    querying every shard, through whichever members a load balancer would route to: the member
    being stopped until a moment after its SIGTERM (as a readiness check lags), and its replacement
    as soon as it is ready. A request a member could not take (its port closed: it is gone) goes to
    the next member, as a load balancer's retry; any request a member answered with an error fails
    the test. No request fails, queries never see a count go back, every publish is counted exactly."""
    wc = word_count
    await wc.create()
    await wc.start("roll-a", "roll-b", "roll-c")
    await wc.wait_primaries(wc.members["roll-a"], {"roll-a", "roll-b", "roll-c"})

    routed: list[Member] = list(wc.members.values())  # The load balancer's members, in rotation.
    stopping: set[str] = set()  # Members SIGTERMed: one that is gone (its port closed) is skipped.
    turn = 0
    stop = asyncio.Event()
    published = answered = skipped = 0
    failures: list[str] = []
    counted: dict[str, int] = {}  # Each shard's last total, which must never go back.

    def gone(member: Member, exc: grpc.aio.AioRpcError) -> bool:
        """Whether the request never reached a handler of `member`, a stopping member: its port is
        closed; or its gRPC server, stopping, cancelled the call before handing it to a handler
        (grpcio cancels such calls at once; a handler that began runs on for the stop's grace); or
        the call was sent as the server said GOAWAY and its connection closed with the call still
        open (a call a handler took holds the connection open until it is answered, for up to the
        stop's grace, which no member here comes near). A load balancer retries all three (Envoy:
        retry_on `cancelled`, `reset`); were such a Publish counted after all, the exact counts
        asserted below would exceed the publishes."""
        details = exc.details() or ""
        if member.name not in stopping:
            return False
        if exc.code() == grpc.StatusCode.CANCELLED:
            return True
        return exc.code() == grpc.StatusCode.UNAVAILABLE and (
            "Connection refused" in details or "failed to connect" in details.lower()
            or "GOAWAY received" in details)

    async def request(what: str, call: Callable[[Member], Awaitable[Any]]) -> Any:
        """`call` through the next member in rotation, on to the next one while it meets a gone member."""
        nonlocal turn, skipped
        for _ in range(10):
            member = routed[turn % len(routed)]
            turn += 1
            try:
                return await call(member)
            except grpc.aio.AioRpcError as exc:
                if gone(member, exc):
                    skipped += 1
                    continue
                failures.append(f"{what} via {member.name}: {exc.code().name}: {exc.details()}")
                return None
        failures.append(f"{what}: no member took it")
        return None

    async def publishing() -> None:
        nonlocal published
        while not stop.is_set():
            if await request("Publish", lambda m: m.ngram.Publish(wpb.PublishRequest(text=TEXT), timeout=WAIT)):
                published += 1
            await asyncio.sleep(0.02)

    async def querying() -> None:
        nonlocal answered
        i = 0
        while not stop.is_set():
            shard = wc.shards[i % len(wc.shards)]  # Each shard in turn, wherever its primary is.
            i += 1
            req = wpb.QueryRequest(prefix="", shard=shard)
            resp = await request(f"Query {shard}", lambda m, r=req: m.ngram.Query(r, timeout=WAIT))
            if resp is not None:
                total = sum(g.count for g in resp.grams)
                if total < counted.get(shard, 0):
                    failures.append(f"the counts of {shard} went from {counted[shard]} to {total}")
                counted[shard] = max(total, counted.get(shard, 0))
                answered += 1
            await asyncio.sleep(0.01)

    async def served_since(before: tuple[int, int], what: str) -> None:
        deadline = asyncio.get_running_loop().time() + WAIT
        while published < before[0] + 2 or answered < before[1] + 4:
            for client in clients:  # A client ends only once stopped: one that ended sends no more.
                if client.done():
                    why = "cancelled" if client.cancelled() else repr(client.exception())
                    pytest.fail(f"the {client.get_name()} client ended {what}: {why}; failures {failures}")
            assert asyncio.get_running_loop().time() < deadline, (
                f"no requests answered {what}: {published - before[0]} publishes and "
                f"{answered - before[1]} queries; failures {failures}")
            await asyncio.sleep(0.02)

    clients = [asyncio.create_task(publishing(), name="Publish"), asyncio.create_task(querying(), name="Query")]
    stopped: list[Member] = []
    serial = 0
    timings: list[str] = []
    try:
        await served_since((0, 0), "at the start")
        for name in ["roll-a", "roll-b", "roll-c"]:
            serial += 1
            member = wc.members.pop(name)
            stopped.append(member)
            t0 = time.monotonic()
            during = (published, answered)
            stopping.add(name)
            member.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)  # Requests keep reaching it, as a readiness check takes a moment.
            routed.remove(member)
            await asyncio.to_thread(member.proc.wait, 60.0)
            assert await member.stop() == 0, f"{name} did not exit cleanly\n{member.logs()[-5000:]}"
            timings.append(f"{name} stopped in {time.monotonic() - t0:.1f}s "
                           f"({published - during[0]} publishes, {answered - during[1]} queries meanwhile)")
            replacement = f"{name}-{serial}"
            t0 = time.monotonic()
            during = (published, answered)
            await wc.start(replacement)
            routed.append(wc.members[replacement])
            await wc.wait_primaries(wc.members[replacement], set(wc.members))
            timings.append(f"{replacement} started and serving in {time.monotonic() - t0:.1f}s "
                           f"({published - during[0]} publishes, {answered - during[1]} queries meanwhile)")
            await served_since((published, answered), f"after {name} was replaced")
    except BaseException:
        print(*timings, sep="\n")
        print(*(f"--- {m.name} (stopped):\n{m.logs()[-5000:]}" for m in stopped), wc.all_logs(), sep="\n")
        raise
    finally:
        stop.set()
        ends = await asyncio.gather(*clients, return_exceptions=True)  # Not to hide a failure above.
    assert ends == [None, None], f"a client ended in error: {ends}"
    print(*timings, f"{published} publishes, {answered} queries, {skipped} sent on past a gone member",
          sep="\n")
    assert not failures, failures
    assert published >= 8 and answered >= 16  # What each served_since above waited for, four times over.

    member = next(iter(wc.members.values()))
    await wc.wait_caught_up(member)
    expected: dict[str, int] = {}
    for g in n_grams(TEXT, 2):
        expected[g] = expected.get(g, 0) + published
    everything: dict[str, int] = {}
    for shard in wc.shards:
        everything.update(dict(await query(member, "", shard)))
    assert everything == expected
    codes = {name: await wc.stop(name) for name in list(wc.members)}
    assert set(codes.values()) == {0}, codes


async def test_command_line_apply_publish_and_query(word_count: WordCount, etcd_endpoint: str) -> None:
    """`python -m examples.word_count apply|publish|query`, against a `gazette consume` process."""
    wc = word_count
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    async def run(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "examples.word_count", *args, cwd=ROOT, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), WAIT)
        return await proc.wait(), out.decode()

    code, out = await run("apply", "--broker.address", wc.broker.url, "--etcd.address", etcd_endpoint,
                          "--etcd.prefix", wc.root, "--prefix", wc.prefix, "--hint-prefix",
                          f"/test-hints/{uuid.uuid4().hex}")
    assert code == 0, out
    shards = shard_ids(PARTITIONS)
    assert out.splitlines() == [
        *(f"journal {j}" for j in wc.journals),
        *(f"journal {wc.prefix}recovery/logs/{s}" for s in shards),
        *(f"shard {s} <- {j}" for s, j in zip(shards, wc.journals, strict=True)),
    ]
    await wc.start("cli-a")
    member = wc.members["cli-a"]
    wc.shards = shards
    await wc.wait_primaries(member, {"cli-a"})
    address = ("--consumer.address", member.url)
    code, out = await run("publish", *address, TEXT)
    assert code == 0, out
    await wc.wait_caught_up(member)
    code, out = await run("query", *address, "wood chuck")
    assert (code, out) == (0, "2\twood chuck\n")
    code, out = await run("query", *address, "wood", "--shard", shards[1])
    assert (code, out) == (0, "1\twood END\n1\twood would\n")
    code, out = await run("query", *address, "x", "--shard", "nope")
    assert (code, out) == (1, "error: NOT_FOUND: shard nope: SHARD_NOT_FOUND\n")
    code, out = await run("bogus")
    assert code == 2 and "usage: python -m examples.word_count {apply|publish|query}" in out


async def test_a_call_open_as_a_member_stops_fails_as_its_exit_decides(word_count: WordCount) -> None:
    """Member.stop closes the member's channel only once the calls open through it have ended. A
    call sent just as stop() waits for an exit the channel has yet to see fails UNAVAILABLE, as a
    load balancer would see it; were it cancelled by the close (grpc.aio's close cancels the calls
    still open), its caller would get asyncio.CancelledError: the rolling restart's client task
    that sent it ended so, and the test timed out waiting for its requests."""
    wc = word_count
    await wc.start("stop-harness")
    member = wc.members.pop("stop-harness")
    assert await member.stop(signal.SIGKILL) == -signal.SIGKILL
    open_at_close = 0
    for _ in range(10):  # Each on a fresh channel (stop() closed the last) to the exited member.
        member.channel = grpc.aio.insecure_channel(f"127.0.0.1:{member.port}")
        member.ngram = wpb_grpc.NGramStub(member.channel)
        call = asyncio.ensure_future(member.ngram.Query(wpb.QueryRequest(prefix=""), timeout=WAIT))
        await asyncio.sleep(0)  # Sent.
        stopping = asyncio.ensure_future(member.stop())
        await asyncio.sleep(0)
        open_at_close += not call.done()
        assert await stopping == -signal.SIGKILL
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
        except asyncio.CancelledError:
            raise AssertionError("the call was cancelled by the channel's close") from None
        else:
            raise AssertionError("an exited member answered")
    assert open_at_close, "no call was still open as stop() began: nothing was tried"
