"""`training_curves.png`: reward and validation scores by step, redrawn at every validation and at the end;
`curves.json` (the numbers) is rewritten every step, so a killed run keeps its curves."""

from __future__ import annotations

import json
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer

TRAIN_KEYS = ("reward/mean",)
VAL_KEYS = ("val/f1", "val/bleu1", "val/em", "val/reward", "val/sampled_reward")


class TrainingCurves(Callback):
    """Keeps the reward per step and validation scores per check in `curves.json` and plots them."""

    def __init__(self, dirpath: str | Path) -> None:
        self.dirpath = Path(dirpath)
        self.train: dict[str, list[tuple[int, float]]] = {}
        self.val: dict[str, list[tuple[int, float]]] = {}

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        for key in TRAIN_KEYS:
            if key in trainer.callback_metrics:
                self.train.setdefault(key, []).append((trainer.global_step, float(trainer.callback_metrics[key])))
        self.write_json()  # every step, so a killed run's curves.json is complete up to its last step

    def write_json(self) -> None:
        self.dirpath.mkdir(parents=True, exist_ok=True)
        (self.dirpath / "curves.json").write_text(json.dumps({"train": self.train, "val": self.val}, indent=1))

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        for key in VAL_KEYS:
            if key in trainer.callback_metrics:
                self.val.setdefault(key, []).append((trainer.global_step, float(trainer.callback_metrics[key])))
        self.draw()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.draw()

    def draw(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self.write_json()
        panels = [("train reward", self.train), ("validation", self.val)]
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

    def state_dict(self) -> dict:
        return {"train": self.train, "val": self.val}

    def load_state_dict(self, state_dict: dict) -> None:
        self.train = {k: [tuple(p) for p in v] for k, v in state_dict.get("train", {}).items()}
        self.val = {k: [tuple(p) for p in v] for k, v in state_dict.get("val", {}).items()}
