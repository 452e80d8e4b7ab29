"""The Memory Manager's RL module: logs the operation mix; validation is the greedy policy's reward."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from memr1.envs.base import Reward
from memr1.envs.manager import ManagerEnv, ManagerState
from memr1.envs.rewards import CREDIT_TERMS
from memr1.modules.base import RLModule
from memr1.types import OpKind


class ManagerRLModule(RLModule):
    env: ManagerEnv

    def on_validation_epoch_start(self) -> None:
        self._val_rewards: list[float] = []

    @torch.no_grad()
    def validation_step(self, states: list[ManagerState], batch_idx: int) -> None:
        outputs = self.engine.generate([self.env.prompt(state) for state in states], self.validation_sampling())
        rewards = self.env.score(states, [samples[0].text for samples in outputs])
        # The outcome reward whatever the credit, so that runs of either credit compare on one scale.
        self._val_rewards.extend(r.score_without(*CREDIT_TERMS) for r in rewards)
        self.sample_validation_rewards(states)

    def on_validation_epoch_end(self) -> None:
        if self._val_rewards:
            self.log("val/reward", sum(self._val_rewards) / len(self._val_rewards), prog_bar=True)
        self.log_sampled_validation_reward()

    def extra_metrics(self, rewards: Sequence[Reward]) -> dict[str, float]:
        ops = Counter(str(r.info.get("op", OpKind.NOOP.value)) for r in rewards)
        metrics = {f"ops/{kind.value.lower()}_frac": ops[kind.value] / len(rewards) for kind in OpKind}
        noop = [r.terms["noop"] for r in rewards if "noop" in r.terms]
        if noop:  # counterfactual credit: the score of doing nothing, which the reward is measured against
            metrics["reward/noop_mean"] = sum(noop) / len(noop)
        return metrics
