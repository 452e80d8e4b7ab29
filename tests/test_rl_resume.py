"""A killed run resumes from its last checkpoint and ends where an unbroken run ends; DDP on 2 CPU
processes runs. Each run is a real subprocess (tests/scripts/rl_run.py): a real SIGKILL, a real
Lightning checkpoint, a real DDP launch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # train.py subprocesses

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "rl_run.py"


def run(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(run_dir), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_killed_run_resumes_to_the_same_parameters(tmp_path, algo):
    unbroken = run(tmp_path / "unbroken", "--max-steps", "4", "--algo", algo)
    assert unbroken.returncode == 0, unbroken.stderr[-3000:]

    killed = run(tmp_path / "broken", "--max-steps", "4", "--kill-at-step", "2", "--algo", algo)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (tmp_path / "broken" / "final.pt").exists()
    assert (tmp_path / "broken" / "checkpoints" / "last.ckpt").exists()

    resumed = run(tmp_path / "broken", "--max-steps", "4", "--resume", "--algo", algo)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "finished at global step 4" in resumed.stdout

    expected = torch.load(tmp_path / "unbroken" / "final.pt")
    actual = torch.load(tmp_path / "broken" / "final.pt")
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=1e-6, msg=name)
    # Training moved the weights away from the checkpoint the resumed run started from.
    (at_kill_path,) = (tmp_path / "broken" / "checkpoints").glob("*step=2.ckpt")
    at_kill = torch.load(at_kill_path, weights_only=False)["state_dict"]
    assert any(not torch.equal(at_kill[f"policy.{name}"], expected[name]) for name in expected)
