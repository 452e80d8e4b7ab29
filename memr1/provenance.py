"""Which code produced a run: the git commit of the memr1 checkout it ran from, recorded beside its
results (evaluate.py's report, train.py's log, a pipeline stage's done-marker). A long experiment may
span sessions and commits; its rows then say which code made each of them."""

from __future__ import annotations

import subprocess
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]


def _git(root: Path, *args: str) -> str:
    # --no-optional-locks: `git status` would otherwise take the index lock to refresh it, and a run
    # killed meanwhile (a stopped schedule, a fault test's SIGKILL) leaves the user's checkout locked.
    command = ["git", "--no-optional-locks", "-C", str(root), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=True).stdout.strip()


def code_version(root: Path = CHECKOUT) -> dict[str, str | bool] | None:
    """`{"commit": HEAD's sha, "dirty": whether tracked files differ from it}` of the git checkout
    at `root`; None when `root` is not the top of one (an installed package, whatever repository may
    enclose it) or git is missing."""
    try:
        if Path(_git(root, "rev-parse", "--show-toplevel")).resolve() != root.resolve():
            return None
        commit = _git(root, "rev-parse", "HEAD")
        dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def describe(version: dict[str, str | bool] | None) -> str:
    """One line for a log: `commit 1a2b3c4d5e6f (clean)`, `... (with uncommitted changes)` or `not a git checkout`."""
    if version is None:
        return "not a git checkout"
    return f"commit {str(version['commit'])[:12]} ({'with uncommitted changes' if version['dirty'] else 'clean'})"
