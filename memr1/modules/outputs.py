"""What a training step hands its callbacks, declared.

`training_step` returns `StepOutput(...).as_outputs()`; Lightning passes that mapping to every
callback's `on_train_batch_end` as `outputs`, where `StepOutput.of(outputs)` reads it back. The module
keeps the last one as `last_step` (tests and diagnostics read it there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memr1.envs.base import Reward
from memr1.rl.batch import RolloutBatch

OUTPUT_KEY = "step"  # in manual optimisation Lightning passes a returned mapping on, copied, values untouched


@dataclass(frozen=True)
class StepOutput:
    """One training step's results.

    metrics: the step's logged scalars by name: its row of metrics.csv and its console line.
    rollout, rewards: the sampled batch and its rewards (RL steps; SFT samples nothing, its targets are on file).
    """

    metrics: Mapping[str, float]
    rollout: RolloutBatch | None = None
    rewards: Sequence[Reward] = ()

    def as_outputs(self) -> dict[str, StepOutput]:
        return {OUTPUT_KEY: self}

    @staticmethod
    def of(outputs: Any) -> StepOutput | None:
        """The step's output among `on_train_batch_end`'s `outputs` (None when the step returned none)."""
        step = outputs.get(OUTPUT_KEY) if isinstance(outputs, Mapping) else None
        return step if isinstance(step, StepOutput) else None
