"""Where a spec tree comes from: its owner name (for the ownership label) and its git commit.

The owner is `--owner` if given, else the checkout's `origin` remote normalized so that the
https and ssh forms of one repository agree (`git@github.com:acme/specs.git` and
`https://github.com/acme/specs` are both `github.com/acme/specs`), else the directory's name.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from broker.protocol import pb
from broker.protocol.labels import MANAGED_BY
from broker.protocol.validation import ValidationError, validate_label
from gazctl.specs.gitops.errors import OwnershipError

"""The ownership label (Gazette's labels.ManagedBy convention): the spec repository that manages a journal."""
SPEC_SHA1 = "gitops.gazette.dev/spec-sha1"
"""SHA-1 of the spec sync last applied to a journal: a journal whose spec no longer hashes to it drifted."""
COMMIT = "gitops.gazette.dev/commit"
"""The git commit of the tree sync last changed the journal from."""


@dataclass(frozen=True)
class Source:
    """The owner name of a spec tree and, when it is a git checkout, its commit (`-dirty` if modified)."""

    owner: str
    commit: str | None


def describe(root: Path, owner: str | None = None) -> Source:
    """The source of the tree at `root`; `owner` overrides the one derived from git or the directory."""
    name = owner or _remote_owner(root) or root.resolve().name
    try:
        validate_label(pb.Label(name=MANAGED_BY, value=name))
    except ValidationError as err:
        raise OwnershipError(
            f"cannot use {name!r} as the owner of {root} ({err}); pass --owner with letters, digits and -_+/.=%"
        ) from None
    return Source(name, _commit(root))


def normalize_remote(url: str) -> str:
    """`host/path` of a git remote URL, without scheme, user, port or `.git`."""
    url = url.strip()
    scp = re.fullmatch(r"(?:[^@/]+@)?([^:/]+):(?!//)(.+)", url)  # git@host:path
    if scp:
        host, path = scp.groups()
    else:
        match = re.fullmatch(r"[a-z+]+://(?:[^@/]+@)?([^/:]+)(?::\d+)?/(.+)", url)
        if not match:
            return url.removesuffix(".git").strip("/")
        host, path = match.groups()
    return f"{host}/{path.removesuffix('.git').strip('/')}"


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _remote_owner(root: Path) -> str | None:
    url = _git(root, "remote", "get-url", "origin")
    return normalize_remote(url) if url else None


def _commit(root: Path) -> str | None:
    head = _git(root, "rev-parse", "HEAD")
    if not head:
        return None
    dirty = _git(root, "status", "--porcelain", "--", ".")
    return f"{head}-dirty" if dirty else head
