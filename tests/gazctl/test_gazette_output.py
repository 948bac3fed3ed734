"""gazctl prints the bytes Gazette's gazctl prints: tablewriter v1.1.0 tables, gogo jsonpb and
encoding/json JSON, gogo text-format protos. Each expected text is written out here from Gazette's
source (`cmd/gazctl/gazctlcmd/*.go`, the generated `*.pb.go` struct tags, gogo/protobuf v1.3.2's
`jsonpb` and `proto/text.go`, tablewriter v1.1.0's defaults), not from this project's output."""

from __future__ import annotations

import hashlib
import subprocess

from google.protobuf import text_format

from broker.protocol import pb, pb_grpc
from consumer.protocol import pb as cpb
from gazctl.protojson import encoding_json, go_duration, jsonpb
from gazctl.prototext import marshal_text
from gazctl.tables import header_text, render
from tests.support.harness import BrokerProcess, append, apply_specs, one_line_error, run_gazctl, wait_for_primary


def test_table_is_tablewriters_default() -> None:
    # Centred headers (an odd gap's extra space goes right), left-aligned cells, trimmed cells,
    # a cell's line break makes another line, wide characters take two cells.
    assert render(["Name", "Age", "City"], [["Alice", "25 yrs", "New York"], [" Bob ", "30 yrs", "日本\nx"]]) == (
        "┌───────┬────────┬──────────┐\n"
        "│ NAME  │  AGE   │   CITY   │\n"
        "├───────┼────────┼──────────┤\n"
        "│ Alice │ 25 yrs │ New York │\n"
        "│ Bob   │ 30 yrs │ 日本     │\n"
        "│       │        │ x        │\n"
        "└───────┴────────┴──────────┘\n"
    )
    # No rows: the header between the top and bottom borders, no separator.
    assert render(["ID", "Status"], []) == "┌────┬────────┐\n│ ID │ STATUS │\n└────┴────────┘\n"
    # An empty cell is one column wide.
    assert render(["RF"], [[""]]) == "┌────┐\n│ RF │\n├────┤\n│    │\n└────┘\n"


def test_headers_are_auto_formatted() -> None:
    assert header_text("SHA1") == "SHA 1"
    assert header_text("Compression") == "COMPRESSION"
    assert header_text("app.gazette.dev/message-type") == "APP . GAZETTE . DEV / MESSAGE - TYPE"
    assert header_text("my_label") == "MY LABEL"
    assert header_text("fooBar") == "FOO BAR"
    assert header_text("HTTPServer") == "HTTP SERVER"
    assert header_text("v1.2") == "V 1 . 2"
    assert header_text("a.b") == "A . B"


def _spec() -> pb.JournalSpec:
    spec = pb.JournalSpec(name="a/b&c", replication=2)
    spec.labels.labels.add(name="app.gazette.dev/message-type", value="<Foo>")
    spec.labels.labels.add(name="é", value="")
    spec.fragment.length = 1 << 20
    spec.fragment.compression_codec = pb.SNAPPY
    spec.fragment.stores.append("s3://bucket/")
    spec.fragment.refresh_interval.seconds = 60
    spec.fragment.flush_interval.FromMilliseconds(1500)
    return spec


def test_jsonpb_is_gogos_with_orig_names_and_defaults() -> None:
    resp = pb.ListResponse()
    journal = resp.journals.add(spec=_spec(), mod_revision=7, create_revision=3)
    journal.route.members.add(zone="z", suffix="b1")
    journal.route.endpoints.append("http://b1")
    suspended = resp.journals.add(mod_revision=9)
    suspended.spec.name = "x"
    suspended.spec.suspend.level = pb.JournalSpec.Suspend.FULL
    suspended.spec.suspend.offset = 5
    empty_route = '{"members":[],"primary":0,"endpoints":[]}'
    header = (
        '{"process_id":{"zone":"","suffix":""},"route":' + empty_route + ',"etcd":{"cluster_id":"0","member_id":"0",'
        '"revision":"0","raft_term":"0"}}'
    )
    assert jsonpb(resp) == (
        '{"status":"OK","header":' + header + ',"journals":['
        '{"spec":{"name":"a/b\\u0026c","replication":2,"labels":{"labels":['
        '{"name":"app.gazette.dev/message-type","value":"\\u003cFoo\\u003e","prefix":false},'
        '{"name":"é","value":"","prefix":false}]},'
        '"fragment":{"length":"1048576","compression_codec":"SNAPPY","stores":["s3://bucket/"],'
        '"refresh_interval":"60s","retention":"0s","flush_interval":"1.500s","path_postfix_template":""},'
        '"flags":0,"max_append_rate":"0","suspend":null},"mod_revision":"7",'
        '"route":{"members":[{"zone":"z","suffix":"b1"}],"primary":0,"endpoints":["http://b1"]},"create_revision":"3"},'
        '{"spec":{"name":"x","replication":0,"labels":{"labels":[]},'
        '"fragment":{"length":"0","compression_codec":"INVALID","stores":[],'
        '"refresh_interval":"0s","retention":"0s","flush_interval":"0s","path_postfix_template":""},'
        '"flags":0,"max_append_rate":"0","suspend":{"level":"FULL","offset":"5"}},"mod_revision":"9",'
        '"route":' + empty_route + ',"create_revision":"0"}]}'
    )
    shards = cpb.ListResponse()
    shard = shards.shards.add(mod_revision=4)
    shard.spec.id = "s"
    shard.spec.sources.add(journal="a/b", min_offset=10)
    shard.spec.max_txn_duration.seconds = 1
    shard.status.add(code=cpb.ReplicaStatus.PRIMARY)
    assert jsonpb(shards) == (
        '{"status":"OK","header":' + header + ',"shards":[{"spec":{"id":"s",'
        '"sources":[{"journal":"a/b","min_offset":"10"}],"recovery_log_prefix":"","hint_prefix":"","hint_backups":0,'
        '"max_txn_duration":"1s","min_txn_duration":"0s","disable":false,"hot_standbys":0,"labels":{"labels":[]},'
        '"disable_wait_for_ack":false,"ring_buffer_size":0,"read_channel_size":0},"mod_revision":"4",'
        '"route":' + empty_route + ',"status":[{"code":"PRIMARY","errors":[]}],"create_revision":"0"}],'
        '"extension":null}'
    )
    assert [go_duration(s, n) for s, n in ((0, 0), (0, -1000), (3, 10_000_000), (-2, -5))] == [
        '"0s"', '"-0.000001s"', '"3.010s"', '"-2.000000005s"'
    ]


