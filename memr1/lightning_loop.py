"""Every contact memr1 has with Lightning's fit-loop internals, in one place.

One global step per rollout batch: Lightning counts a global step at every `LightningOptimizer.step`,
and memr1's modules step through it once per batch (`RLModule.step_actor`, the SFT step), so the
trainer's global step is the batch step the data order is keyed by (`batch_step`), and a module that
stepped otherwise is stopped at the end of that batch (`check_one_step`).

A resume that loses nothing needs three things Lightning does not expose: whether a validation is due
at the end of the current step (`validation_due`), how many validation batches have run
(`validation_batches_done`), and two edits of the loop state a checkpoint records
(`rewind_to_step_end`, `mark_validation_begun`). They read private attributes and write checkpoint keys
whose shape belongs to Lightning, so they are written for one Lightning minor version (`WRITTEN_FOR`,
checked by `check_version` when a run starts) and tests/test_lightning_loop.py checks every key they
read and write against the installed Lightning.
"""

from __future__ import annotations

from typing import Any

import lightning
from lightning.pytorch import Trainer

WRITTEN_FOR = "2.6"  # pyproject pins lightning>=2.6,<2.7
PROGRESS_FIELDS = ("ready", "started", "processed", "completed")


def check_version(version: str = lightning.__version__) -> None:
    """Refuse a Lightning other than the one these loop edits were written for."""
    if version.split(".")[:2] != WRITTEN_FOR.split("."):
        raise RuntimeError(
            f"lightning {version}: memr1's resume logic (memr1/lightning_loop.py) was written for "
            f"{WRITTEN_FOR}.x, whose loop state it reads and edits; install lightning>={WRITTEN_FOR},<2.7"
        )


def validation_due(trainer: Trainer) -> bool:
    """Whether the fit loop will validate at the end of the step that just ended."""
    epoch_loop = trainer.fit_loop.epoch_loop
    return bool(epoch_loop._should_check_val_fx(trainer.fit_loop._data_fetcher))


def validation_batches_done(trainer: Trainer) -> int:
    """Validation batches completed so far in the run (all validations)."""
    return trainer.fit_loop.epoch_loop.val_loop.batch_progress.total.completed


def batch_step(trainer: Trainer) -> int:
    """The rollout batch training stands at (the next batch's step in the training order)."""
    return trainer.global_step


def check_one_step(step_before: int, step_after: int) -> None:
    """Refuse a training batch that did not advance the global step by exactly one."""
    if step_after != step_before + 1:
        raise RuntimeError(
            f"a training batch took the global step from {step_before} to {step_after}: memr1's modules take one "
            "Lightning optimiser step per batch (the data order and resume are keyed by it; lightning_loop.py)"
        )


def fit_loop_state(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The fit loop's part of a checkpoint being saved."""
    return checkpoint["loops"]["fit_loop"]


def rewind_to_step_end(checkpoint: dict[str, Any], global_step: int) -> None:
    """Record the loops as ModelCheckpoint finds them at the end of the last completed step, the one
    state Lightning resumes from exactly (the stopped step's partial work is dropped)."""
    loops = fit_loop_state(checkpoint)
    for part in ("total", "current"):
        done = loops["epoch_loop.batch_progress"][part]["completed"]
        loops["epoch_loop.batch_progress"][part].update(ready=done, started=done, processed=done, completed=done - 1)
    loops["epoch_loop.state_dict"]["_batches_that_stepped"] = global_step - 1


def mark_validation_begun(checkpoint: dict[str, Any], batches_done_before: int) -> None:
    """Record a validation as one batch begun, none done: Lightning resumes a validation it finds begun
    and unfinished ("restarted mid-evaluation") and skips one it finds not begun, so the resumed run
    runs every batch of it again, with fresh metric state."""
    before = batches_done_before
    fit_loop_state(checkpoint)["epoch_loop.val_loop.batch_progress"] = {
        "total": {"ready": before + 1, "started": before + 1, "processed": before, "completed": before},
        "current": {"ready": 1, "started": 1, "processed": 0, "completed": 0},
        "is_last_batch": False,
    }
