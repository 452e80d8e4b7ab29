"""Runs that lose nothing when killed: atomic checkpoints, the newest complete one found on resume,
`metrics.csv` that a resume continues, a stop signal that checkpoints, and no validation skipped.

What a resumed run relies on:
- every checkpoint is written to a temporary file and renamed into place (`AtomicCheckpointIO`), so
  a SIGKILL mid-write leaves the previous checkpoints and a stray `.tmp`, never a truncated `.ckpt`;
- `ckpt_path=last` is the newest checkpoint that loads (`latest_checkpoint`), not a symlink that a
  kill between two file operations could leave dangling;
- every row of `metrics.csv` is on disk before the checkpoint that covers it, and the checkpoint
  records how many rows that is: a resume cuts the file there, so the steps it redoes are logged once;
- a checkpoint taken before a due validation has run (or while it runs) makes the resumed run run
  that validation in full, where Lightning would otherwise skip it.
"""

from __future__ import annotations

import csv
import logging
import os
import re
import signal
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from memr1 import interrupt
from memr1.faults import fault_point
from memr1.modules.outputs import StepOutput

log = logging.getLogger(__name__)

_STEP = re.compile(r"step=(\d+)")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class AtomicCheckpointIO(TorchCheckpointIO):
    """`torch.save` to `<path>.tmp`, fsync, then `os.replace`: a checkpoint is whole or absent."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.tmp")
        with open(temporary, "wb") as file:
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())
        fault_point("checkpoint_write")
        os.replace(temporary, path)


def checkpoint_step(path: Path) -> int:
    """The global step in a checkpoint's file name (`...step=N...ckpt`); -1 when it has none."""
    match = _STEP.search(path.name)
    return int(match.group(1)) if match else -1


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest checkpoint in `directory` that loads: the highest step, the newest file among equal
    steps; symlinks and temporary files are never candidates. None when there is none."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    candidates = [p for p in directory.glob("*.ckpt") if p.is_file() and not p.is_symlink()]
    candidates.sort(key=lambda p: (checkpoint_step(p), p.stat().st_mtime), reverse=True)
    for path in candidates:
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        except Exception as error:  # noqa: BLE001 - any unreadable file is skipped, and said so
            log.warning("skipping unreadable checkpoint %s: %s", path, error)
            continue
        if isinstance(checkpoint, dict) and "loops" in checkpoint and "state_dict" in checkpoint:
            return path
        log.warning("skipping %s: not a Lightning training checkpoint", path)
    return None


