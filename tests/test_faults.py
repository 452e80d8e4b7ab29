"""A training run killed anywhere loses nothing: real train.py subprocesses of a tiny model over real
Milvus Lite banks, rewarded by a judge on loopback (tests/processes.py's ParityJudge: groups with
reward spread, so the advantages and the policy gradient are part of what resumes), killed with SIGKILL
(during the bank build, during a checkpoint write, at drawn points; a PPO run mid-update) or stopped
with SIGTERM / SIGINT, then resumed with `ckpt_path=last`. Each resumed run must end with the
unbroken run's parameters (atol 1e-6) and logs in which every step appears exactly once.

Every kill and stop lands at a named fault point (memr1/faults.py, armed by `MEMR1_FAULT`), not after
a wall-clock delay, so the same kills happen on a slow and a fast machine.

Time budget: about 4 minutes on 2 CPU cores (16 runs of ~15-25 s, most of each the imports).
"""

from __future__ import annotations

import csv
import json
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from processes import ROOT, environment, parity_judge, run, train_command, wait_for_line
from memr1.callbacks import checkpoint_step, latest_checkpoint
from memr1.llm.loading import load_tokenizer
from memr1.llm.testing import save_tiny_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model", load_tokenizer("embedded:smollm2-135m-instruct"))


@pytest.fixture(scope="module")
def judge() -> Iterator[str]:
    """The judge that rewards every run here (tests/processes.py's ParityJudge): groups with spread."""
    with parity_judge() as url:
        yield url


def unbroken_run(backbone: Path, root: Path, judge: str, algo: str = "grpo", *extra: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    status = run(train_command(backbone, root / "run", root / "banks", *extra, judge=judge, algo=algo), root / "log.txt")
    assert status == 0, (root / "log.txt").read_text()[-3000:]
    return root


@pytest.fixture(scope="module")
def unbroken(backbone, judge, tmp_path_factory) -> Path:
    return unbroken_run(backbone, tmp_path_factory.mktemp("unbroken"), judge)


def logged_rows(run_dir: Path) -> list[tuple[int, str, str]]:
    """(step, kind, reward or f1) of every metrics.csv row, in file order."""
    with (run_dir / "csv" / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    return [
        (int(row["step"]), "val", row["val/f1"]) if row.get("val/f1") else (int(row["step"]), "train", row["reward/mean"])
        for row in rows
    ]


def sample_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "samples.jsonl").read_text().splitlines()]


def assert_same_run(run_dir: Path, expected_dir: Path) -> None:
    expected = load_file(expected_dir / "policy" / "last" / "model.safetensors")
    actual = load_file(run_dir / "policy" / "last" / "model.safetensors")
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=1e-6, msg=name)
    # Every step logged exactly once, with the unbroken run's values (the runs are deterministic).
    assert logged_rows(run_dir) == logged_rows(expected_dir)
    assert json.loads((run_dir / "curves.json").read_text()) == json.loads((expected_dir / "curves.json").read_text())
    assert sample_steps(run_dir) == sample_steps(expected_dir)


def assert_checkpoints_whole(checkpoints: Path) -> None:
    """Every *.ckpt loads (a write cut short leaves only a dot-named .tmp)."""
    for path in checkpoints.glob("*.ckpt"):
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
        assert "loops" in checkpoint and "state_dict" in checkpoint, path


def resume_command(backbone: Path, run_dir: Path, banks: Path, judge: str, algo: str = "grpo", *extra: str) -> list[str]:
    started = latest_checkpoint(run_dir / "checkpoints") is not None
    return train_command(backbone, run_dir, banks, *extra, *(["ckpt_path=last"] if started else []), judge=judge, algo=algo)


def metric_column(run_dir: Path, name: str) -> list[float]:
    with (run_dir / "csv" / "metrics.csv").open() as file:
        return [float(row[name]) for row in csv.DictReader(file) if row.get(name)]


