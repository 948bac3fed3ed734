"""Authorization of two real brokers started with `--broker.auth-keys` (issue 18's auth matrix):
every RPC over gRPC and HTTP with no token, a bad signature, an expired token, a token of another
selector, and each capability alone; List and Apply hide and refuse journals outside the token's
selector; a Replicate stream without the cluster's key is refused while the brokers' own
replication and proxying (signed by the brokers) work; gazctl and the client library with tokens.
"""

from __future__ import annotations

import asyncio
import base64
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.client import Credentials, JournalClient, Reader, RetryReader, TransportError, append, list_journals
from broker.protocol import pb, pb_grpc
from broker.protocol.auth import Capability, Claims, KeyedAuth
from broker.protocol.selectors import parse_selector
from tests.support.harness import BrokerProcess, journal_spec, one_line_error, run_gazctl

KEY = base64.b64encode(b"a test key of thirty-two bytes!!").decode()
OTHER_KEY = base64.b64encode(b"another key, which brokers lack!").decode()
AUTH = KeyedAuth(KEY)
PREFIX = f"auth-{uuid.uuid4().hex[:8]}/"
TEAM_A = f"{PREFIX}a/one"
TEAM_B = f"{PREFIX}b/two"
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED


def token(cap: int, selector: str = "", ttl: float = 600, *, auth: KeyedAuth = AUTH, now: float | None = None) -> str:
    claims = Claims(cap, parse_selector(selector)) if selector else Claims(cap)
    return auth.sign(claims, ttl, now=now)


def bearer(tok: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {tok}"),)


ADMIN = token(Capability.ALL)


class Cluster:
    def __init__(self, brokers: list[BrokerProcess]) -> None:
        self.brokers = brokers
        self.channels = [grpc.insecure_channel(b.target) for b in brokers]
        self.stubs = [pb_grpc.JournalStub(c) for c in self.channels]

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


@pytest.fixture(scope="module")
def cluster(etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("auth")
    prefix = f"/test/{uuid.uuid4().hex}"
    brokers = [BrokerProcess(tmp, etcd_endpoint, prefix, "--broker.auth-keys", KEY) for _ in range(2)]
    found = Cluster([b.wait_ready() for b in brokers])
    try:
        stub = found.stubs[0]
        changes = [
            pb.ApplyRequest.Change(upsert=journal_spec(TEAM_A, replication=2, team="a"), expect_mod_revision=0),
            pb.ApplyRequest.Change(upsert=journal_spec(TEAM_B, replication=2, team="b"), expect_mod_revision=0),
        ]
        assert stub.Apply(pb.ApplyRequest(changes=changes), metadata=bearer(ADMIN)).status == pb.OK
        deadline = time.monotonic() + 30
        while True:  # Both journals routed to both brokers (the brokers sign their own Replicate calls).
            listed = [j for r in stub.List(pb.ListRequest(), metadata=bearer(ADMIN)) for j in r.journals]
            if len(listed) == 2 and all(len(j.route.members) == 2 and j.route.primary >= 0 for j in listed):
                break
            assert time.monotonic() < deadline, listed
            time.sleep(0.1)
        yield found
    finally:
        found.close()
        for b in brokers:
            assert b.stop() == 0, b.logs()
    for b in brokers:
        assert "Traceback" not in b.logs(), b.logs()


def expect_code(call: Callable[[], Any], code: grpc.StatusCode, *texts: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == code, info.value
    for text in texts:
        assert text in info.value.details(), info.value.details()


def append_request_stream(journal: str, content: bytes) -> Iterator[pb.AppendRequest]:
    yield pb.AppendRequest(journal=journal)
    yield pb.AppendRequest(content=content)
    yield pb.AppendRequest()


def replicate_stream(journal: str) -> Iterator[pb.ReplicateRequest]:
    yield pb.ReplicateRequest(proposal=pb.Fragment(journal=journal, begin=0, end=0), acknowledge=True)


# Each RPC as a call taking metadata, with the capability it needs.
def rpcs(stub: pb_grpc.JournalStub, journal: str) -> dict[str, tuple[int, Callable[[Any], Any]]]:
    return {
        "List": (Capability.LIST, lambda md: list(stub.List(pb.ListRequest(), metadata=md))),
        "Apply": (Capability.APPLY, lambda md: stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(
            upsert=journal_spec(journal, replication=2, team=journal.split("/")[1]), expect_mod_revision=-1,
        )]), metadata=md)),
        "Read": (Capability.READ, lambda md: list(stub.Read(
            pb.ReadRequest(journal=journal, offset=0, block=False, metadata_only=True), metadata=md))),
        "Append": (Capability.APPEND, lambda md: stub.Append(append_request_stream(journal, b"x\n"), metadata=md)),
        "Replicate": (Capability.REPLICATE, lambda md: list(stub.Replicate(replicate_stream(journal), metadata=md))),
        "ListFragments": (Capability.READ, lambda md: stub.ListFragments(
            pb.FragmentsRequest(journal=journal), metadata=md)),
        "FragmentStoreHealth": (Capability.READ, lambda md: stub.FragmentStoreHealth(
            pb.FragmentStoreHealthRequest(fragment_store="file:///"), metadata=md)),
    }


