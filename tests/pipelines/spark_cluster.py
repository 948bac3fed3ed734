"""A Spark standalone cluster on loopback for the pipelines tests and the Spark benchmark: one master and
worker JVMs (1 core each) started from PySpark's own package (`pyspark/bin/spark-class`), nothing else
installed but a JDK.

Every daemon binds 127.0.0.1 on free ports (`SPARK_LOCAL_IP`), runs in a process group of its own, and
logs to a file under the cluster's directory. Workers start with `PYTHONPATH` carrying this checkout,
which their executors (and the executors' Python workers) inherit, so tasks import this tree's
`pipelines` package; the drivers tell executors which interpreter to run (`PYSPARK_PYTHON`).
`stop()` kills every process group (SIGTERM, then SIGKILL): executors are in their worker's group.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.harness import ROOT, free_port

MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"


class ClusterUnavailable(RuntimeError):
    """No JDK (or no PySpark) here: tests skip with this message."""


def spark_home() -> Path:
    """The Spark distribution inside the installed PySpark package."""
    try:
        import pyspark
    except ImportError as exc:
        raise ClusterUnavailable(f"PySpark is not installed ({exc}): pip install -e '.[dev]'") from None
    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").exists():
        raise ClusterUnavailable(f"{home} has no bin/spark-class")
    return home


def java_available() -> None:
    """Raise ClusterUnavailable unless a `java` runs here ($JAVA_HOME/bin/java or on PATH)."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        raise ClusterUnavailable("no JDK: a Spark standalone cluster needs `java` (Debian: openjdk-17-jre-headless)")


def _children(pid: int) -> list[int]:
    """Direct children of `pid`, by every process's parent in /proc (a JVM forks from any of its threads)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, depth first."""
    out = []
    for child in _children(pid):
        out.append(child)
        out += descendants(child)
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.load(resp)


@dataclass
class Daemon:
    """One master or worker JVM: its process (the JVM: spark-class execs it), ports and log."""

    name: str
    port: int
    ui_port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    killed: list[int] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def ui(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}"


