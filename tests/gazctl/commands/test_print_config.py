"""`gazctl print-config`: each setting with where it came from (flag, environment, ./gazctl.ini,
~/.config/gazette/gazctl.ini, default), as a gazctl.ini that reproduces it."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.harness import run_gazctl


def test_print_config_precedence(tmp_path: Path) -> None:
    ini = tmp_path / "gazctl.ini"
    ini.write_text("[journals.Broker]\nAddress = http://from-ini:1\n[Log]\nLevel = info\n")

    def config(*args: str, env: dict[str, str] | None = None) -> str:
        done = run_gazctl(None, "print-config", *args, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    out = config()
    assert "Address = http://from-ini:1" in out and f"From: {ini}." in out
    assert "Level = info" in out and "Format = text" in out
    out = config(env={"BROKER_ADDRESS": "http://from-env:2", "LOG_LEVEL": "error"})
    assert "Address = http://from-env:2" in out and "From: $BROKER_ADDRESS." in out and "Level = error" in out
    out = config("--broker.address", "http://from-flag:3", env={"BROKER_ADDRESS": "http://from-env:2"})
    assert "Address = http://from-flag:3" in out and "From: flag --broker.address." in out

    # The output is itself a gazctl.ini that reproduces the settings.
    ini.write_text(out)
    again = config()
    assert "Address = http://from-flag:3" in again and f"From: {ini}." in again


def test_print_config_shows_the_consumer_address(tmp_path: Path) -> None:
    def config(*args: str, **env: str) -> str:
        done = run_gazctl(None, "print-config", *args, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout.split("[shards.Consumer]\n")[1].split("\n[")[0]

    ini = tmp_path / "gazctl.ini"
    ini.write_text("[shards.Consumer]\nAddress = http://from-ini:1\n")
    assert config().endswith(f"From: {ini}.\nAddress = http://from-ini:1\n")
    assert config(CONSUMER_ADDRESS="http://from-env:2").endswith("From: $CONSUMER_ADDRESS.\nAddress = http://from-env:2\n")
    flagged = "From: flag --consumer.address.\nAddress = http://from-flag:3\n"
    assert config("--consumer.address", "http://from-flag:3", CONSUMER_ADDRESS="http://from-env:2").endswith(flagged)
    before = run_gazctl(None, "--consumer.address", "http://from-flag:3", "print-config", cwd=tmp_path)
    assert flagged in before.stdout
    # The output is a gazctl.ini that reproduces it.
    ini.write_text(before.stdout)
    assert config().endswith(f"From: {ini}.\nAddress = http://from-flag:3\n")
    os.remove(ini)
    assert config().endswith("From: default.\nAddress = http://localhost:8080\n")