def test_encoding_json_omits_empty_fields() -> None:
    entry = pb.FragmentsResponse._Fragment()
    entry.spec.journal = "a/b"
    entry.spec.end = 12
    entry.spec.sum.part1 = 1 << 63
    entry.spec.compression_codec = pb.NONE
    assert encoding_json(entry) == (
        '{"spec":{"journal":"a/b","end":12,"sum":{"part1":9223372036854775808},"compression_codec":1}}'
    )
    entry.signed_url = "https://x/?a=1&b=2"
    entry.spec.backing_store = "s3://bucket/"
    entry.spec.mod_time = 1700000000
    assert encoding_json(entry) == (
        '{"spec":{"journal":"a/b","end":12,"sum":{"part1":9223372036854775808},"compression_codec":1,'
        '"backing_store":"s3://bucket/","mod_time":1700000000},"signed_url":"https://x/?a=1\\u0026b=2"}'
    )


def test_text_is_gogos_marshal_text() -> None:
    req = pb.ApplyRequest()
    req.changes.add(upsert=_spec())
    req.changes.add(expect_mod_revision=4, delete="old/j")
    assert marshal_text(req) == (
        "changes: <\n"
        "  upsert: <\n"
        '    name: "a/b&c"\n'
        "    replication: 2\n"
        "    labels: <\n"
        "      labels: <\n"
        '        name: "app.gazette.dev/message-type"\n'
        '        value: "<Foo>"\n'
        "      >\n"
        "      labels: <\n"
        '        name: "\\303\\251"\n'
        "      >\n"
        "    >\n"
        "    fragment: <\n"
        "      length: 1048576\n"
        "      compression_codec: SNAPPY\n"
        '      stores: "s3://bucket/"\n'
        "      refresh_interval: <\n"
        "        seconds: 60\n"
        "      >\n"
        "      flush_interval: <\n"
        "        seconds: 1\n"
        "        nanos: 500000000\n"
        "      >\n"
        "    >\n"
        "  >\n"
        ">\n"
        "changes: <\n"
        "  expect_mod_revision: 4\n"
        '  delete: "old/j"\n'
        ">\n"
    )
    # Non-nullable sub-messages are written even when empty; a nullable one is not.
    assert marshal_text(pb.FragmentsResponse(fragments=[pb.FragmentsResponse._Fragment()])) == (
        "header: <\n  process_id: <\n  >\n  route: <\n  >\n  etcd: <\n  >\n>\n"
        "fragments: <\n  spec: <\n    sum: <\n    >\n  >\n>\n"
    )


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_journals_list_fragments_and_apply_print_gazettes_bytes(
    broker: BrokerProcess, stub: pb_grpc.JournalStub
) -> None:
    spec = pb.JournalSpec(name="gzout/j", replication=1)
    spec.labels.labels.add(name="topic", value="t1")
    spec.fragment.length = 1 << 20
    spec.fragment.compression_codec = pb.SNAPPY
    spec.fragment.refresh_interval.seconds = 60
    apply_specs(stub, spec)
    wait_for_primary(stub, "gzout/j")
    content = b"hello\n"
    append(stub, "gzout/j", content)

    listed = run_gazctl(broker, "journals", "list", "-l", "name=gzout/j", "-o", "proto")
    resp = pb.ListResponse()
    text_format.Parse(_ok(listed), resp)
    [journal] = resp.journals
    assert journal.spec == spec

    # The table: NAME, RF, PRIMARY, REPLICAS, then the label column, as journals_list.go orders them.
    table = _ok(run_gazctl(broker, "journals", "list", "-l", "name=gzout/j", "--rf", "-p", "-r", "-L", "topic"))
    bid = broker.broker_id
    pad = " " * (len(bid) - len("PRIMARY"))
    gap = len(bid) + 2
    assert table == (
        f"┌─────────┬────┬{'─' * gap}┬──────────┬───────┐\n"
        f"│  NAME   │ RF │ {' ' * (len(pad) // 2)}PRIMARY{' ' * (len(pad) - len(pad) // 2)} │ REPLICAS │ TOPIC │\n"
        f"├─────────┼────┼{'─' * gap}┼──────────┼───────┤\n"
        f"│ gzout/j │ 1  │ {bid} │          │ t1    │\n"
        f"└─────────┴────┴{'─' * gap}┴──────────┴───────┘\n"
    )

    # JSON: one jsonpb object, no newline; the spec's zero fields are there, `suspend` is null.
    out = _ok(run_gazctl(broker, "journals", "list", "-l", "name=gzout/j", "-o", "json"))
    route = journal.route
    members = ",".join(f'{{"zone":"{m.zone}","suffix":"{m.suffix}"}}' for m in route.members)
    endpoints = ",".join(f'"{e}"' for e in route.endpoints)
    assert out.startswith('{"status":"OK","header":{"process_id":{"zone":')
    assert out.endswith(
        '"journals":[{"spec":{"name":"gzout/j","replication":1,"labels":{"labels":[{"name":"topic","value":"t1",'
        '"prefix":false}]},"fragment":{"length":"1048576","compression_codec":"SNAPPY","stores":[],'
        '"refresh_interval":"60s","retention":"0s","flush_interval":"0s","path_postfix_template":""},"flags":0,'
        f'"max_append_rate":"0","suspend":null}},"mod_revision":"{journal.mod_revision}","route":{{"members":'
        f'[{members}],"primary":{route.primary},"endpoints":[{endpoints}]}},'
        f'"create_revision":"{journal.create_revision}"}}]}}'
    ), out

    # Fragments as encoding/json: the unpersisted fragment has no backing store, mod time or URL.
    digest = hashlib.sha1(content).digest()
    part1, part2, part3 = (int.from_bytes(digest[a:b], "big") for a, b in ((0, 8), (8, 16), (16, 20)))
    out = _ok(run_gazctl(broker, "journals", "fragments", "-l", "name=gzout/j", "-o", "json"))
    assert out == (
        f'{{"spec":{{"journal":"gzout/j","end":{len(content)},"sum":{{"part1":{part1},"part2":{part2},'
        f'"part3":{part3}}},"compression_codec":4}}}}\n'
    )
    table = _ok(run_gazctl(broker, "journals", "fragments", "-l", "name=gzout/j"))
    assert table == (
        "┌─────────┬────────┬────────┬───────────┬─────────────────┬─────────────┐\n"
        "│ JOURNAL │ OFFSET │ LENGTH │ PERSISTED │      SHA 1      │ COMPRESSION │\n"
        "├─────────┼────────┼────────┼───────────┼─────────────────┼─────────────┤\n"
        f"│ gzout/j │ 0      │ 6 B    │           │ {digest[:6].hex()}... │ SNAPPY      │\n"
        "└─────────┴────────┴────────┴───────────┴─────────────────┴─────────────┘\n"
    )

    # apply --dry-run prints the ApplyRequest as gogo's MarshalText.
    tree = (
        "name: gzout/k\nreplication: 1\nfragment:\n  length: 1024\n  compression_codec: NONE\n"
        "  refresh_interval: 30s\n"
    )
    dry = _ok(run_gazctl(broker, "journals", "apply", "--dry-run", input=tree))
    assert dry == (
        "changes: <\n  upsert: <\n    name: \"gzout/k\"\n    replication: 1\n    labels: <\n    >\n"
        "    fragment: <\n      length: 1024\n      compression_codec: NONE\n      refresh_interval: <\n"
        "        seconds: 30\n      >\n    >\n  >\n>\n"
    )


def test_prune_of_a_fully_suspended_journal_fails_as_gazettes(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> None:
    spec = pb.JournalSpec(name="gzout/idle", replication=1)
    spec.fragment.length = 1024
    spec.fragment.compression_codec = pb.NONE
    spec.fragment.refresh_interval.seconds = 60
    apply_specs(stub, spec)
    wait_for_primary(stub, "gzout/idle")
    _ok(run_gazctl(broker, "journals", "suspend", "-l", "name=gzout/idle"))
    done = run_gazctl(broker, "journals", "prune", "-l", "name=gzout/idle", "--dry-run")
    one_line_error(done, "failed to fetch fragments of journal gzout/idle: SUSPENDED")
