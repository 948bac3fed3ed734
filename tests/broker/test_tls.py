"""TLS of real brokers (issue 18): two `gazette serve` processes with `--broker.server-cert-file`,
`--broker.server-cert-key-file` and `--broker.server-ca-file` (so client certificates are
required) replicating to each other over TLS with `--broker.peer-*`; gazctl, HTTP/1.1 (as curl
with --cacert, --cert and --key) and the client library over TLS; refusals of clients without a
certificate, trusting a wrong CA or speaking plain text, each clear and without a traceback;
startup errors for unusable files; and a broker whose etcd speaks TLS.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import AppendService, Credentials, JournalClient, Reader, TransportError, append, list_journals
from broker.protocol import pb
from cluster.server.tls import client_context
from tests.support.harness import (
    ROOT,
    BrokerProcess,
    journal_spec,
    one_line_error,
    run_gazctl,
    serving_broker,
)
from tests.support.tls_certs import PKI, TLSBroker

PREFIX = f"tls-{uuid.uuid4().hex[:8]}/"
REPLICATED = f"{PREFIX}replicated"


@pytest.fixture(scope="module")
def brokers(etcd_endpoint: str, pki: PKI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[TLSBroker]]:
    tmp = tmp_path_factory.mktemp("tls")
    prefix = f"/test/{uuid.uuid4().hex}"
    procs = [TLSBroker(tmp, etcd_endpoint, prefix, pki) for _ in range(2)]
    try:
        for proc in procs:
            proc.wait_ready()
        yield procs
    finally:
        for proc in procs:
            assert proc.stop() == 0, proc.logs()
    for proc in procs:
        logs = proc.logs()
        assert "Traceback" not in logs, logs
        assert not [line for line in logs.splitlines() if line.startswith(("warning", "error", "critical"))]


def credentials(pki: PKI, *, client_cert: bool = True, ca: Path | None = None) -> Credentials:
    return Credentials.of(
        cert_file=str(pki.client_cert) if client_cert else "", key_file=str(pki.client_key) if client_cert else "",
        ca_file=str(ca or pki.ca),
    )


def tls_args(pki: PKI, *, client_cert: bool = True, ca: Path | None = None) -> list[str]:
    """gazctl's global TLS options."""
    args = ["--broker.trusted-ca-file", str(ca or pki.ca)]
    if client_cert:
        args += ["--broker.cert-file", str(pki.client_cert), "--broker.cert-key-file", str(pki.client_key)]
    return args


def gazctl(broker: TLSBroker, *args: str, input: str | None = None, env: dict[str, str] | None = None,
           cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_gazctl(None, *args, input=input, env={"BROKER_ADDRESS": broker.url, **(env or {})}, cwd=cwd)


def test_gazctl_apply_list_append_read_over_tls(brokers: list[TLSBroker], tmp_path: Path) -> None:
    pki = brokers[0].pki
    specs = f"""
name: {PREFIX}
replication: 2
fragment:
  length: 1048576
  compression_codec: NONE
  refresh_interval: 30s
children:
- name: {PREFIX}gazctl
- name: {REPLICATED}
"""
    done = gazctl(brokers[0], *tls_args(pki), "journals", "apply", input=specs)
    assert done.returncode == 0, done.stderr
    # The same options from the environment, then from gazctl.ini.
    env = {"BROKER_CERT_FILE": str(pki.client_cert), "BROKER_CERT_KEY_FILE": str(pki.client_key),
           "BROKER_TRUSTED_CA_FILE": str(pki.ca)}
    done = gazctl(brokers[1], "journals", "append", "-l", f"name={PREFIX}gazctl", input="one\ntwo\n", env=env)
    assert done.returncode == 0, done.stderr
    (tmp_path / "gazctl.ini").write_text(
        f"[journals.Broker]\nAddress = {brokers[0].url}\nCertFile = {pki.client_cert}\n"
        f"CertKeyFile = {pki.client_key}\nTrustedCAFile = {pki.ca}\n"
    )
    done = run_gazctl(None, "journals", "list", "-l", f"prefix={PREFIX}", "--primary", "--replicas", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert REPLICATED in done.stdout and f"{PREFIX}gazctl" in done.stdout
    done = gazctl(brokers[0], *tls_args(pki), "journals", "read", "-l", f"name={PREFIX}gazctl")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "one\ntwo\n"


def test_http_put_and_get_over_tls(brokers: list[TLSBroker]) -> None:
    broker = brokers[1]
    ensure_journal(broker, f"{PREFIX}http")
    conn = http.client.HTTPSConnection("127.0.0.1", broker.port, context=broker.context(), timeout=10)
    try:
        conn.request("PUT", f"/{PREFIX}http", body=b"over https\n")
        resp = conn.getresponse()
        assert resp.status == 204, resp.read()
        assert resp.getheader("Content-Range") is not None or resp.getheader("X-Write-Head") is not None
        resp.read()
        conn.request("GET", f"/{PREFIX}http?offset=0&block=false")
        resp = conn.getresponse()
        assert resp.status == 206  # Partial Content: the journal's bytes from the offset, as Gazette's gateway.
        assert resp.read() == b"over https\n"
    finally:
        conn.close()


def ensure_journal(broker: TLSBroker, name: str, replication: int = 2) -> None:
    async def apply() -> None:
        async with JournalClient(broker.url, credentials=credentials(broker.pki)) as client:
            req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(
                upsert=journal_spec(name, replication=replication), expect_mod_revision=-1,
            )])
            resp = await client.stub().Apply(req)
            assert resp.status == pb.OK, resp
    asyncio.run(apply())


