"""A stop signal that checkpoints, and no validation skipped by a resume.

SIGTERM / SIGINT stop a run at its next safe point with a checkpoint; a checkpoint taken before a due
validation has run (or while it runs) makes the resumed run run that validation in full, where
Lightning would otherwise skip it. What this needs of Lightning's loop internals is in
`memr1.lightning_loop`, the one module that touches them.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from types import FrameType
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from memr1 import interrupt
from memr1 import lightning_loop

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


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
        lightning_loop.check_version()
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
        self._validation_due = lightning_loop.validation_due(trainer)
        self._val_batches_before = lightning_loop.validation_batches_done(trainer)
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
        if self._rewind_to_step_end:
            # Stopped inside a step, inside a validation, or after it (Lightning's own SIGTERM exit).
            lightning_loop.rewind_to_step_end(checkpoint, trainer.global_step)
        if self._validation_due:
            lightning_loop.mark_validation_begun(checkpoint, self._val_batches_before)
