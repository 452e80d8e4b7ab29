"""The Lightning loop state memr1's resume reads and edits (memr1/lightning_loop.py), checked
against the installed Lightning on a real two-step fit of a one-parameter module: a change of shape
in Lightning fails here, in seconds, before the slow fault tests would notice."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import DataLoader

from memr1 import lightning_loop


class OneWeight(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return ((self.weight - batch) ** 2).mean()

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val/loss", ((self.weight - batch) ** 2).mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Watch(Callback):
    """What the loop helpers read at each step's end, and the checkpoint Lightning saves after step 2."""

    def __init__(self) -> None:
        self.due: list[bool] = []
        self.done: list[int] = []
        self.checkpoint: dict | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.due.append(lightning_loop.validation_due(trainer))
        self.done.append(lightning_loop.validation_batches_done(trainer))

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.checkpoint = checkpoint


def test_the_loop_state_has_the_shape_the_resume_edits(tmp_path):
    lightning_loop.check_version()  # the installed Lightning is the one the edits were written for
    watch = Watch()
    data = DataLoader(torch.arange(4.0)[:, None], batch_size=1)
    trainer = Trainer(accelerator="cpu", max_steps=2, val_check_interval=2, limit_val_batches=3, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path, callbacks=[watch])
    trainer.fit(OneWeight(), train_dataloaders=data, val_dataloaders=data)
    # Validation every 2 steps: due after step 2, not after step 1; none had run at either step's end.
    assert (watch.due, watch.done) == ([False, True], [0, 0])
    assert lightning_loop.validation_batches_done(trainer) == 3

    checkpoint = watch.checkpoint
    loops = lightning_loop.fit_loop_state(checkpoint)
    for part in ("total", "current"):
        assert set(loops["epoch_loop.batch_progress"][part]) >= set(lightning_loop.PROGRESS_FIELDS)
    # Saved by ModelCheckpoint in step 2's validation: the batch is completed, and Lightning counts it
    # as stepped only after the validation (the ordering rewind_to_step_end writes back).
    assert loops["epoch_loop.batch_progress"]["total"]["completed"] == 2
    assert loops["epoch_loop.state_dict"]["_batches_that_stepped"] == trainer.global_step - 1 == 1
    assert set(loops["epoch_loop.val_loop.batch_progress"]) >= {"total", "current", "is_last_batch"}

    lightning_loop.rewind_to_step_end(checkpoint, trainer.global_step)
    total = loops["epoch_loop.batch_progress"]["total"]
    assert [total[field] for field in lightning_loop.PROGRESS_FIELDS] == [2, 2, 2, 1]
    assert loops["epoch_loop.state_dict"]["_batches_that_stepped"] == 1
    lightning_loop.mark_validation_begun(checkpoint, 3)
    assert loops["epoch_loop.val_loop.batch_progress"]["total"] == {"ready": 4, "started": 4, "processed": 3, "completed": 3}
    # The edited state is one Lightning loads: the loops' own load_state_dict takes it.
    fresh = Trainer(accelerator="cpu", max_steps=4, logger=False, enable_progress_bar=False, enable_model_summary=False)
    fresh.fit_loop.load_state_dict(checkpoint["loops"]["fit_loop"])
    assert fresh.fit_loop.epoch_loop.batch_progress.total.completed == 1
    assert fresh.fit_loop.epoch_loop.val_loop.batch_progress.total.started == 4


def test_another_lightning_minor_is_refused():
    lightning_loop.check_version("2.6.9")
    with pytest.raises(RuntimeError, match="written for 2.6.x"):
        lightning_loop.check_version("2.7.0")


def test_a_batch_must_advance_the_global_step_by_exactly_one():
    lightning_loop.check_one_step(4, 5)
    for after in (4, 6):  # a step dropped, or a second optimiser step through Lightning
        with pytest.raises(RuntimeError, match=f"from 4 to {after}: memr1's modules take one"):
            lightning_loop.check_one_step(4, after)
