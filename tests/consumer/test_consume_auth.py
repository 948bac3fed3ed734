"""Authorization of `gazette consume`: a real broker started with `--broker.auth-keys`, a real
consumer process started with `--consumer.auth-keys` (its Shard API) and `--broker.auth-keys` (to
sign its own calls to the broker), driven with tokens over gRPC and through gazctl.
"""

from __future__ import annotations

import asyncio
import base64
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from broker.client import AppendService, Credentials, JournalClient
from broker.protocol.auth import Capability, Claims, KeyedAuth
from broker.protocol.selectors import parse_selector
from consumer.protocol import pb as cpb
from consumer.protocol import pb_grpc as cpb_grpc
from tests.consumer.test_consume_cli import ConsumerProcess, publish, run_consume, stat_through
from tests.support.apps import NDJSON, create_tables, read_counts
from tests.support.harness import BrokerProcess, journal_spec, one_line_error, run_gazctl
from tests.support.journals import create_journal, unique

BROKER_KEY = base64.b64encode(b"the brokers' key, 32 bytes long!").decode()
CONSUMER_KEY = base64.b64encode(b"the consumers' key, 32 bytes...!").decode()
CONSUMERS = KeyedAuth(CONSUMER_KEY)


def bearer(cap: int, selector: str = "", auth: KeyedAuth = CONSUMERS) -> tuple[tuple[str, str]]:
    claims = Claims(cap, parse_selector(selector)) if selector else Claims(cap)
    return (("authorization", f"Bearer {auth.sign(claims)}"),)


@pytest.fixture(scope="module")
def auth_broker(etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("auth-broker"), etcd_endpoint, f"/test/{uuid.uuid4().hex}",
                         "--broker.auth-keys", BROKER_KEY)
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.logs()


async def test_shard_api_and_gazctl_shards_with_tokens(
    auth_broker: BrokerProcess, etcd_endpoint: str, tmp_path: Path
) -> None:
    credentials = Credentials.of(keys=BROKER_KEY)
    async with JournalClient(auth_broker.url, credentials=credentials) as client, AppendService(client) as appender:
        source = journal_spec(unique("auth-cli/src"), content_type=NDJSON)
        await create_journal(client, source)
        db = tmp_path / "counts.db"
        create_tables(db)
        consumer = ConsumerProcess(tmp_path, auth_broker, etcd_endpoint, f"/test/{uuid.uuid4().hex}", db, "auth-one",
                                   "--consumer.auth-keys", CONSUMER_KEY, "--broker.auth-keys", BROKER_KEY)
        try:
            await asyncio.to_thread(consumer.wait_ready)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{consumer.port}") as channel:
                stub = cpb_grpc.ShardStub(channel)
                spec = cpb.ShardSpec(id="auth-shard", max_txn_duration=Duration(nanos=100_000_000))
                spec.sources.add(journal=source.name)
                spec.labels.labels.add(name="app", value="counter")
                apply = cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=spec)])

                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.List(cpb.ListRequest())
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert "missing or empty Authorization token" in (info.value.details() or "")
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Apply(apply, metadata=bearer(Capability.ALL, auth=KeyedAuth(BROKER_KEY)))
                assert "signature is invalid" in (info.value.details() or ""), "a broker's token is not a consumer's"
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Apply(apply, metadata=bearer(Capability.APPLY, "app=other"))
                assert info.value.details() == "not authorized to auth-shard"
                assert (await stub.Apply(apply, metadata=bearer(Capability.APPLY, "app=counter"))).status == cpb.OK

                # The consumer reads and publishes through the broker with its own signed tokens.
                head = await publish(appender, source.name, "a", "b", "a")

                async def stat() -> cpb.StatResponse:
                    authorized = cpb_grpc.ShardStub(channel)
                    authorized = Credentials.of(token=CONSUMERS.sign(Claims(Capability.READ))).authorize(authorized)
                    return await stat_through(authorized, "auth-shard", source.name, head)

                assert (await stat()).read_through[source.name] >= head
                assert read_counts(db) == {"a": 2, "b": 1}

                # A token of another selector sees no such shard, and may not unassign it.
                other = bearer(Capability.READ | Capability.LIST | Capability.APPLY, "app=other")
                assert (await stub.Stat(cpb.StatRequest(shard="auth-shard"), metadata=other)).status \
                    == cpb.SHARD_NOT_FOUND
                assert (await stub.GetHints(cpb.GetHintsRequest(shard="auth-shard"), metadata=other)).status \
                    == cpb.SHARD_NOT_FOUND
                assert not (await stub.List(cpb.ListRequest(), metadata=other)).shards
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Unassign(cpb.UnassignRequest(shards=["auth-shard"]), metadata=other)
                assert info.value.details() == "not authorized to auth-shard"
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.List(cpb.ListRequest(), metadata=bearer(Capability.READ))
                assert "missing required LIST capability" in (info.value.details() or "")

            env = {"CONSUMER_ADDRESS": consumer.url}
            refused = await asyncio.to_thread(run_gazctl, None, "shards", "list", env=env)
            one_line_error(refused, "UNAUTHENTICATED", "missing or empty Authorization token")
            minted = await asyncio.to_thread(run_gazctl, None, "auth", "token", "-c", "LIST", "--keys", CONSUMER_KEY)
            listed = await asyncio.to_thread(
                run_gazctl, None, "--consumer.auth-token", minted.stdout.strip(), "shards", "list", env=env
            )
            assert listed.returncode == 0 and "auth-shard" in listed.stdout and "PRIMARY" in listed.stdout, \
                listed.stderr
            # `--lag` also reads the brokers' write heads: the broker's credentials are separate.
            lag = await asyncio.to_thread(
                run_gazctl, auth_broker, "shards", "list", "--lag",
                env={**env, "CONSUMER_AUTH_KEYS": CONSUMER_KEY, "BROKER_AUTH_KEYS": BROKER_KEY},
            )
            assert lag.returncode == 0 and source.name in lag.stdout, lag.stderr
        finally:
            rc = await asyncio.to_thread(consumer.stop, signal.SIGTERM)
        logs = consumer.logs()
        assert rc == 0, logs
        assert "Traceback" not in logs


def test_consume_refuses_keys_that_do_not_decode() -> None:
    done = run_consume("consume", "tests.support.cli_apps:app", "--consumer.auth-keys", "%%%",
                       "--etcd.address", "http://127.0.0.1:1")
    assert done.returncode == 2 and "--consumer.auth-keys" in done.stderr and "failed to decode auth key" in \
        done.stderr, done.stderr
    assert "Traceback" not in done.stderr
