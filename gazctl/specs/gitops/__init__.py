"""The GitOps control plane: reconcile the cluster's journals to spec trees kept in a git repository.

- tree: read a spec directory (YAML trees, jinja2 templates, a values file), validated as a whole
- source: the tree's owner name and git commit
- plan: compare with the cluster (create, update with field diffs, drift, owned-only prune)
- render: plans as text and as JSON documents (saved plans)
- sync: apply a plan guarded by the revisions it read; what sync last applied
- errors: GitOpsError and its subclasses
"""

from gazctl.specs.gitops.errors import GitOpsError, OwnershipError, PruneRefused, StalePlan, TreeError
from gazctl.specs.gitops.plan import Action, Change, FieldChange, Plan, make_plan
from gazctl.specs.gitops.source import COMMIT, MANAGED_BY, SPEC_SHA1, Source
from gazctl.specs.gitops.tree import SpecTree, load_tree

__all__ = [
    "COMMIT",
    "MANAGED_BY",
    "SPEC_SHA1",
    "Action",
    "Change",
    "FieldChange",
    "GitOpsError",
    "OwnershipError",
    "Plan",
    "PruneRefused",
    "Source",
    "SpecTree",
    "StalePlan",
    "TreeError",
    "load_tree",
    "make_plan",
]
