"""Helpers of the tests that run real processes: free loopback ports, a tiny-model train.py run as a
subprocess, and ways to kill it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A run of a few seconds a step on 2 cores: no-distill Answer Agent over ADD-all banks, GRPO G=2 with
# an entropy bonus (the tiny model earns no reward, so the entropy term is what moves the weights and
# makes the final parameters depend on every step taken), validation every 2 steps.
TINY_RUN = (
    "answer.distill=false", "answer.k_per_speaker=1", "answer.max_new_tokens=4", "algo.group_size=2",
    "algo.actor_lr=1e-3", "algo.entropy_coef=0.1", "algo.micro_batch_size=2",
    "data_loader.states_per_step=2", "data_loader.max_steps=6", "data_loader.val_check_interval=2",
    "data_loader.limit_val_batches=1", "data_loader.val_batch_size=2", "checkpoint.every_n_train_steps=1",
    "logging.wandb=false", "logging.samples_every_n_steps=1",
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def train_command(backbone: Path, run_dir: Path, banks_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, str(ROOT / "train.py"), f"backbone.name_or_path={backbone}", f"run_dir={run_dir}",
        f"banks.dir={banks_dir}", *TINY_RUN, *extra,
    ]


def environment() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline"}


def run(command: list[str], log: Path, timeout: float = 300) -> int:
    with log.open("a") as out:
        return subprocess.run(command, cwd=ROOT, env=environment(), stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode


def run_and_kill(command: list[str], log: Path, when: Callable[[], bool], timeout: float = 300) -> int | None:
    """Start `command`; SIGKILL it as soon as `when()` holds (polled every 0.5 ms). Returns its exit
    status: -9 when killed, else the status it finished with first (None never)."""
    with log.open("a") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=environment(), stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while process.poll() is None and time.monotonic() < deadline:
            if when():
                process.send_signal(signal.SIGKILL)
                break
            time.sleep(0.0005)
        return process.wait(timeout=60)


def file_appears(directory: Path, pattern: str) -> Callable[[], bool]:
    return lambda: directory.is_dir() and any(directory.glob(pattern))


def log_shows(log: Path, text: str, delay: float = 0.0) -> Callable[[], bool]:
    """True `delay` seconds after `text` appears in what `log` gains from now on (this process's lines)."""
    start = log.stat().st_size if log.exists() else 0
    seen: list[float] = []

    def check() -> bool:
        if not seen:
            with log.open() as file:
                file.seek(start)
                if text in file.read():
                    seen.append(time.monotonic())
        return bool(seen) and time.monotonic() - seen[0] >= delay

    return check
