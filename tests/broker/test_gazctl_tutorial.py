"""The README tutorial's gazctl steps against a real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.harness import BrokerProcess

ROOT = Path(__file__).resolve().parents[2]


def gazctl(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BROKER_ADDRESS": broker.url}
    return subprocess.run([sys.executable, "-m", "gazctl", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=60)


def test_apply_example_and_list(broker: BrokerProcess) -> None:
    applied = gazctl(broker, "journals", "apply", "--specs", "examples/journals.yaml")
    assert applied.returncode == 0, applied.stderr
    listed = gazctl(broker, "journals", "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    # One ListResponse document: its journals carry their specs.
    names = [j["spec"]["name"] for j in json.loads(listed.stdout)["journals"]]
    assert "example/journal" in names
    again = gazctl(broker, "journals", "apply", "--specs", "examples/journals.yaml")
    assert again.returncode != 0 and "ETCD_TRANSACTION_FAILED" in again.stderr
