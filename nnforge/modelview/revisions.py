"""Revisions of a git repository as directories to measure: one detached worktree per commit, kept and reused.

Worktrees live outside the repository (``~/.cache/nnforge/worktrees/<repo>/<commit>`` by default), so measuring
revisions leaves the working tree and ``git status`` untouched. The Python environment is the one running the
command: a revision's code is put first on the path, its dependencies are not installed. When a revision declares
other dependencies than the running environment's checkout, ``dependency_note`` says so.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path


class RevisionError(Exception):
    """A revision that cannot be resolved or checked out; the message names it."""


@dataclass(frozen=True)
class Revision:
    """A commit: what the user typed, the full hash, its subject, and the worktree it is checked out in."""

    name: str
    commit: str
    subject: str
    path: Path

    @property
    def short(self) -> str:
        return self.commit[:10]


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RevisionError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"git {' '.join(args)}")
    return out.stdout.strip()


def repo_root(path: Path) -> Path:
    try:
        return Path(_git(path, "rev-parse", "--show-toplevel"))
    except RevisionError as e:
        raise RevisionError(f"{path} is not inside a git repository ({e})") from None


def resolve(repo: Path, rev: str) -> tuple[str, str]:
    """(full commit hash, subject) of ``rev``; a clear error naming it otherwise."""
    try:
        commit = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except RevisionError:
        raise RevisionError(f"unknown revision {rev!r} in {repo}") from None
    return commit, _git(repo, "log", "-1", "--format=%s", commit)


def commit_range(repo: Path, spec: str) -> list[str]:
    """The commits of ``A..B`` oldest first, A included (it is the reference the others are measured against)."""
    if ".." not in spec:
        raise RevisionError(f"range {spec!r}: expected A..B")
    a, b = spec.split("..", 1)
    a_commit, _ = resolve(repo, a)
    b_commit, _ = resolve(repo, b or "HEAD")
    listed = _git(repo, "rev-list", "--reverse", "--first-parent", f"{a_commit}..{b_commit}").split()
    if not listed:
        raise RevisionError(f"range {spec!r} holds no commits after {a}")
    return [a_commit, *listed]


def cache_dir(repo: Path) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nnforge" / "worktrees"
    return base / hashlib.sha1(str(repo.resolve()).encode()).hexdigest()[:12]


def checkout(repo: Path, rev: str, root: Path | None = None) -> Revision:
    """A worktree of ``rev``, reused when one for that commit exists already."""
    commit, subject = resolve(repo, rev)
    path = (root or cache_dir(repo)) / commit
    if not (path / ".git").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _git(repo, "worktree", "prune")
        _git(repo, "worktree", "add", "--detach", "--force", str(path), commit)
    return Revision(rev, commit, subject, path)


def _dependencies(pyproject: Path) -> list[str] | None:
    try:
        return sorted(tomllib.loads(pyproject.read_text()).get("project", {}).get("dependencies", []))
    except (OSError, tomllib.TOMLDecodeError):
        return None


def dependency_note(rev: Revision, running_checkout: Path) -> str | None:
    """A sentence when the revision's declared dependencies differ from those of the checkout whose environment runs
    it (its code then runs on libraries it did not ask for)."""
    mine, theirs = _dependencies(running_checkout / "pyproject.toml"), _dependencies(rev.path / "pyproject.toml")
    if mine is None or theirs is None or mine == theirs:
        return None
    added = sorted(set(theirs) - set(mine))
    removed = sorted(set(mine) - set(theirs))
    return (f"{rev.name} ({rev.short}) declares other dependencies than this environment's checkout "
            f"(+{', '.join(added) or '-'}; -{', '.join(removed) or '-'}); it runs with this environment's libraries")