class SparkCluster:
    """A master and `workers` workers of `cores` cores and `memory` each, under `tmp`."""

    def __init__(self, tmp: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        java_available()
        self.home = spark_home()
        self.tmp = tmp
        self.cores = cores
        self.memory = memory
        self.master = Daemon("master", free_port(), free_port(), tmp / "master.log")
        self.workers = [
            Daemon(f"worker-{i}", free_port(), free_port(), tmp / f"worker-{i}.log") for i in range(workers)
        ]
        self.conf_dir = tmp / "daemon-conf"  # The daemons' own (empty) spark-defaults, not a developer's.
        self.conf_dir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        """The master URL drivers connect to: `spark://127.0.0.1:PORT`."""
        return f"spark://127.0.0.1:{self.master.port}"

    def environment(self) -> dict[str, str]:
        """The daemons' environment: loopback only, this checkout importable, small daemon heaps."""
        env = dict(os.environ)
        path = [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
        env.update({
            "SPARK_HOME": str(self.home),
            "SPARK_CONF_DIR": str(self.conf_dir),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(self.tmp / "local"),
            "SPARK_DAEMON_MEMORY": "256m",
            "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(path),
        })
        return env

    def _spawn(self, daemon: Daemon, *args: str) -> None:
        with open(daemon.log_path, "ab") as log:
            daemon.proc = subprocess.Popen(
                [str(self.home / "bin" / "spark-class"), *args], stdout=log, stderr=subprocess.STDOUT,
                env=self.environment(), cwd=self.tmp, start_new_session=True,  # Its own group: stop() kills it whole.
            )

    def start(self, timeout: float = 120.0) -> SparkCluster:
        """Start the master, then every worker; return once all are registered ALIVE."""
        self._spawn(self.master, MASTER, "--host", "127.0.0.1", "--port", str(self.master.port),
                    "--webui-port", str(self.master.ui_port))
        for i in range(len(self.workers)):
            self.start_worker(i)
        self.wait_workers(len(self.workers), timeout)
        return self

    def start_worker(self, index: int) -> None:
        """Start worker `index` (again, after a kill: same ports, a new work directory)."""
        w = self.workers[index]
        work = self.tmp / f"{w.name}-work-{len(w.killed)}"
        self._spawn(w, WORKER, "--host", "127.0.0.1", "--port", str(w.port), "--webui-port", str(w.ui_port),
                    "--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(work), self.url)

    def state(self) -> dict[str, Any]:
        """The master's state (its web UI's `/json/`): workers, apps."""
        data: dict[str, Any] = get_json(f"{self.master.ui}/json/")
        return data

    def alive_workers(self) -> list[dict[str, Any]]:
        return [w for w in self.state()["workers"] if w["state"] == "ALIVE"]

    def wait_workers(self, count: int, timeout: float = 120.0) -> None:
        """Wait until `count` workers are registered ALIVE with the master."""
        deadline = time.monotonic() + timeout
        while True:
            for d in (self.master, *self.workers):
                if d.proc is not None and d.proc.poll() is not None and not d.killed:
                    raise RuntimeError(f"{d.name} exited with {d.proc.returncode}:\n{self.tail(d)}")
            try:
                if len(self.alive_workers()) >= count:
                    return
            except OSError:
                pass  # The master's UI is not up yet.
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {d.name}\n{self.tail(d)}" for d in (self.master, *self.workers))
                raise TimeoutError(f"{count} workers not registered after {timeout}s:\n{logs}")
            time.sleep(0.25)

    def tail(self, daemon: Daemon, chars: int = 4000) -> str:
        try:
            return daemon.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def executors(self, index: int) -> list[int]:
        """PIDs of the executor JVMs worker `index` runs now."""
        w = self.workers[index]
        if w.proc is None:
            return []
        return [p for p in descendants(w.proc.pid) if "CoarseGrainedExecutorBackend" in _cmdline(p)]

    def kill_worker(self, index: int, timeout: float = 60.0) -> list[int]:
        """SIGKILL worker `index`'s JVM, as a machine's crash would; wait until its executors exited (their
        WorkerWatcher ends them when the worker's connection drops) and the master counts it dead.
        Returns the executor PIDs it had."""
        w = self.workers[index]
        assert w.proc is not None and w.alive, f"{w.name} is not running"
        executors = self.executors(index)
        w.proc.send_signal(signal.SIGKILL)
        w.proc.wait(timeout)
        w.killed.append(w.proc.pid)
        deadline = time.monotonic() + timeout
        while any(_alive(p) for p in executors) or any(
            x["port"] == w.port for x in self.alive_workers()
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{w.name}'s executors {executors} or its registration outlived it")
            time.sleep(0.1)
        return executors

    def stop(self) -> None:
        """Kill every daemon's process group: SIGTERM, then SIGKILL for what is left after 10 s."""
        daemons = [d for d in (*self.workers, self.master) if d.proc is not None]
        groups = [d.proc.pid for d in daemons if d.proc is not None]
        for pgid in groups:
            _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for d in daemons:
            assert d.proc is not None
            try:
                d.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for pgid in groups:
            _signal_group(pgid, signal.SIGKILL)
        for d in daemons:
            assert d.proc is not None
            d.proc.wait(10)

    def leftovers(self) -> list[str]:
        """Processes of this cluster still running: daemons, executors and their Python workers all carry
        its `SPARK_LOCAL_DIRS` in their environment."""
        mark = f"SPARK_LOCAL_DIRS={self.tmp / 'local'}".encode()
        out = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if mark in environ and _alive(int(entry.name)):
                out.append(f"{entry.name}: {_cmdline(int(entry.name))[:200]}")
        return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def running_cluster(tmp: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> Iterator[SparkCluster]:
    """A started cluster, stopped on exit (no JVM of it left: asserted)."""
    cluster = SparkCluster(tmp, workers, cores, memory)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        left = cluster.leftovers()
        assert not left, f"processes of the Spark cluster outlived it: {left}"


def driver_conf(tmp: Path, cluster: SparkCluster, ui_port: int, **extra: str) -> Path:
    """A `SPARK_CONF_DIR` for a driver of `cluster` (e.g. `gazctl pipelines run --master`): its
    `spark-defaults.conf` binds the driver to loopback, serves its REST API on `ui_port`, keeps
    executors small, lets a task be retried after its executor was lost, and has 2 shuffle partitions."""
    conf = tmp / f"driver-conf-{ui_port}"
    conf.mkdir(parents=True, exist_ok=True)
    settings = {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.port": str(ui_port),
        "spark.executor.memory": "512m",
        "spark.task.maxFailures": "8",
        "spark.sql.shuffle.partitions": "2",
        "spark.local.dir": str(tmp / "driver-local"),
        **extra,
    }
    (conf / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in settings.items()))
    return conf