@pytest.mark.parametrize("rpc", ["List", "Apply", "Read", "Append", "Replicate", "ListFragments",
                                 "FragmentStoreHealth"])
def test_every_rpc_refuses_a_missing_forged_or_expired_token(cluster: Cluster, rpc: str) -> None:
    _, call = rpcs(cluster.stubs[0], TEAM_A)[rpc]
    expect_code(lambda: call(None), UNAUTHENTICATED, "missing or empty Authorization token")
    expect_code(lambda: call((("authorization", "Basic dXNlcjpwdw=="),)), UNAUTHENTICATED, "expected 'Bearer'")
    expect_code(lambda: call(bearer("not.a.jwt")), UNAUTHENTICATED, "token is malformed")
    forged = token(Capability.ALL, auth=KeyedAuth(OTHER_KEY))
    expect_code(lambda: call(bearer(forged)), UNAUTHENTICATED, "signature is invalid")
    expired = token(Capability.ALL, ttl=60, now=time.time() - 3600)
    expect_code(lambda: call(bearer(expired)), UNAUTHENTICATED, "token has expired")


@pytest.mark.parametrize("cap", [Capability.LIST, Capability.APPLY, Capability.READ, Capability.APPEND,
                                 Capability.REPLICATE])
def test_each_capability_alone_grants_only_its_rpcs(cluster: Cluster, cap: Capability) -> None:
    md = bearer(token(cap))
    for name, (needed, call) in rpcs(cluster.stubs[0], TEAM_A).items():
        if needed == cap:
            if name == "Replicate":
                # Granted, but a client is no primary: the stream is refused on its merits, not on its token.
                expect_code(lambda call=call: call(md), grpc.StatusCode.FAILED_PRECONDITION)
            else:
                call(md)
        else:
            assert needed is not None and needed.name is not None
            expect_code(lambda call=call: call(md), UNAUTHENTICATED,
                        f"authorization is missing required {needed.name} capability")


def test_a_token_for_another_selector_sees_no_journal_outside_it(cluster: Cluster) -> None:
    stub = cluster.stubs[0]
    team_a = f"team=a,prefix={PREFIX}"
    everything = Capability.LIST | Capability.READ | Capability.APPEND | Capability.APPLY
    md = bearer(token(everything, team_a))
    listed = [j.spec.name for r in stub.List(pb.ListRequest(), metadata=md) for j in r.journals]
    assert listed == [TEAM_A]

    # Outside the selector a journal is as one that does not exist.
    [read] = list(stub.Read(pb.ReadRequest(journal=TEAM_B, block=False, metadata_only=True), metadata=md))
    assert read.status == pb.JOURNAL_NOT_FOUND and not read.header.route.members
    assert stub.Append(append_request_stream(TEAM_B, b"no\n"), metadata=md).status == pb.JOURNAL_NOT_FOUND
    assert stub.ListFragments(pb.FragmentsRequest(journal=TEAM_B), metadata=md).status == pb.JOURNAL_NOT_FOUND
    assert stub.Append(append_request_stream(TEAM_A, b"yes\n"), metadata=md).status == pb.OK

    # Apply: an upsert is authorized by all its labels, a delete by its name.
    def upsert(name: str, team: str) -> pb.ApplyRequest:
        spec = journal_spec(name, replication=2, team=team)
        return pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=-1)])

    expect_code(lambda: stub.Apply(upsert(TEAM_B, "b"), metadata=md), UNAUTHENTICATED, f"not authorized to {TEAM_B}")
    expect_code(lambda: stub.Apply(upsert(TEAM_A, "b"), metadata=md), UNAUTHENTICATED, f"not authorized to {TEAM_A}")
    delete = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(delete=TEAM_B, expect_mod_revision=-1)])
    expect_code(lambda: stub.Apply(delete, metadata=md), UNAUTHENTICATED, f"not authorized to {TEAM_B}")
    assert stub.Apply(upsert(TEAM_A, "a"), metadata=md).status == pb.OK
    names = {j.spec.name for r in stub.List(pb.ListRequest(), metadata=bearer(ADMIN)) for j in r.journals}
    assert names == {TEAM_A, TEAM_B}, "the refused delete deleted nothing"

    # A `name` selector names exactly one journal, on both brokers (proxied reads carry the broker's token).
    only_b = bearer(token(Capability.READ, f"name={TEAM_B}"))
    for peer in cluster.stubs:
        [resp, *_] = list(peer.Read(pb.ReadRequest(journal=TEAM_B, block=False, metadata_only=True), metadata=only_b))
        assert resp.status in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE), resp
        [resp] = list(peer.Read(pb.ReadRequest(journal=TEAM_A, block=False, metadata_only=True), metadata=only_b))
        assert resp.status == pb.JOURNAL_NOT_FOUND


