"""`training_curves.png`: reward and validation scores by step, redrawn at every validation and at the end;
`curves.json` (the numbers) is rewritten every step, so a killed run keeps its curves. Both are derived
from the rows of `metrics.csv` (`MetricsCSV`), the run's one record of its metrics and of how far a
resume rewinds them."""

from __future__ import annotations

import json
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer

from memr1.callbacks.metrics_csv import MetricsCSV

TRAIN_KEYS = ("reward/mean",)
VAL_KEYS = ("val/f1", "val/bleu1", "val/em", "val/reward", "val/sampled_reward")

Series = dict[str, list[tuple[int, float]]]


class TrainingCurves(Callback):
    """`curves.json` and `training_curves.png` in `dirpath`, from `metrics`' rows (it must come before
    this callback in the trainer's list, so that a step's row is there when its curves are written)."""

    def __init__(self, dirpath: str | Path, metrics: MetricsCSV) -> None:
        self.dirpath = Path(dirpath)
        self.metrics = metrics

    def series(self, keys: tuple[str, ...]) -> Series:
        """(step, value) of each of `keys` over the rows that have it, in row order; keys with none left out."""
        found: Series = {}
        for row in self.metrics.rows:
            for key in keys:
                if row.get(key) not in (None, ""):
                    found.setdefault(key, []).append((int(row["step"]), float(row[key])))
        return found

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        if trainer.is_global_zero:
            self.write_json()  # every step, so a killed run's curves.json is complete up to its last step

    def write_json(self) -> None:
        self.dirpath.mkdir(parents=True, exist_ok=True)
        curves = {"train": self.series(TRAIN_KEYS), "val": self.series(VAL_KEYS)}
        (self.dirpath / "curves.json").write_text(json.dumps(curves, indent=1))

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking and trainer.is_global_zero:
            self.draw()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero:
            self.draw()

    def draw(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self.write_json()
        panels = [("train reward", self.series(TRAIN_KEYS)), ("validation", self.series(VAL_KEYS))]
        figure, axes = plt.subplots(1, 2, figsize=(11, 4))
        for axis, (title, series) in zip(axes, panels):
            for key, points in series.items():
                if points:
                    steps, values = zip(*points)
                    axis.plot(steps, values, marker="o" if len(points) < 30 else None, label=key)
            axis.set_title(title)
            axis.set_xlabel("step")
            if series:
                axis.legend()
        figure.tight_layout()
        figure.savefig(self.dirpath / "training_curves.png", dpi=120)
        plt.close(figure)
