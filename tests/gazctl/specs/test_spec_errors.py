"""Hostile spec input through the real CLI: each is one `error: ...` line naming the file, and exit 1.

Templates that raise (Python errors, runaway recursion, sandbox violations), values files that are
no mapping of names, and journalspace YAML that is too deep, recursive, an alias bomb or no
Unicode text once used to end `gazctl plan` and `gazctl journals apply` in a Python traceback
(or, for libyaml's recursive composer, a segfault). No broker is needed: all fail before one is
contacted.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.support.harness import gazctl_env, one_line_error, run_gazctl

NOWHERE = "http://127.0.0.1:1"
"""No broker listens there: a tree that loaded would fail UNAVAILABLE instead."""


def one_line(done: subprocess.CompletedProcess[str], *expected: str) -> str:
    """The single `error: ...` line of a run that exited 1, checked to hold each of `expected` and not
    to be the unreachable broker's."""
    line = one_line_error(done, *expected)
    assert "UNAVAILABLE" not in line
    return line


def plan(tmp_path: Path, files: Mapping[str, str | bytes], *args: str) -> subprocess.CompletedProcess[str]:
    tree = tmp_path / "specs"
    tree.mkdir(exist_ok=True)
    for name, content in files.items():
        path = tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return run_gazctl(None, "plan", str(tree), "--owner", "x", "--broker.address", NOWHERE, *args,
                      cwd=tmp_path, timeout=60)


def apply_dry_run(tmp_path: Path, content: str | bytes) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "journals.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return run_gazctl(None, "journals", "apply", "--dry-run", "--specs", str(path), cwd=tmp_path, timeout=60)


# 1. Templates which raise something other than a jinja2.TemplateError.


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("{{ [].pop() }}", "a.yaml.j2:2: template error: access to attribute 'pop' of 'list' object is unsafe"),
        ("{{ 1/0 }}", "a.yaml.j2:2: template error: ZeroDivisionError: division by zero"),
        ("{{[3,'']|sort}}", "a.yaml.j2:2: template error: TypeError: '<' not supported between instances of"),
        ("{{ 'abc'[::0] }}", "a.yaml.j2:2: template error: ValueError: slice step cannot be zero"),
        ("{% include 'a.yaml.j2' %}", "a.yaml.j2:2: template error: recursion too deep"),
        ("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "a.yaml.j2:2: template error: recursion too deep"),
        ("{{ 2 ** 1000000000 }}", "a.yaml.j2:2: template error: 2 ** 1000000000 is larger than"),
        ("{{ 'x' * 10000000000 }}", "a.yaml.j2:2: template error: str of 1 items * 10,000,000,000 is longer than"),
        ("{{ ''.__class__ }}", "a.yaml.j2:2: template error: access to attribute '__class__' of 'str' object"),
        ("{{ '\\ud800' }}", "a.yaml.j2 (rendered):2:1: invalid character U+D800"),
    ],
)
def test_template_errors_are_one_line(tmp_path: Path, expression: str, expected: str) -> None:
    one_line(plan(tmp_path, {"a.yaml.j2": f"name: a/b\n{expression}\n"}), expected)


def test_templates_cannot_change_the_values_other_templates_see(tmp_path: Path) -> None:
    files = {"values.yaml": "regions: [a, b]\n", "a.yaml.j2": "name: x/{{ regions.append('c') }}\n"}
    one_line(plan(tmp_path, files), "a.yaml.j2:1: template error: access to attribute 'append' of 'list'")


def test_macros_imported_from_files_render_in_the_sandbox(tmp_path: Path) -> None:
    files = {
        "values.yaml": "parts: 2\n",
        "_lib.j2": "{% macro journal(name) %}- name: t/{{ name }}{% endmacro %}",
        "t.yaml.j2": "{% from '_lib.j2' import journal %}name: t/\nreplication: 1\n"
                     "fragment: {length: 1024, compression_codec: NONE, refresh_interval: 1m0s}\nchildren:\n"
                     "{% for i in range(parts) %}{{ journal('p-%02d' % i) }}\n{% endfor %}",
    }
    done = plan(tmp_path, files)
    # The tree loaded (both journals), so the plan went on to the cluster, which is not there.
    assert done.returncode == 1 and "UNAVAILABLE" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