def test_unbroken_run_logs_each_step_once_quietly(unbroken):
    run_dir = unbroken / "run"
    # The judge pays some samples and not others: the policy gradient, not only the entropy bonus, moves the weights.
    assert max(metric_column(run_dir, "advantage/nonzero_frac")) > 0 and len(set(metric_column(run_dir, "reward/mean"))) > 1
    steps = [step for step, kind, _ in logged_rows(run_dir) if kind == "train"]
    assert steps == [1, 2, 3, 4, 5, 6]  # metrics.csv counts steps from 1, as the curves do
    assert [s for s, kind, _ in logged_rows(run_dir) if kind == "val"] == [2, 4, 6]
    curves = json.loads((run_dir / "curves.json").read_text())
    assert [step for step, _ in curves["train"]["reward/mean"]] == steps
    output = (unbroken / "log.txt").read_text()
    assert "step 1/6 | reward" in output and "validation at step 6 | val/bleu1" in output  # console lines in a file
    for noise in ("faiss", "ModelCheckpoint with manual optimization", "FutureWarning", "litlogger", "Loading weights"):
        assert noise not in output
    assert not [line for line in output.splitlines() if line.startswith("INFO: ")]  # no line printed twice
    assert output.count("max_steps=6` reached") == 1


STEPS, MICRO_BATCHES_PER_STEP, VALIDATE_EVERY = 6, 2, 2  # TINY_RUN: 2 states x G 2 in micro-batches of 2


def random_fault(rng: random.Random, done: int) -> str:
    """A fault point the resumed run will reach, `done` of its steps already checkpointed: a step's
    start, a micro-batch, a checkpoint write, or a validation, the hit drawn among those still to come."""
    remaining = STEPS - done
    validations = sum(1 for step in range(done + 1, STEPS + 1) if step % VALIDATE_EVERY == 0)
    choices = {"train_step": remaining, "micro_batch": MICRO_BATCHES_PER_STEP * remaining, "checkpoint_write": remaining}
    if validations:
        choices["validation_batch"] = validations
    point = rng.choice(sorted(choices))
    return f"{point}:{rng.randint(1, choices[point])}"


def test_sigkill_anywhere_then_resume_ends_where_the_unbroken_run_ends(backbone, unbroken, judge, tmp_path):
    run_dir, banks, log = tmp_path / "run", tmp_path / "banks", tmp_path / "log.txt"
    rng = random.Random(1234)
    # Fault points, not wall-clock delays: each kill lands at the same place on a slow or a fast machine.
    # The first two are fixed (mid bank build, mid checkpoint write); four more are drawn among what the
    # resumed run still has to do.
    kills = ["bank_write:1", "checkpoint_write:2"]
    hit = []
    for position in range(6):
        latest = latest_checkpoint(run_dir / "checkpoints")
        done = checkpoint_step(latest) if latest is not None else 0
        if done == STEPS:  # only the last validation is left: no more training to kill
            break
        fault = kills[position] if position < len(kills) else random_fault(rng, done)
        status = run(resume_command(backbone, run_dir, banks, judge), log, fault=fault)
        assert status == -signal.SIGKILL, f"{fault}: meant to be killed there, it exited {status}:\n{log.read_text()[-3000:]}"
        point, number = fault.split(":")
        assert f"memr1 fault: SIGKILL at {point} #{number}" in log.read_text()
        hit.append(fault)
        assert_checkpoints_whole(run_dir / "checkpoints")
        if point == "bank_write":
            assert not (banks / "rl-add_all-6427110d32.progress.json").exists()  # the build had not finished
        if point == "checkpoint_write":
            assert list((run_dir / "checkpoints").glob(".*.ckpt.tmp"))  # killed mid-write: only a .tmp left
    assert len(hit) >= 4, hit
    print("fault points hit:", " ".join(hit))  # the same on any machine (pytest -s shows it)
    assert run(resume_command(backbone, run_dir, banks, judge), log) == 0, log.read_text()[-3000:]
    assert_same_run(run_dir, unbroken / "run")