class MetricsCSV(Callback):
    """`metrics.csv`: a row per training step (its `StepOutput.metrics`) and per validation, with
    `step` the global step after it (validation before training is step 0, the first update step 1).

    Each row is appended and fsynced when it is made, before any checkpoint covers it; the row count is
    part of the checkpoint, and restoring it cuts the file back to that count."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rows: list[dict[str, Any]] = []
        self._fields: list[str] = []

    def state_dict(self) -> dict[str, Any]:
        return {"rows": len(self.rows)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        kept = state_dict.get("rows", 0)
        on_disk = self._read()
        if len(on_disk) < kept:
            log.warning("%s has %d rows, the checkpoint expected %d", self.path, len(on_disk), kept)
        self.rows = on_disk[:kept]
        self._rewrite()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = StepOutput.of(outputs)
        if trainer.is_global_zero and step is not None:
            self._append({"step": trainer.global_step, **step.metrics})

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        scores = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        if scores:
            self._append({"step": trainer.global_step, **scores})

    def _read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open(newline="") as file:
            return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(file)]

    def _append(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if not self._fields or not set(row) <= set(self._fields) or not self.path.exists():
            self._rewrite()  # a new column (or a fresh file): the header changes, the file is rewritten
            return
        with self.path.open("a", newline="") as file:
            csv.DictWriter(file, fieldnames=self._fields).writerow(row)
            file.flush()
            os.fsync(file.fileno())

    def _rewrite(self) -> None:
        fields = ["step", *sorted({key for row in self.rows for key in row} - {"step"})]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        with temporary.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=fields)
            writer.writeheader()
            writer.writerows(self.rows)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.path)
        self._fields = fields


class ResumableRun(Callback):
    """Stop signals and validations that survive a resume.

    SIGTERM / SIGINT (installed for the trainer's run, restored after): the run stops at its next safe
    point (`memr1.interrupt`: a decoding step, a micro-batch before the step's first optimiser step,
    the end of a step), saves `checkpoints/interrupted-step=N.ckpt` and raises `StopRequested`, which
    `train.py` turns into exit status 128 + signal. A second SIGINT stops at once.

    A checkpoint saved while a validation is due but not finished records the validation as begun and
    not done, so that Lightning's resume runs it again in full instead of skipping it.
    """

    def __init__(self, checkpoint_dir: str | Path) -> None:
        self.checkpoint_dir = Path(checkpoint_dir)
        self._previous: dict[int, Any] = {}
        self._validation_due = False
        self._val_batches_before = 0
        self._stopped_at_step_end = False
        self._rewind_to_step_end = False

    # -- signals ------------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        interrupt.clear()
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if interrupt.requested() is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if interrupt.requested() is None:
            log.warning(
                "received %s: stopping at the next safe point, then saving a checkpoint (Ctrl-C again to stop now)",
                signal.Signals(signum).name,
            )
        interrupt.request_stop(signum)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        loop = trainer.fit_loop.epoch_loop
        self._validation_due = bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher))
        self._val_batches_before = loop.val_loop.batch_progress.total.completed
        self._stopped_at_step_end = interrupt.requested() is not None
        interrupt.raise_if_requested()  # the step is complete: a clean boundary

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._validation_due = False

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # Lightning raises its own SIGTERMException at the end of a step where SIGTERM arrived after
        # this callback's check: the same stop, at the same kind of boundary.
        if not isinstance(exception, (interrupt.StopRequested, SIGTERMException)) or trainer.state.fn != TrainerFn.FITTING:
            return
        if trainer.global_step == 0:
            log.warning("stopped before the first step completed: there is nothing to resume")
            return
        path = self.checkpoint_dir / f"interrupted-step={trainer.global_step}.ckpt"
        self._rewind_to_step_end = not self._stopped_at_step_end
        try:
            trainer.save_checkpoint(path)
        finally:
            self._rewind_to_step_end = False
        log.warning("saved %s after %d completed steps", path, trainer.global_step)

    # -- validations that a resume must not skip ----------------------------------------------------
    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            return
        loops = checkpoint["loops"]["fit_loop"]
        if self._rewind_to_step_end:
            # Stopped inside a step (its partial work is dropped), inside a validation, or after it
            # (Lightning's own SIGTERM exit): record the loops as ModelCheckpoint finds them at the end
            # of the last completed step, the one state Lightning resumes from exactly.
            for part in ("total", "current"):
                done = loops["epoch_loop.batch_progress"][part]["completed"]
                loops["epoch_loop.batch_progress"][part].update(ready=done, started=done, processed=done, completed=done - 1)
            loops["epoch_loop.state_dict"]["_batches_that_stepped"] = trainer.global_step - 1
        if not self._validation_due:
            return
        # Lightning resumes a validation it finds begun and unfinished ("restarted mid-evaluation") and
        # skips one it finds not begun. Record it as one batch begun, none done: the resumed run then
        # runs every validation batch again, with fresh metric state.
        before = self._val_batches_before
        loops["epoch_loop.val_loop.batch_progress"] = {
            "total": {"ready": before + 1, "started": before + 1, "processed": before, "completed": before},
            "current": {"ready": 1, "started": 1, "processed": 0, "completed": 0},
            "is_last_batch": False,
        }
