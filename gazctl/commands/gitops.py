"""`gazctl plan DIR` and `gazctl sync DIR`: reconcile the cluster's journals and shards to a spec repository.

Journals are listed and applied through a broker (`--broker.address`); shards through the Shard
API of a consumer process of their group: `--consumer.address` (or `$CONSUMER_ADDRESS`, or
`[shards.Consumer]` in gazctl.ini, as `gazctl shards` resolves it) for shard files that name no
consumer group, `--consumer NAME=URL` (or `$CONSUMER_ADDRESS_NAME`, upper case with `-` and `.`
as `_`) for files with `consumer: NAME`. A group is asked when the tree has a shard file of it,
or its address is given (so that the last shards of a group can be pruned).

Exit codes (both commands):
  0  success: the cluster matches the tree, or sync applied the plan, or a plan was printed
  1  error: an invalid tree, a broker error, an ownership conflict, a refused prune, a stale plan
  2  usage error (bad flags or arguments)
  3  changes are pending (only with --detailed-exitcode: `plan`, or `sync --dry-run`)
"""

from __future__ import annotations

import functools
import os
import re
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from broker.client import apply_transactions
from broker.protocol import pb
from consumer.protocol import pb as cpb
from gazctl import shard_client
from gazctl.commands.common import (
    GLOBAL_PANEL,
    BrokerAddressOption,
    ConsumerAddressOption,
    LogFormatOption,
    LogLevelOption,
    Settings,
    reported,
    resolve_consumer,
    setup,
)
from gazctl.specs.gitops import render, source, sync, tree
from gazctl.specs.gitops.errors import GitOpsError, StalePlan
from gazctl.specs.gitops.plan import DEFAULT_MAX_PRUNE, Kind, Plan, make_plan

EXIT_CHANGES = 3
"""Exit status of `plan --detailed-exitcode` (and `sync --dry-run --detailed-exitcode`) when changes are pending."""


class PlanFormat(StrEnum):
    """Output formats of a plan."""

    text = "text"
    json = "json"


DirArgument = Annotated[
    Path,
    typer.Argument(
        help="Directory of spec files: *.yaml journalspace trees, shardspaces (a top-level `shards:` key), and"
        " *.yaml.j2 jinja2 templates of either"
    ),
]
ValuesOption = Annotated[
    Path | None,
    typer.Option("--values", help="YAML mapping of template variables \\[default: DIR/values.yaml if it exists]"),
]
OwnerOption = Annotated[
    str | None,
    typer.Option(
        "--owner",
        help="Owner name written to the app.gazette.dev/managed-by label \\[default: the git remote 'origin' as"
        " host/path, else the directory's name]",
    ),
]
PruneOption = Annotated[
    bool, typer.Option("--prune", help="Delete journals and shards this tree manages that are no longer in it")
]
MaxPruneOption = Annotated[
    int, typer.Option("--max-prune", min=0, help="Refuse to prune more journals (or more shards) than this")
]
AllowMassPruneOption = Annotated[
    bool,
    typer.Option(
        "--allow-mass-prune",
        help="Prune even more than --max-prune, or every journal (or shard) the tree manages",
    ),
]
FormatOption = Annotated[
    PlanFormat,
    typer.Option(
        "--format", "-o", help="Plan output: text for people, or a JSON document for CI", case_sensitive=False
    ),
]
ConsumersOption = Annotated[
    list[str] | None,
    typer.Option(
        "--consumer",
        help="NAME=URL: a `gazette consume` process of consumer group NAME, for shard files with `consumer: NAME`"
        " (repeatable) \\[env: CONSUMER_ADDRESS_<NAME>, upper case, - and . as _]",
        show_default=False,
        rich_help_panel=GLOBAL_PANEL,
    ),
]
DetailedExitcodeOption = Annotated[
    bool,
    typer.Option(
        "--detailed-exitcode",
        help=f"Exit {EXIT_CHANGES} when changes are pending (0: in sync, 1: error), as terraform plan's",
    ),
]


def register(app: typer.Typer) -> None:
    """Add `plan` and `sync` to the root app."""
    app.command("plan", epilog=_EXIT_CODES)(plan_command)
    app.command("sync", epilog=_EXIT_CODES)(sync_command)


_EXIT_CODES = (
    f"Exit codes: 0 success (in sync, or applied); 1 error; 2 usage error; {EXIT_CHANGES} changes pending"
    " (with --detailed-exitcode)."
)