def test_a_ppo_run_killed_mid_update_resumes_to_the_unbroken_one(backbone, judge, tmp_path):
    # PPO's resume carries more: the critic, its optimiser, GAE's advantages from its values.
    # 4 states of one sample each, in micro-batches of 2: micro-batch 5 is step 3's first (a checkpoint
    # write is the GRPO test's; what differs here is the critic, killed with the actor mid-update).
    four = "data_loader.states_per_step=4"
    expected = unbroken_run(backbone, tmp_path / "unbroken", judge, "ppo", four)
    run_dir, banks, log = tmp_path / "run", tmp_path / "banks", tmp_path / "log.txt"
    for fault in ("micro_batch:5",):
        status = run(resume_command(backbone, run_dir, banks, judge, "ppo", four), log, fault=fault)
        assert status == -signal.SIGKILL, f"{fault}: meant to be killed there, it exited {status}:\n{log.read_text()[-3000:]}"
    assert run(resume_command(backbone, run_dir, banks, judge, "ppo", four), log) == 0, log.read_text()[-3000:]
    assert_same_run(run_dir, expected / "run")


def test_a_stop_during_the_probe_waits_for_the_step_to_end(backbone, unbroken, judge, tmp_path):
    """The probe runs after a step's optimiser step (step 4 here, a validation step: TINY_RUN probes at
    steps 1, 2, 4, 6). A stop signal there waits for the step's end, where the checkpoint holds the
    whole step and marks the validation due after it: the resumed run is the unbroken one. (Surfacing
    inside the probe, the stop left the loop one batch behind the global step: that step's logs were
    lost and every later validation came a step late.)"""
    run_dir, banks, log = tmp_path / "run", tmp_path / "banks", tmp_path / "log.txt"
    with log.open("w") as out:
        process = subprocess.Popen(
            train_command(backbone, run_dir, banks, judge=judge), cwd=ROOT, env=environment("probe:3:WAIT"),
            stdout=out, stderr=subprocess.STDOUT,
        )
        wait_for_line(process, log, "memr1 fault: WAIT at probe #3")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 128 + signal.SIGTERM, log.read_text()[-3000:]
    assert [path.name for path in (run_dir / "checkpoints").glob("interrupted-step=*.ckpt")] == ["interrupted-step=4.ckpt"]
    assert run(train_command(backbone, run_dir, banks, "ckpt_path=last", judge=judge), log) == 0, log.read_text()[-3000:]
    assert_same_run(run_dir, unbroken / "run")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_checkpoints_exits_and_resumes(backbone, unbroken, judge, tmp_path, signum):
    run_dir, banks, log = tmp_path / "run", tmp_path / "banks", tmp_path / "log.txt"
    command = train_command(backbone, run_dir, banks, "logging.wandb=true", judge=judge)
    with log.open("w") as out:
        # The run waits at step 4's start until the signal comes: it cannot finish first on a fast machine.
        process = subprocess.Popen(command, cwd=ROOT, env=environment("train_step:4:WAIT"), stdout=out, stderr=subprocess.STDOUT)
        wait_for_line(process, log, "memr1 fault: WAIT at train_step #4")
        process.send_signal(signum)
        sent = time.monotonic()
        status = process.wait(timeout=60)
    assert status == 128 + signum, log.read_text()[-3000:]
    assert time.monotonic() - sent < 60
    output = log.read_text()
    assert f"received {signal.Signals(signum).name}" in output
    assert f"resume with: python train.py run_dir={run_dir} ckpt_path=last" in output
    (interrupted,) = (run_dir / "checkpoints").glob("interrupted-step=*.ckpt")
    assert latest_checkpoint(run_dir / "checkpoints") == interrupted
    if signum == signal.SIGINT:
        return  # the resume after a stop is the same whichever signal stopped it: checked once, for SIGTERM
    run_id = (run_dir / "wandb_run_id.txt").read_text().strip()

    assert run(train_command(backbone, run_dir, banks, "logging.wandb=true", "ckpt_path=last", judge=judge), log) == 0, log.read_text()[-3000:]
    assert_same_run(run_dir, unbroken / "run")
    # W&B resumed the same run: both processes wrote offline runs under the one id.
    assert (run_dir / "wandb_run_id.txt").read_text().strip() == run_id
    assert len(list((run_dir / "wandb").glob(f"offline-run-*-{run_id}"))) == 2
