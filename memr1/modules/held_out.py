"""Rewards on fixed or held-out states, so that a run that learns nothing shows it within its first
steps: the probe reward (the same training states, one fixed seed, every N steps) and the sampled
validation reward (each validation state sampled once as rollouts are). `RLModule` owns one and
hands it what it needs per call: the sampling of its rollouts and the step."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from memr1.envs.base import Environment
from memr1.faults import fault_point
from memr1.llm.engines import GenerationEngine
from memr1.llm.sampling import SamplingConfig
from memr1.seeds import stream_seed


class HeldOutRewards:
    """engine, env: the policy's sampler and the environment that scores it. seed: the run's seed.
    probe_every_n_steps: probe at step 1 and every N steps (0: never). val_sampled_reward: sample each
    validation state once for `val/sampled_reward`. `probe`: the probe states (set when training starts)."""

    def __init__(self, engine: GenerationEngine, env: Environment, seed: int, probe_every_n_steps: int, val_sampled_reward: bool) -> None:
        self.engine, self.env, self.seed = engine, env, seed
        self.probe_every_n_steps = probe_every_n_steps
        self.val_sampled_reward = val_sampled_reward
        self.probe: list[Any] = []
        self._val_sampled: list[float] = []

    @torch.no_grad()
    def probe_reward(self, sampling: SamplingConfig) -> float:
        """Mean reward of the probe states, sampled as rollouts are (`sampling`) but with one fixed seed,
        so that two probes differ by what the policy learned, not by which questions or samples were drawn."""
        sampling = replace(sampling, seed=stream_seed(self.seed, "probe"))
        outputs = self.engine.generate([self.env.prompt(state) for state in self.probe], sampling)
        rows = [(state, sample.text) for state, samples in zip(self.probe, outputs) for sample in samples]
        rewards = self.env.score([state for state, _ in rows], [text for _, text in rows])
        return sum(reward.score for reward in rewards) / len(rewards)

    @torch.no_grad()
    def sample_validation_rewards(self, states: Sequence[Any], sampling: SamplingConfig, global_step: int) -> None:
        """One sample per state at the rollout temperature (seeded per step and batch), scored by the
        environment, kept for `val/sampled_reward`; nothing when the option is off."""
        if not self.val_sampled_reward:
            return
        seed = stream_seed(self.seed, "validation_sample", global_step, len(self._val_sampled))
        outputs = self.engine.generate([self.env.prompt(state) for state in states], replace(sampling, n=1, seed=seed))
        rewards = self.env.score(list(states), [samples[0].text for samples in outputs])
        self._val_sampled.extend(reward.score for reward in rewards)

    def take_sampled_validation_reward(self) -> float | None:
        """The mean sampled validation reward of the validation that ended (None if none was sampled)."""
        sampled, self._val_sampled = self._val_sampled, []
        return sum(sampled) / len(sampled) if sampled else None

    def probe_metrics(self, sampling: SamplingConfig, global_step: int) -> dict[str, float]:
        """`train/probe_reward` and its seconds at step 1 and every `probe_every_n_steps`, else nothing."""
        if not self.probe or not self.probe_every_n_steps or (global_step % self.probe_every_n_steps and global_step != 1):
            return {}
        fault_point("probe")
        started = time.perf_counter()
        reward = self.probe_reward(sampling)
        return {"train/probe_reward": reward, "time/probe_s": time.perf_counter() - started}
