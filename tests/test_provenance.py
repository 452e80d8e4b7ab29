"""The code version a run records: a real git checkout in a temp dir, committed, then edited."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from memr1.provenance import code_version, describe

pytestmark = pytest.mark.slow  # git processes


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_a_run_records_the_commit_it_ran_from_and_whether_it_was_edited(tmp_path):
    root = tmp_path / "checkout"
    root.mkdir()
    git(root, "init", "-q")
    (root / "train.py").write_text("print('v1')\n")
    git(root, "add", "train.py")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1")
    head = git(root, "rev-parse", "HEAD")

    assert code_version(root) == {"commit": head, "dirty": False}
    assert describe(code_version(root)) == f"commit {head[:12]} (clean)"
    (root / "notes.txt").write_text("untracked files do not change the code\n")
    assert code_version(root) == {"commit": head, "dirty": False}
    (root / "train.py").write_text("print('v2')\n")
    assert code_version(root) == {"commit": head, "dirty": True}
    assert describe(code_version(root)).endswith("(with uncommitted changes)")


def test_a_package_inside_someone_elses_repository_records_nothing(tmp_path):
    """An installed memr1 (site-packages in a venv that sits inside some repository) is not that
    repository's checkout: no commit is claimed for it."""
    git(tmp_path, "init", "-q")
    package = tmp_path / ".venv" / "site-packages"
    package.mkdir(parents=True)
    assert code_version(package) is None
    assert code_version(tmp_path / "missing") is None
    assert describe(None) == "not a git checkout"
