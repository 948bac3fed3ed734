"""Spec trees: journalspace YAML (strict decoding, flattening, hoisting), and in `gitops` the
reconciler of spec directories (jinja2 templating, plan/diff, guarded sync)."""
