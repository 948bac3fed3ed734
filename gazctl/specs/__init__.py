"""Spec trees: journalspace YAML (decoded strictly with `broker.specs`, flattened, hoisted), and in `gitops` the
reconciler of spec directories (jinja2 templating, plan/diff, guarded sync)."""
