"""moto's standalone S3 server as a real HTTP endpoint on loopback, for store tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import boto3

from tests.harness import free_port

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def use_test_credentials() -> None:
    """Give this process (and the brokers it starts) moto's dummy credentials."""
    for key, value in CREDENTIALS.items():
        os.environ[key] = value


class MotoServer:
    """A `moto.server` child process. stop() and start() again keep its port (not its data)."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.log_path = tmp / f"moto-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> MotoServer:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1):
                    return self
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"moto not ready after {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def client(self) -> Any:
        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )

    def store_url(self, bucket: str, prefix: str = "") -> str:
        """The fragment store URL of `bucket`/`prefix` on this server."""
        return f"s3://{bucket}/{prefix}?endpoint={self.endpoint}"

    def snapshot(self, bucket: str) -> dict[str, bytes]:
        """Every object of `bucket`, by key."""
        s3 = self.client()
        out = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                out[obj["Key"]] = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        return out

    def restore(self, bucket: str, objects: dict[str, bytes]) -> None:
        """Create `bucket` and put `objects` back: the store's data returning with it."""
        s3 = self.client()
        s3.create_bucket(Bucket=bucket)
        for key, body in objects.items():
            s3.put_object(Bucket=bucket, Key=key, Body=body)
