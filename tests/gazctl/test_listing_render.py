"""The fast paths of `journals list` rendering print exactly what rich and ruamel would."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from ruamel.yaml import YAML

from broker.protocol import pb
from gazctl.listing import table, table_text
from gazctl.specs import journalspace


def _response(names: list[str], value: str = "v") -> pb.ListResponse:
    resp = pb.ListResponse()
    for i, name in enumerate(names):
        j = resp.journals.add()
        j.spec.name = name
        j.spec.replication = i % 3
        j.spec.labels.labels.add(name="topic", value=value)
        if i % 2:
            j.route.primary = 0
            j.route.members.add(zone="z", suffix=f"broker-{i}")
            j.route.members.add(zone="z", suffix="other")
            j.spec.suspend.level = pb.JournalSpec.Suspend.PARTIAL
        if i % 3 == 1:
            j.spec.fragment.stores.append("s3://bucket/prefix/")
    return resp


def _rich(resp: pb.ListResponse, width: int, **columns: object) -> str:
    buf = io.StringIO()
    Console(file=buf, highlight=False, width=width).print(table(resp, **columns))  # type: ignore[arg-type]
    return buf.getvalue()


@pytest.mark.parametrize("value", ["v", "", "日本語", "a b", "é😀"])
@pytest.mark.parametrize(
    "columns",
    [
        {},
        {"rf": True, "primary": True, "replicas": True, "stores": True},
        {"primary": True, "label_columns": ["topic", "missing"]},
    ],
)
def test_table_text_is_richs_table(value: str, columns: dict[str, object]) -> None:
    for names in ([], ["a/b"], ["a/b", "a/ccc/ddd", "x/" + "y" * 40]):
        resp = _response(names, value)
        assert table_text(resp, 1 << 16, **columns) == _rich(resp, 1 << 16, **columns)  # type: ignore[arg-type]


def test_table_text_leaves_other_tables_to_rich() -> None:
    assert table_text(_response(["a/" + "b" * 100]), 40) is None  # rich folds cells to fit.
    assert table_text(_response(["a/b"], "tab\there"), 1 << 16, label_columns=["topic"]) is None
    assert table_text(_response(["a/b"], " padded"), 1 << 16, label_columns=["topic"]) is None
    assert table_text(_response(["a/b"]), 1 << 16, label_columns=["[bold]x"]) is None  # Markup in a header.


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
