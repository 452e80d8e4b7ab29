"""`samples.jsonl`: a few sampled responses with their rewards every N steps, for reading what RL does."""

from __future__ import annotations

import json
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer

from memr1.modules.outputs import StepOutput


class SampleLog(Callback):
    """Appends `num_samples` (response, reward, format error) rows of the last rollout every `every_n_steps`."""

    def __init__(self, dirpath: str | Path, every_n_steps: int = 10, num_samples: int = 4) -> None:
        self.path = Path(dirpath) / "samples.jsonl"
        self.every_n_steps = every_n_steps
        self.num_samples = num_samples
        self.lines = 0
        self._mode = "w"  # a new run starts the file afresh; a restored one appends to what it kept

    def state_dict(self) -> dict:
        return {"lines": self.lines}

    def load_state_dict(self, state_dict: dict) -> None:
        # A resumed run redoes the steps after its checkpoint: rank 0 cuts the rows it will write
        # again when training starts (every rank restores this state).
        self.lines = state_dict.get("lines", 0)
        self._mode = "a"

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._mode == "a" and trainer.is_global_zero and self.path.exists():
            kept = self.path.read_text().splitlines(keepends=True)[: self.lines]
            self.path.write_text("".join(kept))

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if not trainer.is_global_zero or (step - 1) % self.every_n_steps:
            return
        output = StepOutput.of(outputs)
        if output is None or output.rollout is None:  # SFT samples nothing: its targets are on file
            return
        rollout, rewards = output.rollout, output.rewards
        tokenizer = pl_module.tokenizer
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open(self._mode) as out:
            self._mode = "a"
            for row in range(min(self.num_samples, len(rewards))):
                ids = rollout.responses[row][rollout.response_mask[row].bool()].tolist()
                out.write(json.dumps({
                    "step": step,
                    "response": tokenizer.decode(ids, skip_special_tokens=True),
                    "reward": rewards[row].score,
                    "format_error": rewards[row].format_error,
                    "info": rewards[row].info,
                }) + "\n")
                self.lines += 1