# 2. Values files which are no mapping of names, or no UTF-8.


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (b"1: x\n", "values.yaml:1:1: 1: a template variable must be a string; got integer 1"),
        (b"a: 1\n[b]: 2\n", "values.yaml:2:1: a mapping key must be a scalar, not a list or mapping"),
        (b"a: 1\nnull: 2\n", "values.yaml:2:1: null: a template variable must be a string; got null"),
        (b"self: x\n", "values.yaml:1:1: self: `self` cannot be a template variable"),
        (b"x: \"\xff\"\n", "values.yaml:1:5: invalid UTF-8 (byte 0xff)"),
        (b"a: 1\nb: caf\xc3\xa9 \xe9\n", "values.yaml:2:9: invalid UTF-8 (byte 0xe9)"),
        (b"x: &a [*a]\n", "values.yaml:1:4: recursive alias"),
        (b"x: \"\\ud800\"\n", "values.yaml:1:4: invalid character U+D800"),
        (b"[" * 2000, "values.yaml:1:101: nested deeper than 100 levels"),
        (b"- x\n", "values.yaml:1:1: a values file must be a mapping of names to values; got a list"),
    ],
)
def test_values_errors_are_one_line(tmp_path: Path, values: bytes, expected: str) -> None:
    one_line(plan(tmp_path, {"values.yaml": values, "a.yaml.j2": "name: a/b\n"}), expected)


def test_values_flag_errors_are_one_line(tmp_path: Path) -> None:
    values = tmp_path / "v.yaml"
    values.write_bytes(b"1: x\n")
    one_line(plan(tmp_path, {"a.yaml.j2": "name: a/b\n"}, "--values", str(values)), "v.yaml:1:1: 1: a template")


def test_spec_file_of_invalid_utf8(tmp_path: Path) -> None:
    one_line(plan(tmp_path, {"a.yaml": b"name: a/\xff\n"}), "a.yaml:1:9: invalid UTF-8 (byte 0xff)")


# 3. Journalspace YAML that is too deep, recursive, explosive, or no Unicode.


def alias_bomb(levels: int) -> str:
    """A valid-looking tree whose nodes each list the one below twice: 2**levels nodes, few lines."""
    node = "&n0 {name: a/b}"
    for i in range(1, levels + 1):
        node = f"&n{i} {{name: a/, children: [{node}, *n{i - 1}]}}"
    return f"name: a/\nchildren: [{node}]\n"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[" * 2000, "journals.yaml:1:101: nested deeper than 100 levels"),
        ("[" * 100_000, "journals.yaml:1:101: nested deeper than 100 levels"),  # libyaml's composer: a segfault
        ("- " * 1000 + "x\n", "journals.yaml:1:201: nested deeper than 100 levels"),
        ("name: a/\nchildren: &c\n- name: a/b/\n  children: *c\n", "journals.yaml:2:11: recursive alias"),
        ("name: a/\nfragment: &f {<<: *f}\n", "journals.yaml:2:11: recursive alias"),
        ('name: "a/\\ud800"\n', "journals.yaml:1:7: invalid character U+D800 in a string"),
        ('name: a/\nlabels:\n- name: "\\udfff"\n', "journals.yaml:3:9: invalid character U+DFFF"),
        ("name: a/\x01\n", "journals.yaml:1:9: invalid YAML: unacceptable character U+0001"),
        (b"name: a/\xff\n", "journals.yaml:1:9: invalid UTF-8 (byte 0xff)"),
        (alias_bomb(40), "journals.yaml:2:740: aliases expand this value to 131,063 values (the document has 208;"),
    ],
)
def test_apply_errors_are_one_line(tmp_path: Path, content: str | bytes, expected: str) -> None:
    one_line(apply_dry_run(tmp_path, content), expected)


def test_apply_from_stdin_of_invalid_utf8(tmp_path: Path) -> None:
    done = subprocess.run(
        ["/bin/sh", "-c", 'printf "name: a/\\377\\n" | "$0" -m gazctl journals apply --dry-run', sys.executable],
        capture_output=True, text=True, env=gazctl_env(None, tmp_path), cwd=tmp_path, timeout=60,
    )
    one_line(done, "<stdin>:1:9: invalid UTF-8 (byte 0xff)")


def test_deep_but_allowed_trees_still_apply(tmp_path: Path) -> None:
    # 45 directory levels (90 YAML levels, plus a label's 2): within the limit, and every pass
    # over the tree (decode, validation, inheritance) copes with it.
    levels = 45
    text = "name: d/\nlabels: [{name: app.gazette.dev/x, value: y}]\nreplication: 1\n"
    text += "fragment: {length: 1024, compression_codec: NONE, refresh_interval: 1m0s}\n"
    name, indent = "d/", ""
    for _ in range(levels):
        name += "e/"
        text += f"{indent}children:\n{indent}- name: {name}\n"
        indent += "  "
    text += f"{indent}children:\n{indent}- name: {name}journal\n"
    done = apply_dry_run(tmp_path, text)
    assert done.returncode == 0, done.stderr
    assert f'name: "{name}journal"' in done.stdout

