"""The gazctl command tree (gazctl.app): every command and flag has help, and a command imports only what it runs."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import typer

from gazctl.app import app
from tests.support.harness import ROOT, gazctl_env, run_gazctl


def test_every_command_and_flag_has_help() -> None:
    root: Any = typer.main.get_command(app)  # Typer vendors its own click: look at the commands' attributes.
    journals = root.commands["journals"]
    commands = {**{f"journals {n}": c for n, c in journals.commands.items()}, **{
        n: c for n, c in root.commands.items() if n != "journals"}}
    assert set(commands) >= {f"journals {c}" for c in (
        "list", "apply", "edit", "read", "append", "fragments", "prune", "reset-head", "suspend", "store-health")
    } | {"print-config", "attach-uuids"}
    for name, command in commands.items():
        assert command.help, name
        for param in command.params:
            if param.param_type_name == "option":
                assert param.help, (name, param.opts)
    done = run_gazctl(None, "journals", "read", "--help")
    assert done.returncode == 0 and "Usage:" in done.stdout


_LOADED = """
import sys
from gazctl.app import main
sys.argv = ["gazctl", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
heavy = ("jinja2", "gazctl.commands.gitops", "consumer.recoverylog", "pipelines.definitions", "jwt", "urllib3")
print(" ".join(m for m in heavy if m in sys.modules), file=sys.stderr)
"""


def _loaded_by(*args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", _LOADED, *args], capture_output=True, text=True, cwd=ROOT,
                          env=gazctl_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    return set(done.stderr.split())


def test_a_command_imports_only_what_it_runs() -> None:
    # gazctl starts once per command typed: `journals list` must not pay for the GitOps planner
    # (jinja2), the recovery log player, Spark pipelines, or auth and fragment-URL libraries.
    assert _loaded_by("journals", "list", "--help") == set()
    plan = _loaded_by("plan", "--help")
    assert plan >= {"jinja2", "gazctl.commands.gitops"} and "consumer.recoverylog" not in plan  # Nor `shards`.
    assert _loaded_by("shards", "--help") >= {"consumer.recoverylog"}