def test_replicate_needs_the_clusters_key_while_brokers_replicate_and_proxy(cluster: Cluster) -> None:
    # Whatever a client's token grants but REPLICATE, it cannot feed a replica.
    md = bearer(token(Capability.ALL & ~Capability.REPLICATE))
    for peer in cluster.stubs:
        expect_code(lambda peer=peer: list(peer.Replicate(replicate_stream(TEAM_A), metadata=md)), UNAUTHENTICATED,
                    "missing required REPLICATE capability")
        expect_code(lambda peer=peer: list(peer.Replicate(replicate_stream(TEAM_A))), UNAUTHENTICATED)

    # Appends to a journal replicated on both brokers commit through either (one proxies to the
    # primary; the primary replicates to the other): both are signed by the brokers themselves.
    appender = bearer(token(Capability.APPEND | Capability.READ, f"name={TEAM_B}"))
    ends = []
    for i, peer in enumerate(cluster.stubs):
        resp = peer.Append(append_request_stream(TEAM_B, f"via {i}\n".encode()), metadata=appender)
        assert resp.status == pb.OK, resp
        ends.append(resp.commit.end)
    for peer in cluster.stubs:
        content = b"".join(r.content for r in peer.Read(
            pb.ReadRequest(journal=TEAM_B, offset=0, block=False), metadata=appender))
        assert b"via 0\n" in content and b"via 1\n" in content and len(content) == max(ends)


