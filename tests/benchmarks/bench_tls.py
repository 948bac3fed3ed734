"""What TLS costs a broker: the same phases against two brokers of one etcd, one plain and one with
`--broker.server-cert-file`, `--broker.server-cert-key-file` and `--broker.server-ca-file` (so the
client presents a certificate, as with mutual TLS in production).

Per broker, from one grpc.aio client (with the test CA and client certificate for the TLS one):
1 MiB appends (one Append per chunk, sequential and 4 in flight), a non-blocking Read of what was
appended, and 4 KiB appends from 16 closed-loop writers through one AppendService (rate and p50 /
p99). The phases alternate between the brokers round by round, and the best round of each is
reported, with the TLS/plain ratio. (Plain gRPC crosses the listener in the kernel with splice(2);
over TLS the listener decrypts and relays in Python: that difference is most of the cost.)

With `--auth` the TLS broker also has `--broker.auth-keys` and every call carries a token (issue
18's "auth and TLS on, beside the same run without").

    python -m tests.benchmarks.bench_tls [--mib 128] [--rounds 3] [--writers 16] [--small-appends 4000] [--auth]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from broker.client import AppendService, Credentials, JournalClient
from broker.protocol import pb, pb_grpc
from broker.protocol.auth import Capability, Claims, KeyedAuth
from tests.benchmarks.bench_broker import (
    CHANNEL_OPTIONS,
    CHUNK,
    MB,
    POOL_CHUNKS,
    Latency,
    append_once,
    append_rpc,
    append_shape,
    bench_spec,
    chunks_of,
    closed_loop,
    content_requests,
    make_content,
    read_range,
)
from tests.benchmarks.stack import log
from tests.support.harness import BrokerProcess, apply_specs, free_port, wait_for_primary
from tests.support.tls_certs import PKI, TLSBroker, make_pki

MiB = 1 << 20
AUTH_KEY = base64.b64encode(b"the bench_tls key of 32 bytes..!").decode()
AUTH = {"on": False}


@dataclass
class Figures:
    append: dict[str, float] = field(default_factory=dict)  # shape -> best B/s
    read: float = 0.0
    small: Latency | None = None


def channel_of(broker: BrokerProcess, pki: PKI) -> grpc.aio.Channel:
    if isinstance(broker, TLSBroker):
        creds = grpc.ssl_channel_credentials(
            root_certificates=pki.ca.read_bytes(), private_key=pki.client_key.read_bytes(),
            certificate_chain=pki.client_cert.read_bytes(),
        )
        if AUTH["on"]:  # Every call carries `authorization: Bearer <token>`.
            token = KeyedAuth(AUTH_KEY).sign(Claims(Capability.ALL), 3600)
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
        return grpc.aio.secure_channel(broker.target, creds, options=CHANNEL_OPTIONS)
    return grpc.aio.insecure_channel(broker.target, options=CHANNEL_OPTIONS)


def credentials_of(broker: BrokerProcess, pki: PKI) -> Credentials:
    if isinstance(broker, TLSBroker):
        return Credentials.of(cert_file=str(pki.client_cert), key_file=str(pki.client_key), ca_file=str(pki.ca),
                              keys=AUTH_KEY if AUTH["on"] else "")
    return Credentials()


async def one_round(
    args: argparse.Namespace, broker: BrokerProcess, pki: PKI, reqs: list[bytes], small: list[bytes], figures: Figures
) -> None:
    count = max(1, args.mib * MiB // CHUNK)
    async with channel_of(broker, pki) as channel:
        await channel.channel_ready()
        rpc = append_rpc(channel)
        head = await append_once(rpc, "bench/none", iter(reqs[:2]))  # Warm up the connection.
        for shape in ("serial", "inflight"):
            rate, head = await append_shape(rpc, "bench/none", reqs, count, shape, 4)
            figures.append[shape] = max(figures.append.get(shape, 0.0), rate)
        rate, _, _ = await read_range(pb_grpc.JournalStub(channel), "bench/none", head)
        figures.read = max(figures.read, rate)
    async with JournalClient(broker.url, credentials=credentials_of(broker, pki)) as client:
        async with AppendService(client) as service:

            async def op(i: int) -> None:
                await service.append("bench/small", small[i % len(small)])

            await closed_loop(op, args.writers, args.writers * 10)
            latency = await closed_loop(op, args.writers, args.small_appends)
    if figures.small is None or latency.rate > figures.small.rate:
        figures.small = latency


def report(plain: Figures, tls: Figures) -> None:
    def ratio(a: float, b: float) -> str:
        return f"{a / b:5.2f}" if b else "  -  "

    what = "TLS+auth" if AUTH["on"] else "TLS"
    print(f"phase                         plain     {what:>8s}   {what}/plain")
    for shape in ("serial", "inflight"):
        p, t = plain.append[shape], tls.append[shape]
        print(f"append 1 MiB, {shape:9s}   {p / MB:7.1f} MB/s {t / MB:7.1f} MB/s   {ratio(t, p)}")
    print(f"read, non-blocking          {plain.read / MB:7.1f} MB/s {tls.read / MB:7.1f} MB/s   "
          f"{ratio(tls.read, plain.read)}")
    assert plain.small is not None and tls.small is not None
    print(f"4 KiB appends (service)     {plain.small.rate:7.0f}/s    {tls.small.rate:7.0f}/s      "
          f"{ratio(tls.small.rate, plain.small.rate)}")
    print(f"  p50 / p99 ms              {plain.small.p50:5.2f} / {plain.small.p99:5.2f}  "
          f"{tls.small.p50:5.2f} / {tls.small.p99:5.2f}")


def run(args: argparse.Namespace) -> None:
    from cluster.keyspace.etcd import EtcdProcess

    chunks = chunks_of(make_content(POOL_CHUNKS * CHUNK), CHUNK)
    reqs = content_requests(chunks)
    small = chunks_of(chunks[0], args.small_size)
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as name:
        tmp = Path(name)
        pki = make_pki(tmp / "pki")
        etcd = EtcdProcess(tmp / "etcd", client_port=free_port(), peer_port=free_port(), log_path=tmp / "etcd.log",
                           extra_args=["--unsafe-no-fsync"])
        etcd.start()
        brokers: list[BrokerProcess] = []
        try:
            etcd.wait_ready(30.0)
            (tmp / "fragments").mkdir()
            common = ("--broker.file-root", str(tmp / "fragments"), "--log.level", "warn")
            log("starting a plain and a TLS broker")
            brokers = [BrokerProcess(tmp, etcd.endpoint, "/bench/plain", *common),
                       TLSBroker(tmp, etcd.endpoint, "/bench/tls", pki, *common,
                                 *(["--broker.auth-keys", AUTH_KEY] if AUTH["on"] else []))]
            for broker in brokers:
                broker.wait_ready()
            plain_broker = brokers[0]
            channel, stub = plain_broker.stub()
            with channel:
                specs = [bench_spec("bench/none", pb.NONE), bench_spec("bench/small", pb.NONE)]
                if apply_specs(stub, *specs).status != pb.OK:
                    raise RuntimeError("applying the benchmark journals failed")
                for spec in specs:
                    wait_for_primary(stub, spec.name)

            async def apply_tls() -> None:
                async with JournalClient(brokers[1].url, credentials=credentials_of(brokers[1], pki)) as client:
                    specs = [bench_spec("bench/none", pb.NONE), bench_spec("bench/small", pb.NONE)]
                    resp = await client.stub().Apply(pb.ApplyRequest(changes=[
                        pb.ApplyRequest.Change(upsert=s, expect_mod_revision=0) for s in specs]))
                    if resp.status != pb.OK:
                        raise RuntimeError("applying the benchmark journals failed")
                    while True:
                        journals = [j async for r in client.stub().List(pb.ListRequest()) for j in r.journals]
                        if len(journals) == 2 and all(j.route.primary >= 0 for j in journals):
                            return
                        await asyncio.sleep(0.05)

            asyncio.run(apply_tls())
            figures = {"plain": Figures(), "tls": Figures()}
            for r in range(args.rounds):
                for label, broker in (("plain", brokers[0]), ("tls", brokers[1])):
                    log(f"round {r + 1}: {label}")
                    asyncio.run(one_round(args, broker, pki, reqs, small, figures[label]))
            report(figures["plain"], figures["tls"])
        finally:
            for broker in brokers:
                broker.stop()
            etcd.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=128, help="MiB appended per append shape per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per broker; the best is reported")
    parser.add_argument("--writers", type=int, default=16, help="concurrent writers of small appends")
    parser.add_argument("--small-appends", type=int, default=4000, help="small appends measured per round")
    parser.add_argument("--small-size", type=int, default=4096, help="bytes per small append")
    parser.add_argument("--auth", action="store_true", help="the TLS broker also checks tokens (--broker.auth-keys)")
    args = parser.parse_args(argv)
    AUTH["on"] = args.auth
    run(args)


if __name__ == "__main__":
    main()
