"""Path postfix templates: the Go text/template subset of section 5.3, with Go time layouts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.fragment import postfix
from broker.fragment.errors import FragmentError
from broker.fragment.postfix import (
    PostfixTemplateError,
    SpoolData,
    parse_postfix_template,
    render_path_postfix,
)
from broker.protocol import pb

JOURNAL = "a/journal"
# A Tuesday, day 323 of the year, in the afternoon, with sub-second digits.
T1 = datetime(2019, 11, 19, 22, 5, 9, 123456, tzinfo=UTC)
# A Tuesday, day 34, before noon, with single-digit fields and no sub-second part.
T2 = datetime(2009, 2, 3, 4, 5, 6, tzinfo=UTC)


def spool(t: datetime = T1, begin: int = 1234, end: int = 5678) -> SpoolData:
    registers = pb.LabelSet(labels=[pb.Label(name="k", value="v1"), pb.Label(name="k", value="v2")])
    return SpoolData(journal=JOURNAL, begin=begin, end=end, first_append_time=t.timestamp(), registers=registers)


def journal_spec() -> pb.JournalSpec:
    spec = pb.JournalSpec(name=JOURNAL, replication=3, flags=pb.JournalSpec.O_RDWR, max_append_rate=1000)
    spec.labels.labels.add(name="app", value="billing")
    spec.fragment.length = 1 << 20
    spec.fragment.compression_codec = pb.SNAPPY
    spec.fragment.stores.extend(["s3://bucket/", "gs://other/"])
    spec.fragment.refresh_interval.FromSeconds(300)
    spec.suspend.level = pb.JournalSpec.Suspend.FULL
    return spec


def render(template: str, t: datetime = T1, spec: pb.JournalSpec | None = None) -> str:
    return render_path_postfix(template, spool(t), spec if spec is not None else journal_spec())


def test_documented_example() -> None:
    template = 'date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}/hour={{ .Spool.FirstAppendTime.Format "15" }}'
    assert render(template, datetime(2019, 11, 19, 22, 41, 7, tzinfo=UTC)) == "date=2019-11-19/hour=22"


def test_empty_and_literal_templates() -> None:
    assert render("") == ""
    assert render("plain/text") == "plain/text"
    assert render("a } b { c }}") == "a } b { c }}"


@pytest.mark.parametrize(
    ("layout", "at_t1", "at_t2"),
    [
        ("2006", "2019", "2009"),
        ("06", "19", "09"),
        ("01", "11", "02"),
        ("1", "11", "2"),
        ("Jan", "Nov", "Feb"),
        ("January", "November", "February"),
        ("02", "19", "03"),
        ("2", "19", "3"),
        ("_2", "19", " 3"),
        ("002", "323", "034"),
        ("__2", "323", " 34"),
        ("15", "22", "04"),
        ("03", "10", "04"),
        ("3", "10", "4"),
        ("04", "05", "05"),
        ("4", "5", "5"),
        ("05", "09", "06"),
        ("5", "9", "6"),
        ("PM", "PM", "AM"),
        ("pm", "pm", "am"),
        ("Mon", "Tue", "Tue"),
        ("Monday", "Tuesday", "Tuesday"),
        ("MST", "UTC", "UTC"),
        ("-0700", "+0000", "+0000"),
        ("-07:00", "+00:00", "+00:00"),
        ("-07", "+00", "+00"),
        ("-070000", "+000000", "+000000"),
        ("-07:00:00", "+00:00:00", "+00:00:00"),
        ("Z07:00", "Z", "Z"),
        ("Z0700", "Z", "Z"),
        ("Z07", "Z", "Z"),
        ("Z07:00:00", "Z", "Z"),
        (".000", ".123", ".000"),
        (".000000", ".123456", ".000000"),
        (".000000000", ".123456000", ".000000000"),
        (",000", ",123", ",000"),
        (".999", ".123", ""),
        (".999999999", ".123456", ""),
    ],
)
def test_layout_token(layout: str, at_t1: str, at_t2: str) -> None:
    template = f'{{{{ .Spool.FirstAppendTime.Format "{layout}" }}}}'
    assert render(template, T1) == at_t1
    assert render(template, T2) == at_t2


@pytest.mark.parametrize(
    ("layout", "t", "want"),
    [
        ("2006-01-02T15:04:05Z07:00", T1, "2019-11-19T22:05:09Z"),  # RFC 3339
        ("Mon, 02 Jan 2006 15:04:05 MST", T1, "Tue, 19 Nov 2019 22:05:09 UTC"),  # RFC 1123
        ("3:04PM", T1, "10:05PM"),  # Kitchen
        ("3 PM", datetime(2009, 2, 3, 0, 0, tzinfo=UTC), "12 AM"),  # Midnight is 12 on a 12-hour clock.
        ("15:04:05.999", datetime(2009, 2, 3, 4, 5, 6, 120000, tzinfo=UTC), "04:05:06.12"),
        ("Janet Monthly hour", T1, "Janet Monthly hour"),  # Jan/Mon before a lower-case letter are words.
        ("_2006", T1, "_2019"),  # A literal "_" then the year, not "_2" then "006".
        ("2006.01", T1, "2019.11"),  # ".0" followed by a digit is not fractional seconds.
        ("year=2006/T", T1, "year=2019/T"),
    ],
)
def test_layout_literals_and_composites(layout: str, t: datetime, want: str) -> None:
    assert render(f'{{{{ .Spool.FirstAppendTime.Format "{layout}" }}}}', t) == want


@pytest.mark.parametrize(
    ("template", "want"),
    [
        ("{{ .Spool.FirstAppendTime }}", "2019-11-19 22:05:09.123456 +0000 UTC"),
        ("{{ .Spool.FirstAppendTime.String }}", "2019-11-19 22:05:09.123456 +0000 UTC"),
        ("{{ .Spool.FirstAppendTime.UTC.Year }}", "2019"),
        ("{{ .Spool.FirstAppendTime.Unix }}", "1574201109"),
        ("{{ .Spool.FirstAppendTime.UnixMilli }}", "1574201109123"),
        ("{{ .Spool.FirstAppendTime.UnixMicro }}", "1574201109123456"),
        ("{{ .Spool.FirstAppendTime.UnixNano }}", "1574201109123456000"),
        ("{{ .Spool.FirstAppendTime.Year }}", "2019"),
        ("{{ .Spool.FirstAppendTime.Month }}", "November"),
        ('{{ printf "%02d" .Spool.FirstAppendTime.Month }}', "11"),
        ("{{ .Spool.FirstAppendTime.Day }}", "19"),
        ("{{ .Spool.FirstAppendTime.Hour }}", "22"),
        ("{{ .Spool.FirstAppendTime.Minute }}", "5"),
        ("{{ .Spool.FirstAppendTime.Second }}", "9"),
        ("{{ .Spool.FirstAppendTime.Nanosecond }}", "123456000"),
        ("{{ .Spool.FirstAppendTime.YearDay }}", "323"),
        ("{{ .Spool.FirstAppendTime.Weekday }}", "Tuesday"),
        ('{{ printf "%d" .Spool.FirstAppendTime.Weekday }}', "2"),
    ],
)
def test_time_methods(template: str, want: str) -> None:
    assert render(template) == want


def test_epoch_and_pre_epoch_unix_seconds_floor_like_go() -> None:
    assert render("{{ .Spool.FirstAppendTime.Unix }}", datetime(1970, 1, 1, tzinfo=UTC)) == "0"
    assert render("{{ .Spool.FirstAppendTime.Unix }}", datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=UTC)) == "-1"


@pytest.mark.parametrize(
    ("template", "want"),
    [
        ("{{ .Spool.Journal }}/{{ .Spool.Begin }}-{{ .Spool.End }}", "a/journal/1234-5678"),
        ("{{ .JournalSpec.Name }}", JOURNAL),
        ("{{ .JournalSpec.Replication }}", "3"),
        ("{{ .JournalSpec.MaxAppendRate }}", "1000"),
        ("{{ .JournalSpec.Flags }}", "O_RDWR"),  # A JournalSpec_Flag, printed by name.
        ("{{ .JournalSpec.Fragment.Length }}", "1048576"),
        ("{{ .JournalSpec.Fragment.CompressionCodec }}", "SNAPPY"),
        ('{{ printf "%d" .JournalSpec.Fragment.CompressionCodec }}', "4"),
        ("{{ .JournalSpec.Fragment.Stores }}", "[s3://bucket/ gs://other/]"),
        ("{{ .JournalSpec.Fragment.RefreshInterval }}", "5m0s"),
        ("{{ .JournalSpec.Fragment.PathPostfixTemplate }}", ""),
        ("{{ .JournalSpec.Suspend.Level }}", "FULL"),
        ('{{ .JournalSpec.ValueOf "app" }}', "billing"),  # Promoted from the embedded LabelSet.
        ('{{ .JournalSpec.LabelSet.ValueOf "app" }}', "billing"),
        ('{{ .JournalSpec.ValuesOf "app" }}', "[billing]"),
        ('{{ .Spool.Registers.ValueOf "k" }}', "v1"),
        ('{{ .Spool.Registers.ValueOf "missing" }}', ""),
        ('{{ .Spool.Registers.ValuesOf "k" }}', "[v1 v2]"),
        # Gazette embeds Spool and *JournalSpec, so their fields are promoted to the top level.
        ("{{ .Name }}:{{ .Begin }}:{{ .FirstAppendTime.Year }}:{{ .Replication }}", "a/journal:1234:2019:3"),
        ("{{ $.Spool.Journal }}", JOURNAL),
    ],
)
def test_fields(template: str, want: str) -> None:
    assert render(template) == want


@pytest.mark.parametrize(
    ("nanos", "want"),
    [
        (0, "0s"),
        (1, "1ns"),
        (2_000, "2µs"),
        (1_500_000, "1.5ms"),
        (1_500_000_000, "1.5s"),
        (90 * 10**9, "1m30s"),
        (300 * 10**9, "5m0s"),
        (3600 * 10**9, "1h0m0s"),
        (26 * 3600 * 10**9 + 1, "26h0m0.000000001s"),
    ],
)
def test_durations_print_like_go(nanos: int, want: str) -> None:
    spec = journal_spec()
    spec.fragment.flush_interval.FromNanoseconds(nanos)
    assert render("{{ .JournalSpec.Fragment.FlushInterval }}", spec=spec) == want


@pytest.mark.parametrize(
    ("template", "want"),
    [
        ('{{ printf "%05d" .Spool.Begin }}', "01234"),
        ('{{ printf "%016x" .Spool.Begin }}', "00000000000004d2"),
        ('{{ printf "%X" 255 }}', "FF"),
        ('{{ printf "%x" "hi" }}', "6869"),
        ('{{ printf "%.1X" "hi" }}', "68"),
        ('{{ printf "%+d|%-6d|%6d" 5 7 9 }}', "+5|7     |     9"),
        ('{{ printf "%5s|%-5s|" "ab" "cd" }}', "   ab|cd   |"),
        ('{{ printf "%05s" "ab" }}', "000ab"),  # Go zero-pads strings too.
        ('{{ printf "%.2s" "abcdef" }}', "ab"),
        ('{{ printf "%v-%v-%v" .Spool.Begin "s" true }}', "1234-s-true"),
        ('{{ printf "%s/%d" .Spool.FirstAppendTime.Month .Spool.FirstAppendTime.Month }}', "November/11"),
        ('{{ printf "%d%%" 50 }}', "50%"),
        ('{{ printf "%s-%s" .Spool.Journal .JournalSpec.Name }}', "a/journal-a/journal"),
        ('{{ printf "%d %d %d" 010 0x1F 1_000 }}', "8 31 1000"),  # Go integer literals.
        ('{{ .Spool.Begin | printf "%08d" }}', "00001234"),  # The piped value is the last argument.
        ('{{ "2006" | .Spool.FirstAppendTime.Format }}', "2019"),
        ('{{ "x" | printf "%s-%s" "y" }}', "y-x"),
    ],
)
def test_printf_and_pipelines(template: str, want: str) -> None:
    assert render(template) == want


@pytest.mark.parametrize(
    ("template", "want"),
    [
        ("a  {{- .Spool.Begin -}}  b", "a1234b"),
        ("a \n\t{{- .Spool.Begin }} \n b", "a1234 \n b"),
        ("a {{ .Spool.Begin -}}\n\n b", "a 1234b"),
        ("{{-3}}", "-3"),  # "-" not followed by a space is a negative number, not a trim marker.
        ("{{ 3 -}}  x", "3x"),
        ("x{{/* a comment */}}y", "xy"),
        ("x{{/* a\nmulti-line comment */}}y", "xy"),
        ("x  {{- /* trimmed comment */ -}}  y", "xy"),
        ("x {{/* kept spaces */}} y", "x  y"),
    ],
)
def test_trim_markers_and_comments(template: str, want: str) -> None:
    assert render(template) == want


@pytest.mark.parametrize(
    ("template", "want"),
    [
        ('{{ "a\\tb" }}', "a\tb"),
        ('{{ "q\\"q" }}', 'q"q'),
        ('{{ "\\u00e9\\x41\\101" }}', "éAA"),
        ("{{ `raw\\n` }}", "raw\\n"),
        ('{{ "}}" }}', "}}"),  # A delimiter inside a string does not close the action.
        ("{{ `-}}` }}", "-}}"),
        ("{{ 42 }}", "42"),
        ("{{ true }}/{{ false }}", "true/false"),
    ],
)
def test_literals(template: str, want: str) -> None:
    assert render(template) == want


@pytest.mark.parametrize(
    ("template", "detail"),
    [
        ("{{ .Spool.Nope }}", "can't evaluate field Nope in type Spool"),
        ("{{ .JournalSpec.Nope }}", "can't evaluate field Nope in type JournalSpec"),
        ("{{ .Spool.Begin.Foo }}", "can't evaluate field Foo in type int"),
        ("{{ .Fragment }}", "can't evaluate field Fragment"),  # Ambiguous: in both Spool and JournalSpec.
        ("{{ if .Spool.Begin }}x{{ end }}", "{{if}} actions are not supported"),
        ("{{ range .Spool.Begin }}", "{{range}} actions are not supported"),
        ("{{ with .Spool.Begin }}", "{{with}} actions are not supported"),
        ("{{ end }}", "{{end}} actions are not supported"),
        ("{{ index .Spool.Registers 0 }}", 'function "index" is not supported'),
        ("{{ .Spool.Begin | len }}", 'function "len" is not supported'),
        ("{{ nope }}", 'function "nope" is not supported'),
        ('{{ printf "%s" printf }}', "it must start a command"),
        ("{{ $x := 1 }}", "variable $x is not supported"),
        ("{{ (.Spool.Begin) }}", "unexpected '('"),
        ("{{ 'a' }}", 'unexpected "\'"'),
        ("{{ 1.5 }}", "number 1.5 is not supported"),
        ("{{ }}", "missing value for command"),
        ("{{ .Spool.Begin | }}", "missing value for command"),
        ("{{ .Spool.Begin", "unclosed action"),
        ("{{/* comment", "unclosed comment"),
        ("{{/* comment */ .Spool.Begin }}", "comment ends before closing delimiter"),
        ('{{ "abc }}', "unterminated quoted string"),
        ('{{ "a\nb" }}', "unterminated quoted string"),
        ('{{ "\\q" }}', "invalid escape \\q"),
        ('{{ printf "%q" 1 }}', "printf verb '%q' is not supported"),
        ('{{ printf "%d" }}', "missing argument for %d"),
        ('{{ printf "%d" 1 2 }}', "1 extra argument(s)"),
        ('{{ printf "%d" "s" }}', "can't format a string"),
        ("{{ printf .Spool.Begin }}", "format string"),
        ("{{ .Spool.FirstAppendTime.Format }}", "wrong number of args for Format: want 1 got 0"),
        ('{{ .Spool.FirstAppendTime.Unix "x" }}', "wrong number of args for Unix: want 0 got 1"),
        ("{{ .Spool.FirstAppendTime.Format 5 }}", "wrong type for value; expected string; got int"),
        ("{{ .Spool.Begin 3 }}", "Begin is a field, not a method"),
        ('{{ "x" 3 }}', "can't give argument to non-function"),
        ('{{ .Spool.Begin | "x" }}', "can't give argument to non-function"),
        ("{{ . 3 }}", "can't give argument to non-function ."),
        ("{{ .JournalSpec }}", "can't print a value of type JournalSpec"),
        ("{{ . }}", "can't print a value of type template data"),
        ("{{ .Spool.Registers.Labels }}", "repeated Label"),
    ],
)
def test_errors_at_parse_time(template: str, detail: str) -> None:
    with pytest.raises(PostfixTemplateError) as info:
        parse_postfix_template(template)
    assert detail in str(info.value)
    assert str(info.value).startswith("template: postfix:1:1: at {{")
    assert info.value.action.startswith("{{")


def test_error_names_the_action_and_its_position() -> None:
    template = 'date={{ .Spool.FirstAppendTime.Format "2006" }}\n  x={{ .Spool.Nope }}/y'
    with pytest.raises(PostfixTemplateError) as info:
        parse_postfix_template(template)
    err = info.value
    assert isinstance(err, FragmentError)
    assert str(err) == "template: postfix:2:5: at {{ .Spool.Nope }}: can't evaluate field Nope in type Spool"
    assert (err.action, err.line, err.column, err.journal) == ("{{ .Spool.Nope }}", 2, 5, "")


def test_render_error_carries_the_journal() -> None:
    template = parse_postfix_template("{{ .Spool.FirstAppendTime.Year }}")
    far_future = SpoolData(journal=JOURNAL, begin=0, end=0, first_append_time=1e20, registers=pb.LabelSet())
    with pytest.raises(PostfixTemplateError) as info:
        template.render(far_future, journal_spec())
    assert info.value.journal == JOURNAL
    assert info.value.action == "{{ .Spool.FirstAppendTime.Year }}"


def test_parsed_template_renders_many_spools() -> None:
    template = parse_postfix_template('{{ printf "%03d" .Spool.Begin }}/{{ .Spool.FirstAppendTime.Format "2006" }}')
    assert template.source.startswith("{{ printf")
    assert template.render(spool(T1, begin=7), journal_spec()) == "007/2019"
    assert template.render(spool(T2, begin=42), journal_spec()) == "042/2009"


def test_render_path_postfix_caches_parsed_templates() -> None:
    template = '{{ .Spool.FirstAppendTime.Format "2006" }}/cache-test'
    before = postfix._parse_cached.cache_info()
    assert render(template) == "2019/cache-test"
    assert render(template, T2) == "2009/cache-test"
    after = postfix._parse_cached.cache_info()
    assert after.misses == before.misses + 1
    assert after.hits == before.hits + 1


def test_render_path_postfix_raises_for_a_bad_template() -> None:
    with pytest.raises(PostfixTemplateError, match="unclosed action"):
        render("x={{ .Spool.Begin")