async def test_client_library_and_peer_replication_over_tls(brokers: list[TLSBroker]) -> None:
    pki = brokers[0].pki
    await asyncio.to_thread(ensure_journal, brokers[0], REPLICATED)
    records = [f"record {i}\n".encode() for i in range(200)]
    async with JournalClient(brokers[0].url, credentials=credentials(pki)) as client:
        async with AppendService(client) as service:
            appends = [service.append(REPLICATED, r) for r in records]
            await asyncio.gather(*appends)
        # append() (whose HTTP PUT path takes http:// endpoints only) over gRPC and TLS.
        last = await append(client, REPLICATED, b"the last record\n")
        records.append(b"the last record\n")
        end = last.commit.end
        assert end > max(a.end for a in appends)
        listed = await list_journals(client)
        [journal] = [j for j in listed.journals if j.spec.name == REPLICATED]
        assert len(journal.route.members) == 2 and all(e.startswith("https://") for e in journal.route.endpoints)
    # Each broker holds the content itself (do_not_proxy: served from its own replica).
    for broker in brokers:
        async with JournalClient(broker.url, credentials=credentials(pki), route_cache=False) as client:
            reader = Reader(client, REPLICATED, offset=0, block=False, do_not_proxy=True, end_offset=end)
            data = b""
            async for chunk in reader:
                data += chunk
            assert data.endswith(b"".join(records)), broker.broker_id
            assert reader.header is not None and reader.header.process_id.suffix == broker.broker_id


async def test_a_client_without_a_certificate_is_refused(brokers: list[TLSBroker]) -> None:
    pki = brokers[0].pki
    async with JournalClient(brokers[0].url, credentials=credentials(pki, client_cert=False)) as client:
        with pytest.raises(TransportError) as err:
            await list_journals(client)
        assert err.value.code is not None and err.value.code.name == "UNAVAILABLE"
    done = await asyncio.to_thread(gazctl, brokers[0], *tls_args(pki, client_cert=False), "journals", "list")
    one_line_error(done, "--broker.cert-file")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        conn = http.client.HTTPSConnection("127.0.0.1", brokers[0].port, context=client_context(ca_file=str(pki.ca)))
        conn.request("GET", "/debug/ready")
        conn.getresponse()


def test_a_client_trusting_a_wrong_ca_gets_a_clear_error(brokers: list[TLSBroker]) -> None:
    pki = brokers[0].pki
    done = gazctl(brokers[0], *tls_args(pki, ca=pki.wrong_ca), "journals", "list")
    error = one_line_error(done, "certificate")
    assert "--broker.trusted-ca-file" in error, error
    with pytest.raises(urllib.error.URLError) as refused:
        urllib.request.urlopen(f"{brokers[0].url}/debug/ready", context=client_context(ca_file=str(pki.wrong_ca)))
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)
    # A TLS file that cannot be read is named.
    done = gazctl(brokers[0], "--broker.trusted-ca-file", "/nonexistent/ca.pem", "journals", "list")
    one_line_error(done, "/nonexistent/ca.pem")


