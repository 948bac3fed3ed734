"""A Spark Connect server for the tests: PySpark's own `SparkConnectServer` class run by `spark-submit`.

It listens on a free loopback port with a `local[2]` master. Its Python workers run this interpreter,
with this checkout first on their PYTHONPATH, so they import this tree's `pipelines` package. The
server runs in a process group of its own: stopping it ends its JVM and every Python worker.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.harness import ROOT, free_port

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home() -> Path:
    """The Spark distribution inside the installed `pyspark` package (its bin/, jars/, sbin/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def connect_jar() -> Path | None:
    """The Spark Connect server's jar in the installed PySpark (4.0 and later ship it), or None."""
    return next(iter(sorted((spark_home() / "jars").glob("spark-connect_*.jar"))), None)


def spark_env(**extra: str) -> dict[str, str]:
    """The environment of a Spark JVM whose Python workers run this interpreter and import this checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    path = [str(ROOT), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env.update(
        SPARK_HOME=str(spark_home()),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(dict.fromkeys(path)),
    )
    env.update(extra)
    return env


class ConnectServer:
    """One Spark Connect server process (`spark-submit --class SparkConnectServer`), its port and log."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.log_path = tmp / "connect-server.log"
        args = [
            str(spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--name", "gazette-connect-tests",
            "--master", "local[2]",
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", f"spark.connect.grpc.binding.port={self.port}",
            "--conf", "spark.ui.enabled=false",
            "--conf", "spark.sql.shuffle.partitions=2",
            "--conf", "spark.python.worker.reuse=true",
            "--conf", f"spark.sql.warehouse.dir={tmp / 'warehouse'}",
            "--conf", f"spark.driver.extraJavaOptions=-Djava.io.tmpdir={tmp}",
        ]
        self._log = open(self.log_path, "wb")
        # A session of its own: the JVM and the Python workers it forks share one process group.
        self.proc = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, env=spark_env(), cwd=tmp, start_new_session=True
        )

    @property
    def url(self) -> str:
        """The server's Spark Connect URL, for `SparkSession.builder.remote(...)`."""
        return f"sc://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 120.0) -> ConnectServer:
        """Wait until the server accepts connections; RuntimeError (with its log) if it exits or never does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Spark Connect server exited with {self.proc.returncode}:\n{self.logs()}")
            if "Spark Connect server started at" in self.logs():
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", self.port)) == 0:
                        return self
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"Spark Connect server not ready after {timeout:.0f}s:\n{self.logs()}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server's process group (SIGKILL after `timeout`), and wait until no member is left."""
        group = self.proc.pid  # The group leader: start_new_session made the server's pid its group id.
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                self.proc.poll()
                try:
                    os.killpg(group, 0)  # Python workers may outlive the JVM by a moment.
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                continue
            break
        self.proc.wait(timeout=10)
        self._log.close()
