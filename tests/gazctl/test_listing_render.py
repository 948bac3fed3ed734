"""The fast path of `journals list --format yaml` prints exactly what ruamel would."""

from __future__ import annotations

import io

import pytest
from ruamel.yaml import YAML

from broker.protocol import pb
from gazctl.specs import journalspace


def _ruamel(node: journalspace.Node) -> str:
    yaml = YAML(typ="rt")
    yaml.width = 4096
    out = io.StringIO()
    yaml.dump(journalspace._encode_node(node), out)
    return out.getvalue()


@pytest.mark.parametrize(
    "value", ["g3", "", "yes", "1e3", "true", "a b", "x: y", "#c", "'q'", "é", "s3://b/p?x=1", "-", "~", "1_000"]
)
def test_dump_is_ruamels(value: str) -> None:
    specs = []
    for i in range(4):
        spec = pb.JournalSpec(name=f"bench/t-{i % 2}/p-{i}", replication=1)
        spec.labels.labels.add(name="group", value=value if i % 2 else "g1")
        spec.fragment.length = 1 << 20
        spec.fragment.compression_codec = pb.SNAPPY
        spec.fragment.refresh_interval.seconds = 60
        spec.fragment.stores.append(value or "file:///x/")
        if i == 3:
            spec.suspend.level = pb.JournalSpec.Suspend.FULL
            spec.flags = 4
        specs.append((spec, i + 7))
    tree = journalspace.hoist(specs)
    tree.comment = value
    assert journalspace.dump(tree) == _ruamel(tree)


def test_hoist_of_sibling_runs_round_trips() -> None:
    """Runs of siblings differing only in name and suspend (which hoist handles once per run)."""
    specs = []
    for i in range(30):
        spec = pb.JournalSpec(name=f"a/{i // 10}/j-{i:02d}", replication=1 + (i // 7) % 2)
        spec.labels.labels.add(name="ll", value=str((i // 5) % 2))
        spec.fragment.length = 1024
        spec.fragment.compression_codec = pb.NONE
        spec.fragment.refresh_interval.seconds = 60
        if i % 4 == 0:
            spec.suspend.level = pb.JournalSpec.Suspend.PARTIAL
        specs.append((spec, i))
    flat = journalspace.flatten(journalspace.load(journalspace.dump(journalspace.hoist(specs))), validate=False)
    assert [(f.spec, f.expect_mod_revision) for f in flat] == specs
