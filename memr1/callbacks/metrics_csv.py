"""`metrics.csv`, which a resumed run continues: every row is on disk before the checkpoint that covers
it, and the checkpoint records how many rows that is, so a resume cuts the file there and the steps it
redoes are logged once."""

from __future__ import annotations

import csv
import logging
import os
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from memr1.modules.outputs import StepOutput

log = logging.getLogger(__name__)


class MetricsCSV(Callback):
    """`metrics.csv`: a row per training step (its `StepOutput.metrics`) and per validation, with
    `step` the global step after it (validation before training is step 0, the first update step 1).

    Each row is appended and fsynced when it is made, before any checkpoint covers it; the row count is
    part of the checkpoint, and restoring it cuts the file back to that count."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rows: list[dict[str, Any]] = []
        self._fields: list[str] = []
        self._restored_rows: int | None = None  # the row count of the checkpoint a run resumes from

    def state_dict(self) -> dict[str, Any]:
        return {"rows": len(self.rows)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Every rank restores callback state; only rank 0 writes the file (on_train_start: under FSDP
        # Lightning restores callbacks after on_fit_start).
        self._restored_rows = state_dict.get("rows", 0)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._restored_rows is None or not trainer.is_global_zero:
            return
        on_disk = self._read()
        if len(on_disk) < self._restored_rows:
            log.warning("%s has %d rows, the checkpoint expected %d", self.path, len(on_disk), self._restored_rows)
        self.rows = on_disk[: self._restored_rows]
        self._restored_rows = None
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
