"""`samples.jsonl`: a few sampled responses with their rewards every N steps, for reading what RL does."""

from __future__ import annotations

import json
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer


class SampleLog(Callback):
    """Appends `num_samples` (response, reward, format error) rows of the last rollout every `every_n_steps`."""

    def __init__(self, dirpath: str | Path, every_n_steps: int = 10, num_samples: int = 4) -> None:
        self.path = Path(dirpath) / "samples.jsonl"
        self.every_n_steps = every_n_steps
        self.num_samples = num_samples

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if not trainer.is_global_zero or (step - 1) % self.every_n_steps:
            return
        rollout, rewards = pl_module.last_rollout
        tokenizer = pl_module.tokenizer
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as out:
            for row in range(min(self.num_samples, len(rewards))):
                ids = rollout.responses[row][rollout.response_mask[row].bool()].tolist()
                out.write(json.dumps({
                    "step": step,
                    "response": tokenizer.decode(ids, skip_special_tokens=True),
                    "reward": rewards[row].score,
                    "format_error": rewards[row].format_error,
                    "info": rewards[row].info,
                }) + "\n")
