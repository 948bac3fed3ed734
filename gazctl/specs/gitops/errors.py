"""Errors of the GitOps control plane: each is one line naming the file, journal or guard at fault."""

from __future__ import annotations

from gazctl.errors import GazctlError


class GitOpsError(GazctlError):
    """Base of plan and sync errors."""


class TreeError(GitOpsError):
    """A spec directory, file, template or values file that cannot be used (spec errors are SpecError)."""


class OwnershipError(GitOpsError):
    """A journal of the tree is managed by another spec repository, or the owner name is unusable."""


class PruneRefused(GitOpsError):
    """A prune above the guard's limit (or of every owned journal) without --allow-mass-prune."""


class StalePlan(GitOpsError):
    """The cluster or the tree changed since the plan was made: nothing was applied."""