def test_http_gateway_answers_401_without_a_valid_token(cluster: Cluster) -> None:
    url = f"{cluster.brokers[1].url}/{TEAM_A}"

    def request(method: str, tok: str | None, body: bytes | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(url, data=body, method=method)
        if tok is not None:
            req.add_header("Authorization", f"Bearer {tok}")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    status, body = request("GET", None)
    assert status == 401 and b"missing or empty Authorization token" in body
    status, body = request("PUT", token(Capability.READ), b"refused\n")
    assert status == 401 and b"missing required APPEND capability" in body
    status, body = request("GET", token(Capability.READ, f"name={TEAM_B}"))
    assert status == 404, body  # Outside the selector: not found.
    status, _ = request("PUT", token(Capability.APPEND, f"name={TEAM_A}"), b"over http\n")
    assert status == 204
    status, body = request("GET", token(Capability.READ, f"name={TEAM_A}"))
    assert status == 206 and body.endswith(b"over http\n")  # Partial Content: a read to the head.
    assert request("GET", None)[0] == 401


def test_client_library_presents_tokens_and_self_signs_with_keys(cluster: Cluster, tmp_path: Path) -> None:
    async def main() -> None:
        scoped = Credentials.of(token=token(Capability.ALL, f"prefix={PREFIX}a/"))
        async with JournalClient(cluster.brokers[0].url, credentials=scoped) as client:
            assert [j.spec.name for j in (await list_journals(client)).journals] == [TEAM_A]
            written = await append(client, TEAM_A, b"from the library\n")
            async with Reader(client, TEAM_A, offset=written.commit.begin, block=False) as reader:
                assert await reader.read() == b"from the library\n"
        async with JournalClient(cluster.brokers[1].url, credentials=Credentials.of(keys=KEY)) as client:
            assert {j.spec.name for j in (await list_journals(client)).journals} == {TEAM_A, TEAM_B}
        async with JournalClient(cluster.brokers[1].url, credentials=Credentials()) as client:
            with pytest.raises(Exception, match="missing or empty Authorization token"):
                await list_journals(client)
            with pytest.raises(TransportError, match="missing or empty Authorization token"):
                await append(client, TEAM_A, b"refused\n")
        # A refused token is not retried: a RetryReader fails rather than spin.
        async with JournalClient(cluster.brokers[0].url, credentials=Credentials.of(token=token(Capability.LIST))) \
                as client:
            reader = RetryReader(client, TEAM_A, offset=0, block=True)
            with pytest.raises(TransportError, match="missing required READ capability"):
                async with asyncio.timeout(10):
                    await reader.read()
            await reader.close()

    asyncio.run(main())


def test_gazctl_with_a_token_flag_environment_keys_and_minted_tokens(cluster: Cluster, tmp_path: Path) -> None:
    broker = cluster.brokers[0]
    done = run_gazctl(broker, "journals", "list", "-l", f"prefix={PREFIX}")
    one_line_error(done, "missing or empty Authorization token")

    minted = run_gazctl(None, "auth", "token", "-c", "LIST,READ,APPEND", "-l", f"team=a,prefix={PREFIX}",
                        "--keys", KEY)
    assert minted.returncode == 0, minted.stderr
    scoped = minted.stdout.strip()
    listed = run_gazctl(broker, "--broker.auth-token", scoped, "journals", "list", "-l", f"prefix={PREFIX}",
                        "--format", "json")
    assert listed.returncode == 0, listed.stderr
    assert TEAM_A in listed.stdout and TEAM_B not in listed.stdout

    appended = run_gazctl(broker, "journals", "append", "-l", f"name={TEAM_A}", input="from gazctl\n",
                          env={"BROKER_AUTH_TOKEN": scoped})
    assert appended.returncode == 0, appended.stderr
    read = run_gazctl(broker, "journals", "read", "-l", f"name={TEAM_A}", env={"BROKER_AUTH_TOKEN": scoped})
    assert read.returncode == 0 and read.stdout.endswith("from gazctl\n"), read.stderr

    refused = run_gazctl(broker, "journals", "append", "-l", f"name={TEAM_B}", input="no\n",
                         env={"BROKER_AUTH_TOKEN": scoped})
    assert refused.returncode == 1  # TEAM_B is invisible to the token: the selector matches no journal.

    # With the keys themselves (as an operator would), gazctl signs its own tokens.
    listed = run_gazctl(broker, "--broker.auth-keys", KEY, "journals", "list", "-l", f"prefix={PREFIX}")
    assert listed.returncode == 0 and TEAM_A in listed.stdout and TEAM_B in listed.stdout, listed.stderr
    ini = tmp_path / "gazctl.ini"
    ini.write_text(f"[journals.Broker]\nAuthKeys = {KEY}\n")
    listed = run_gazctl(broker, "journals", "list", "-l", f"prefix={PREFIX}", cwd=tmp_path)
    assert listed.returncode == 0 and TEAM_B in listed.stdout, listed.stderr


def test_the_allow_missing_key_admits_requests_without_a_token(etcd_endpoint: str, tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path, etcd_endpoint, f"/test/{uuid.uuid4().hex}", "--broker.auth-keys", f"{KEY},AA==")
    try:
        proc.wait_ready()
        channel, stub = proc.stub()
        with channel:
            assert next(iter(stub.List(pb.ListRequest()))).status == pb.OK  # No token: admitted.
            forged = token(Capability.ALL, auth=KeyedAuth(OTHER_KEY))
            expect_code(lambda: list(stub.List(pb.ListRequest(), metadata=bearer(forged))), UNAUTHENTICATED,
                        "signature is invalid")  # A token that is presented must still verify.
    finally:
        assert proc.stop() == 0, proc.logs()


def test_serve_refuses_keys_that_do_not_decode(etcd_endpoint: str, tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path, etcd_endpoint, "/test/bad-keys", "--broker.auth-keys", "not base64!")
    rc = proc.proc.wait(30)
    proc.stop()
    logs = proc.logs()
    assert rc == 2 and "--broker.auth-keys" in logs and "failed to decode auth key at index 0" in logs, logs
    assert "Traceback" not in logs
