"""Plans as text for people (`+`, `~`, `-` per journal and shard, then a summary) and as a JSON
document for CI.

The JSON document (`format_version` 1) carries everything sync needs to apply the plan later
(`sync --plan FILE`): each change's kind (`journal` or `shard`), spec and the revision guarding
it, and the tree's digest. A journal's change names it under `journal`, a shard's under `shard`
(and its consumer group under `consumer`, when the shard file names one);
`summary` counts both kinds, `summary_by_kind` each (when shards were planned).
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format
from rich.markup import escape

from broker.protocol import pb
from consumer.protocol import pb as cpb
from gazctl.protojson import MessageDicts
from gazctl.specs.gitops.errors import GitOpsError
from gazctl.specs.gitops.plan import Action, Change, FieldChange, Kind, Plan, Value

FORMAT_VERSION = 1
_SIGNS = {Action.create: "+", Action.update: "~", Action.delete: "-"}
_COLORS = {Action.create: "green", Action.update: "yellow", Action.delete: "red"}


def summary_line(plan: Plan) -> str:
    """`Plan: 2 to create, 1 to update, 0 to delete (1 drifted); 10 unchanged.`, and with shards
    `Plan: journals 2 to create, ...; 10 unchanged. Shards 1 to create, ...; 4 unchanged.`"""
    if not plan.shards:
        return "Plan: " + _counts(plan, Kind.journal)
    return "Plan: journals " + _counts(plan, Kind.journal) + " Shards " + _counts(plan, Kind.shard)


def _counts(plan: Plan, kind: Kind) -> str:
    s = plan.summary_of(kind)
    line = f"{s['create']} to create, {s['update']} to update, {s['delete']} to delete"
    if s["drift"]:
        line += f" ({s['drift']} drifted)"
    line += f"; {s['unchanged']} unchanged."
    if s["orphaned"]:
        line += f" {s['orphaned']} managed {kind.value}(s) left the tree (sync --prune deletes them)."
    return line


def to_text(plan: Plan, *, markup: bool = True) -> str:
    """The plan for people: a heading, each changed journal with its field diff, orphans, the summary.

    With `markup`, the text is rich console markup (colors); without, plain text (for pipes and
    files, and fast: a 10,000-journal plan is 100,000 lines).
    """
    esc = escape if markup else _plain

    def styled(style: str, text: str) -> str:
        return f"[{style}]{text}[/{style}]" if markup else text

    commit = f" at commit {plan.commit}" if plan.commit else ""
    lines = [styled("bold", f"Spec tree of {esc(plan.owner)}{commit}"), ""]
    if not plan.changes:
        lines.append("No changes: the cluster matches the tree.")
    for change in plan.changes:
        note = ""
        if change.drift:
            note = " " + styled("magenta", "(drift: edited outside the spec tree; sync reverts it)")
        elif change.adopt:
            note = " (exists without an owner: sync adopts it)"
        what = "shard " if change.kind is Kind.shard else ""
        heading = f"{_SIGNS[change.action]} {change.action.value} {what}{esc(change.display)}"
        lines.append(styled(_COLORS[change.action], heading) + note)
        lines.extend(f"    {esc(f.field)}: {esc(_show(f, change.action))}" for f in change.fields)
    for name in plan.orphans:
        lines.append(styled("dim", f"! {esc(name)}: managed by {esc(plan.owner)} but not in the tree"
                                   " (kept: sync --prune deletes it)"))
    for name in plan.orphan_shards:
        lines.append(styled("dim", f"! shard {esc(name)}: managed by {esc(plan.owner)} but not in the tree"
                                   " (kept: sync --prune deletes it)"))
    lines += ["", summary_line(plan)]
    return "\n".join(lines) + "\n"


def _plain(text: str) -> str:
    return text


def _show(f: FieldChange, action: Action) -> str:
    if action is Action.create:
        return _value(f.new)
    if action is Action.delete:
        return _value(f.old)
    return f"{_value(f.old)} -> {_value(f.new)}"


def _value(v: Value) -> str:
    if v is None:
        return "(unset)"
    if isinstance(v, list):
        return "[" + ", ".join(json.dumps(x) if x == "" else x for x in v) + "]"
    return str(v)


def to_document(plan: Plan) -> dict[str, Any]:
    """The plan as a JSON-ready document (see the module docstring)."""
    doc: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "owner": plan.owner,
        "commit": plan.commit,
        "tree_digest": plan.tree_digest,
        "summary": plan.summary(),
    }
    if plan.shards:
        doc["summary_by_kind"] = {"journals": plan.summary_of(Kind.journal), "shards": plan.summary_of(Kind.shard)}
    dicts = MessageDicts()  # The specs of a template share most sub-messages: each converted once.
    doc["changes"] = [
        {
            "kind": c.kind.value,
            c.kind.value: c.name,
            **({"consumer": c.consumer} if c.consumer else {}),
            "action": c.action.value,
            "expect_mod_revision": c.expect_mod_revision,
            "drift": c.drift,
            "adopt": c.adopt,
            "fields": [{"field": f.field, "old": f.old, "new": f.new} for f in c.fields],
            "spec": dicts.of(c.spec) if c.spec else None,
        }
        for c in plan.changes
    ]
    doc["orphans"] = plan.orphans
    if plan.shards:
        doc["orphan_shards"] = plan.orphan_shards
    return doc


def to_json(plan: Plan) -> str:
    """The document as JSON: indented, but each change on one line (json's C encoder writes those: an
    indented dump of 20,000 changes takes seconds in the pure-Python one)."""
    doc = to_document(plan)
    changes = doc.pop("changes")
    lines = [f"  {json.dumps(key)}: {json.dumps(value)}," for key, value in doc.items()]
    body = ",\n".join(f"    {json.dumps(change)}" for change in changes)
    lines.append('  "changes": [' + (f"\n{body}\n  " if changes else "") + "]")
    return "{\n" + "\n".join(lines) + "\n}\n"


def from_json(text: str, source: str) -> Plan:
    """A plan saved with `plan --out`; errors name `source`."""
    try:
        doc = json.loads(text)
        if doc.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format_version {doc.get('format_version')!r} (expected {FORMAT_VERSION})")
        by_kind = doc.get("summary_by_kind")
        plan = Plan(doc["owner"], doc["commit"], doc["tree_digest"], orphans=list(doc["orphans"]),
                    unchanged=int((by_kind["journals"] if by_kind else doc["summary"])["unchanged"]),
                    shards=by_kind is not None, unchanged_shards=int(by_kind["shards"]["unchanged"]) if by_kind else 0,
                    orphan_shards=list(doc.get("orphan_shards", [])))
        for c in doc["changes"]:
            kind = Kind(c.get("kind", "journal"))
            message: pb.JournalSpec | cpb.ShardSpec = pb.JournalSpec() if kind is Kind.journal else cpb.ShardSpec()
            spec = json_format.ParseDict(c["spec"], message) if c["spec"] is not None else None
            fields = [FieldChange(f["field"], f["old"], f["new"]) for f in c["fields"]]
            plan.changes.append(Change(c[kind.value], Action(c["action"]), int(c["expect_mod_revision"]), fields,
                                       spec, drift=bool(c["drift"]), adopt=bool(c["adopt"]), kind=kind,
                                       consumer=str(c.get("consumer", ""))))
    except (ValueError, KeyError, TypeError, json_format.ParseError) as err:
        raise GitOpsError(f"{source}: not a plan saved by `gazctl plan --out`: {err}") from None
    return plan
