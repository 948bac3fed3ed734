"""Generated spec input (hypothesis): every decoder returns or raises a GazetteError, and gazctl never a traceback.

YAML documents (random nesting, anchors and aliases, escapes with lone surrogates and control
characters, deep nesting, alias bombs, random edits), journalspace trees (which must also hoist,
dump and decode back to the same journals), values files, spec directories of jinja2 templates,
label selectors (which must print and parse back to themselves) and fragment paths: see
tests/fuzz/fuzz_specs.py, which also runs for minutes on its own. Most inputs are decoded in
process; a few go through the gazctl CLI.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.fragment.errors import FragmentNameError
from broker.fragment.names import parse_fragment_from_relative_path
from broker.protocol.selectors import parse_selector
from broker.protocol.validation import ValidationError
from tests.fuzz.fuzz_specs import (
    _CHARS,
    YAML_DOCUMENTS,
    Problem,
    alias_bombs,
    attempt,
    check_cli_apply,
    check_cli_plan,
    check_fragment,
    check_journalspace,
    check_selector,
    check_tree,
    check_yaml,
    deep_documents,
    fragment_paths,
    journalspace_documents,
    selector_strings,
    spec_dirs,
    texts,
    values_documents,
)


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,  # Nothing written into the working tree; a failure prints its input.
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )


def no_problems(problems: list[Problem]) -> None:
    assert not problems, "\n".join(p.show() for p in problems)


@fuzz_settings(300)
@given(text=YAML_DOCUMENTS)
def test_yaml_documents(text: str) -> None:
    # Both loaders, the values-file decoder and the journalspace decoder.
    no_problems(check_yaml(text))


@fuzz_settings(40)
@given(text=st.one_of(deep_documents(), alias_bombs()))
def test_deep_and_aliased_documents(text: str) -> None:
    no_problems(check_yaml(text))


@fuzz_settings(200)
@given(text=journalspace_documents())
def test_journalspace_trees_decode_and_hoist_back(text: str) -> None:
    no_problems(check_journalspace(text))


@fuzz_settings(100)
@given(text=values_documents())
def test_values_files(text: str) -> None:
    no_problems(check_yaml(text))


@fuzz_settings(150)
@given(files=spec_dirs())
def test_spec_directories_of_templates(files: dict[str, str | bytes]) -> None:
    no_problems(check_tree(files))


@fuzz_settings(500)
@given(text=st.one_of(selector_strings(), texts(_CHARS, max_size=16)))
def test_selectors_parse_or_raise_and_print_back(text: str) -> None:
    outcome, result, problem = attempt("selector", text, lambda: parse_selector(text), 5.0)
    assert problem is None, problem.show()
    assert outcome == "ok" or isinstance(result, ValidationError), result  # SelectorError is one.
    no_problems(check_selector(text))


@fuzz_settings(500)
@given(path=fragment_paths())
def test_fragment_names_parse_or_raise(path: tuple[str, str]) -> None:
    journal, rel = path
    outcome, result, problem = attempt(
        "fragment", rel, lambda: parse_fragment_from_relative_path(journal, rel), 5.0)
    assert problem is None, problem.show()
    assert outcome == "ok" or isinstance(result, FragmentNameError), result
    no_problems(check_fragment(journal, rel))


@pytest.mark.parametrize(
    ("journal", "rel"),
    [
        ("a/b", "\udcff/0000000000000000-0000000000000001-" + "a" * 40 + ".raw"),
        ("a/\ud800", "0000000000000000-0000000000000001-" + "a" * 40 + ".raw"),
        ("a/b", "0000000000000000-0000000000000001-\ud800\ud800"),
    ],
)
def test_fragment_names_with_lone_surrogates(journal: str, rel: str) -> None:
    """A store directory or file whose name is not UTF-8 (os.listdir gives lone surrogates for its bytes)."""
    with pytest.raises(FragmentNameError, match="is not valid UTF-8") as err:
        parse_fragment_from_relative_path(journal, rel)
    str(err.value).encode("utf-8")  # The message itself can be printed.


@fuzz_settings(4)
@given(text=YAML_DOCUMENTS)
def test_apply_cli_never_prints_a_traceback(text: str) -> None:
    no_problems(check_cli_apply(text))


@fuzz_settings(3)
@given(files=spec_dirs())
def test_plan_cli_never_prints_a_traceback(files: dict[str, str | bytes]) -> None:
    no_problems(check_cli_plan(files))
