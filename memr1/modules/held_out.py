"""Rewards on fixed or held-out states, so that a run that learns nothing shows it within its first
steps: the probe reward (the same training states, one fixed seed, every N steps) and the sampled
validation reward (each validation state sampled once as rollouts are). Mixed into `RLModule`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from memr1.seeds import stream_seed


class HeldOutRewards:
    """Needs the host module's `policy`, `engine`, `env`, `seed`, `probe`, `probe_every_n_steps`,
    `val_sampled_reward`, `_val_sampled`, `rollout_sampling()` and Lightning's `global_step` / `log`."""

    @torch.no_grad()
    def probe_reward(self) -> float:
        """Mean reward of the probe states, sampled as rollouts are but with one fixed seed, so that
        two probes differ by what the policy learned, not by which questions or samples were drawn."""
        sampling = replace(self.rollout_sampling(), seed=stream_seed(self.seed, "probe"))
        was_training = self.policy.training
        self.policy.eval()
        outputs = self.engine.generate([self.env.prompt(state) for state in self.probe], sampling)
        self.policy.train(was_training)
        rows = [(state, sample.text) for state, samples in zip(self.probe, outputs) for sample in samples]
        rewards = self.env.score([state for state, _ in rows], [text for _, text in rows])
        return sum(reward.score for reward in rewards) / len(rewards)

    @torch.no_grad()
    def sample_validation_rewards(self, states: Sequence[Any]) -> None:
        """One sample per state at the rollout temperature (seeded per step and batch), scored by the
        environment, kept for `val/sampled_reward`; nothing when the option is off."""
        if not self.val_sampled_reward:
            return
        sampling = replace(self.rollout_sampling(), n=1, seed=stream_seed(self.seed, "validation_sample", self.global_step, len(self._val_sampled)))
        outputs = self.engine.generate([self.env.prompt(state) for state in states], sampling)
        rewards = self.env.score(list(states), [samples[0].text for samples in outputs])
        self._val_sampled.extend(reward.score for reward in rewards)

    def log_sampled_validation_reward(self) -> None:
        if self._val_sampled:
            self.log("val/sampled_reward", sum(self._val_sampled) / len(self._val_sampled))
        self._val_sampled = []

    def probe_metrics(self) -> dict[str, float]:
        """`train/probe_reward` and its seconds at step 1 and every `probe_every_n_steps`, else nothing."""
        if not self.probe or (self.global_step % self.probe_every_n_steps and self.global_step != 1):
            return {}
        started = time.perf_counter()
        reward = self.probe_reward()
        return {"train/probe_reward": reward, "time/probe_s": time.perf_counter() - started}