def plan_command(
    ctx: typer.Context,
    directory: DirArgument,
    values: ValuesOption = None,
    owner: OwnerOption = None,
    prune: PruneOption = False,
    max_prune: MaxPruneOption = DEFAULT_MAX_PRUNE,
    allow_mass_prune: AllowMassPruneOption = False,
    output: FormatOption = PlanFormat.text,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Also save the plan as JSON, for `gazctl sync --plan FILE` to apply exactly it"),
    ] = None,
    detailed_exitcode: DetailedExitcodeOption = False,
    consumer_address: ConsumerAddressOption = None,
    consumers: ConsumersOption = None,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Show what `sync` would change to make the cluster match the spec tree in DIR.

    Every file is read, rendered and validated before the cluster is contacted. Changes are
    grouped by journal and shard: + create, ~ update (field: old -> new), - delete (with
    --prune); one edited by hand since sync wrote it is reported as drift, naming its fields.
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        spec_tree, src = _load(directory, values, owner)
        addresses = Consumers(consumer_address, consumers)
        plan = _plan(settings, addresses, spec_tree, src, prune, max_prune, allow_mass_prune)
        _print(plan, output)
        if out is not None:
            _save(out, plan)
    if detailed_exitcode and plan.changes:
        raise typer.Exit(EXIT_CHANGES)


