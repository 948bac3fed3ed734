"""The README tutorial's gazctl steps against a real broker."""

from __future__ import annotations

import json

from tests.harness import BrokerProcess, run_gazctl


def test_apply_example_and_list(broker: BrokerProcess) -> None:
    applied = run_gazctl(broker, "journals", "apply", "--specs", "examples/journals.yaml")
    assert applied.returncode == 0, applied.stderr
    listed = run_gazctl(broker, "journals", "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    # One ListResponse document: its journals carry their specs.
    names = [j["spec"]["name"] for j in json.loads(listed.stdout)["journals"]]
    assert "example/journal" in names
    again = run_gazctl(broker, "journals", "apply", "--specs", "examples/journals.yaml")
    assert again.returncode != 0 and "ETCD_TRANSACTION_FAILED" in again.stderr