def test_plain_text_to_a_tls_port_fails_cleanly(brokers: list[TLSBroker]) -> None:
    broker = brokers[0]
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        conn = http.client.HTTPConnection("127.0.0.1", broker.port, timeout=10)
        conn.request("GET", "/debug/ready")
        conn.getresponse()
    done = run_gazctl(None, "journals", "list", env={"BROKER_ADDRESS": f"http://127.0.0.1:{broker.port}"})
    one_line_error(done)
    # Checked in the fixture's teardown too: nothing above info, no traceback.
    assert "Traceback" not in broker.logs()


def test_tls_to_a_plain_broker_fails_at_once(etcd_endpoint: str, tmp_path: Path) -> None:
    # The plain listener closes a TLS handshake (as Gazette's, whose listener matches no protocol to
    # it), rather than wait for an HTTP request line; gRPC's own handshake deadline is 20 s.
    with serving_broker(tmp_path, etcd_endpoint) as plain:
        address = f"https://127.0.0.1:{plain.port}"
        done = run_gazctl(None, "journals", "list", env={"BROKER_ADDRESS": address}, timeout=15)
        error = one_line_error(done, address, "http://", "handshake")
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with socket.create_connection(("127.0.0.1", plain.port), timeout=15) as raw:
                ssl.create_default_context().wrap_socket(raw, server_hostname="127.0.0.1")
        # The broker still serves plain requests.
        assert urllib.request.urlopen(f"{plain.url}/debug/ready", timeout=10).status == 200
    assert "Traceback" not in plain.logs(), error


@pytest.mark.parametrize(
    ("case", "flag"),
    [
        ("missing cert", "--broker.server-cert-file"),
        ("mismatched key", "--broker.server-cert-key-file"),
        ("key without cert", "--broker.server-cert-file"),
        ("bad peer ca", "--broker.peer-ca-file"),
        ("bad etcd cert", "--etcd.cert-file"),
    ],
)
def test_unusable_tls_files_stop_the_broker_at_startup(pki: PKI, tmp_path: Path, case: str, flag: str) -> None:
    args = {
        "missing cert": ["--broker.server-cert-file", str(tmp_path / "nope.pem"),
                         "--broker.server-cert-key-file", str(pki.server_key)],
        "mismatched key": ["--broker.server-cert-file", str(pki.server_cert),
                           "--broker.server-cert-key-file", str(pki.client_key)],
        "key without cert": ["--broker.server-cert-key-file", str(pki.server_key)],
        "bad peer ca": ["--broker.peer-ca-file", str(pki.server_key)],
        "bad etcd cert": ["--etcd.cert-file", str(tmp_path / "nope.pem"), "--etcd.cert-key-file", str(pki.client_key)],
    }[case]
    done = subprocess.run(
        [sys.executable, "-m", "gazette", "serve", "--broker.port", "0", "--etcd.address", "http://127.0.0.1:1",
         "--broker.state-dir", str(tmp_path / "state"), *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and flag in lines[0], done.stderr


def test_a_broker_on_a_tls_etcd(pki: PKI, tls_etcd: str, tmp_path: Path) -> None:
    etcd_flags = ["--etcd.cert-file", str(pki.client_cert), "--etcd.cert-key-file", str(pki.client_key),
                  "--etcd.trusted-ca-file", str(pki.ca)]
    broker = BrokerProcess(tmp_path, tls_etcd, f"/test/{uuid.uuid4().hex}", *etcd_flags).wait_ready()
    try:
        name = f"{PREFIX}on-tls-etcd"
        done = run_gazctl(broker, "journals", "apply", input=f"name: {name}\nreplication: 1\n"
                          "fragment:\n  length: 1048576\n  compression_codec: NONE\n  refresh_interval: 30s\n")
        assert done.returncode == 0, done.stderr
        done = run_gazctl(broker, "journals", "list", "-o", "json")
        assert done.returncode == 0 and name in {j["spec"]["name"] for j in json.loads(done.stdout)["journals"]}
    finally:
        assert broker.stop() == 0, broker.logs()
    assert "Traceback" not in broker.logs()

    # Trusting another CA: the broker exits at once, naming the TLS failure.
    wrong = [*etcd_flags[:4], "--etcd.trusted-ca-file", str(pki.wrong_ca)]
    done = subprocess.run(
        [sys.executable, "-m", "gazette", "serve", "--broker.port", "0", "--etcd.address", tls_etcd,
         "--broker.state-dir", str(tmp_path / "wrong"), *wrong],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in done.stderr and "--etcd.trusted-ca-file" in done.stderr, done.stderr