def sync_command(
    ctx: typer.Context,
    directory: DirArgument,
    values: ValuesOption = None,
    owner: OwnerOption = None,
    prune: PruneOption = False,
    max_prune: MaxPruneOption = DEFAULT_MAX_PRUNE,
    allow_mass_prune: AllowMassPruneOption = False,
    saved: Annotated[
        Path | None,
        typer.Option(
            "--plan", help="Apply this plan (from `gazctl plan --out`) instead of planning again; refused if the"
            " tree or the planned journals changed since"
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the plan and change nothing")] = False,
    max_txn_size: Annotated[
        int,
        typer.Option(
            "--max-txn-size", min=0, help="Apply in transactions of at most this many changes (0: one transaction,"
            " all or nothing)"
        ),
    ] = 0,
    show_status: Annotated[
        bool,
        typer.Option("--status", help="Show what sync last applied (commits, journals, drift) and change nothing"),
    ] = False,
    output: FormatOption = PlanFormat.text,
    detailed_exitcode: DetailedExitcodeOption = False,
    consumer_address: ConsumerAddressOption = None,
    consumers: ConsumersOption = None,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Make the cluster match the spec tree in DIR: plan, then apply the plan.

    Each change is guarded by the revision the plan read. A plan of journals only is one etcd
    transaction: if any planned journal changed in the meantime, sync fails and changes nothing.
    A plan with shards is applied in steps, each its own transaction: journals created and
    updated (through the broker), then each consumer group's shard changes (through its Shard
    API), then journals deleted; a failed step leaves the steps before it applied, and syncing
    again finishes the work. --max-txn-size splits each step further. Journals and shards sync
    creates or updates carry the label app.gazette.dev/managed-by naming the tree's owner, and
    the git commit they came from.
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        spec_tree, src = _load(directory, values, owner)
        addresses = Consumers(consumer_address, consumers)
        if show_status:
            journals = settings.run(sync.cluster_journals)
            _print_status(sync.status(src.owner, journals))
            for group, shards in _list_shards(addresses, spec_tree).items():
                _print_status(sync.shard_status(src.owner, shards), "shard", group)
            return
        if saved is not None:
            plan = _load_saved(saved, spec_tree, src)
        else:
            plan = _plan(settings, addresses, spec_tree, src, prune, max_prune, allow_mass_prune)
        _print(plan, output)
        if dry_run or not plan.changes:
            if dry_run and detailed_exitcode and plan.changes:
                raise typer.Exit(EXIT_CHANGES)
            return
        steps = sync.phases(plan)
        transactions = sum(apply_transactions(len(step.changes), max_txn_size) for step in steps)
        if transactions > 1 and max_txn_size:
            _stderr(f"Applying {len(plan.changes)} changes in {transactions} transactions of at most {max_txn_size};"
                    " a failed transaction leaves the earlier ones applied.")
        applied = 0

        def progress(done: int, total: int) -> None:
            nonlocal applied
            applied += 1
            if transactions > 1 and max_txn_size:
                _stderr(f"Applied transaction {applied} of {transactions}.")

        revision = 0
        earlier = 0
        for step in steps:
            before = f"; the {earlier} changes of the steps before stay applied" if earlier else ""
            if step.kind is Kind.shard:
                revision = shard_client.run(addresses.address(step.consumer), functools.partial(
                    sync.apply_shard_changes, changes=step.changes, max_txn_size=max_txn_size, on_applied=progress,
                    earlier=before))
            else:
                revision = settings.run(functools.partial(
                    sync.apply_plan, plan=plan, max_txn_size=max_txn_size, on_applied=progress, changes=step.changes,
                    earlier=before))
            earlier += len(step.changes)
        s = plan.summary()
        commit = f" from commit {plan.commit}" if plan.commit else ""
        _stderr(f"Applied{commit} at etcd revision {revision}: {s['create']} created, {s['update']} updated,"
                f" {s['delete']} deleted.")


def _load(directory: Path, values: Path | None, owner: str | None) -> tuple[tree.SpecTree, source.Source]:
    spec_tree = tree.load_tree(directory, values)
    for note in spec_tree.notes:
        _stderr(f"note: {note}")
    return spec_tree, source.describe(directory, owner)


class Consumers:
    """The Shard API addresses of consumer groups: the default group's and named ones (`--consumer NAME=URL`)."""

    def __init__(self, default: str | None, named: list[str] | None) -> None:
        self.default = default
        self.named: dict[str, str] = {}
        for item in named or []:
            name, sep, url = item.partition("=")
            if not sep or not name or not url:
                raise GitOpsError(f"invalid --consumer {item!r}: expected NAME=URL, e.g. stream-sum=http://host:8080")
            self.named[name] = url

    def address(self, group: str) -> str | None:
        """The address flag of `group` for `gazctl.commands.shards._client.run` (None: resolve the default's)."""
        if not group:
            return self.default
        if group in self.named:
            return self.named[group]
        env = consumer_env(group)
        if os.environ.get(env):
            return os.environ[env]
        raise GitOpsError(f"no address of consumer group {group!r}: pass --consumer {group}=URL or set ${env}")

    def groups(self, spec_tree: tree.SpecTree) -> list[str]:
        """The groups to list: the tree's, the default one if its address is configured, and those named by flag."""
        groups = set(spec_tree.shards) | set(self.named)
        if resolve_consumer(self.default).source != "default":
            groups.add("")
        return sorted(groups)


def consumer_env(group: str) -> str:
    """`CONSUMER_ADDRESS_STREAM_SUM` for group `stream-sum`."""
    return "CONSUMER_ADDRESS_" + re.sub(r"[^A-Za-z0-9]", "_", group).upper()


def _list_shards(addresses: Consumers, spec_tree: tree.SpecTree) -> dict[str, list[cpb.ListResponse.Shard]]:
    return {group: shard_client.run(addresses.address(group), sync.cluster_shards)
            for group in addresses.groups(spec_tree)}


def _plan(
    settings: Settings, addresses: Consumers, spec_tree: tree.SpecTree, src: source.Source, prune: bool,
    max_prune: int, allow: bool,
) -> Plan:
    journals: list[pb.ListResponse.Journal] = settings.run(sync.cluster_journals)
    shards = _list_shards(addresses, spec_tree)
    return make_plan(spec_tree, src, journals, prune=prune, max_prune=max_prune, allow_mass_prune=allow,
                     shards=shards)


def _load_saved(path: Path, spec_tree: tree.SpecTree, src: source.Source) -> Plan:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise GitOpsError(f"{path}: cannot read the saved plan: {err.strerror}") from None
    plan = render.from_json(text, str(path))
    if plan.owner != src.owner:
        raise StalePlan(f"{path}: the plan is for owner {plan.owner!r}, not {src.owner!r}")
    if plan.tree_digest != spec_tree.digest:
        raise StalePlan(f"{path}: the spec tree changed since the plan was made; plan again")
    return plan


def _print(plan: Plan, output: PlanFormat) -> None:
    console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
    if output is PlanFormat.json:
        sys.stdout.write(render.to_json(plan))
    elif console.is_terminal:
        console.print(render.to_text(plan), end="")
    else:
        sys.stdout.write(render.to_text(plan, markup=False))
    sys.stdout.flush()


def _save(path: Path, plan: Plan) -> None:
    try:
        path.write_text(render.to_json(plan), encoding="utf-8")
    except OSError as err:
        raise GitOpsError(f"{path}: cannot save the plan: {err.strerror}") from None


def _print_status(status: sync.Status, what: str = "journal", group: str = "") -> None:
    of = f" in consumer group {group}" if group else ""
    lines = [f"Owner {status.owner}: {status.journals} managed {what}(s){of}."]
    for commit, count, revision in status.commits:
        lines.append(f"  commit {commit}: {count} {what}(s), last written at etcd revision {revision}")
    if status.drifted:
        lines.append(f"  drifted (edited outside the tree): {', '.join(status.drifted)}")
    sys.stdout.write("\n".join(lines) + "\n")


def _stderr(message: str) -> None:
    sys.stderr.write(message + "\n")
