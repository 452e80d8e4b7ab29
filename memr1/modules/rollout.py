"""The rollout side of an RL step: sample each state's group, score it, shape overlong responses, keep
the groups whose rewards differ (DAPO's dynamic sampling) and pack the rows into a `RolloutBatch`.

`RLModule` owns one `Rollouts` and hands it, per call, what only the module knows: the step, the trunk
depth its engine records, how to agree with the other ranks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from memr1.envs.base import Environment, Reward
from memr1.llm.engines import Generation, GenerationEngine
from memr1.llm.sampling import SamplingConfig
from memr1.rl import core
from memr1.rl.algorithms import AlgoConfig
from memr1.rl.batch import RolloutBatch, pack_rollouts
from memr1.seeds import stream_seed

Row = tuple[Generation, Reward]


@runtime_checkable
class ExtraStates(Protocol):
    """A data module that can draw more training states for a step (dynamic sampling): draw `draw`
    (1, 2, ...) of step `step`, this rank's share, the same in a resumed run."""

    def extra_states(self, step: int, draw: int) -> list[Any]: ...


class StageSeconds(dict[str, float]):
    """Seconds spent per stage of the current step (rollout, reward, update, ...)."""

    @contextlib.contextmanager
    def timing(self, stage: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self[stage] = self.get(stage, 0.0) + time.perf_counter() - started


class Rollouts:
    """engine: the sampler (the policy itself or vLLM); env: scores each response (never raising on
    malformed output); algo: the group size, temperature, top-p, overlong shaping and dynamic sampling
    settings; max_new_tokens: the agent's decoding cap; seed: the run's; seconds: where the rollout
    and reward times of the step are added."""

    def __init__(
        self,
        engine: GenerationEngine,
        env: Environment,
        tokenizer: Any,
        algo: AlgoConfig,
        max_new_tokens: int,
        seed: int,
        seconds: StageSeconds,
    ) -> None:
        self.engine, self.env, self.tokenizer, self.algo = engine, env, tokenizer, algo
        self.algorithm = algo.algorithm
        self.max_new_tokens, self.seed, self.seconds = max_new_tokens, seed, seconds
        self.filter_stats: dict[str, float] = {}  # the last dynamic sampling's counts (filter/...)

    @property
    def group(self) -> int:
        """Rows per state: consecutive rows of a rollout batch share a prompt."""
        return self.algorithm.samples_per_state(self.algo)

    def sampling(self, step: int, draw: int = 0) -> SamplingConfig:
        """`draw`: dynamic sampling's extra rollout batches of the step (0: the step's own)."""
        return SamplingConfig(
            max_new_tokens=self.max_new_tokens,
            temperature=self.algo.temperature,
            top_p=self.algo.top_p,
            n=self.group,
            # A stream per step (and draw): a resumed run samples exactly what the unbroken run sampled.
            seed=stream_seed(self.seed, "rollout", step, draw),
        )

    def sample(self, states: Sequence[Any], step: int, draw: int = 0, trunk_depth: int = 0) -> list[Row]:
        """Each state's `group` samples, in state order, each with its reward (overlong shaping
        included, `algo.overlong_buffer`). `trunk_depth`: the frozen-trunk states the engine records."""
        with self.seconds.timing("rollout"), torch.no_grad():
            outputs = self.engine.generate([self.env.prompt(state) for state in states], self.sampling(step, draw), trunk_depth=trunk_depth)
        rows = [(state, sample) for state, samples in zip(states, outputs) for sample in samples]
        with self.seconds.timing("reward"):
            rewards = self.env.score([state for state, _ in rows], [sample.text for _, sample in rows])
        overlong = self.algo.overlong_buffer
        if self.algorithm.trains_on_rollouts and overlong.enable:
            lengths = torch.tensor([len(sample.response_ids) for _, sample in rows])
            penalties = core.overlong_penalty(lengths, self.max_new_tokens, min(overlong.len, self.max_new_tokens), overlong.penalty_factor)
            rewards = [
                reward.with_term("overlong", float(penalty), 1.0)
                for reward, penalty in zip(rewards, penalties.tolist())
            ]
        return [(sample, reward) for (_, sample), reward in zip(rows, rewards)]

    def keep_groups_with_spread(
        self, rows: list[Row], wanted: int, source: Any, step: int, min_over_ranks: Callable[[int], int], trunk_depth: int = 0
    ) -> list[Row]:
        """DAPO's dynamic sampling: keep the groups whose rewards differ, drawing more states (from
        `source.extra_states`) until `wanted` groups are kept or `max_num_gen_batches` batches were
        drawn. Every rank draws as many batches and keeps as many groups (`min_over_ranks`), so that
        they step together and a sharded policy decodes in lockstep; a step that kept none trains on
        its first batch as plain GRPO would (no policy gradient)."""
        if not isinstance(source, ExtraStates):
            raise ValueError("algo.filter_groups.enable: the data module cannot draw extra states (it has no extra_states)")
        cap = self.algo.filter_groups.max_num_gen_batches
        drawn_groups, kept, draw = 0, [], 0
        started = time.perf_counter()
        batch = rows
        while True:
            groups = [batch[start : start + self.group] for start in range(0, len(batch), self.group)]
            drawn_groups += len(groups)
            kept += [g for g in groups if len({reward.score for _, reward in g}) > 1]
            draw += 1
            kept_everywhere = min_over_ranks(min(len(kept), wanted))
            if kept_everywhere >= wanted or (cap and draw >= cap):
                break
            batch = self.sample(source.extra_states(step, draw), step, draw, trunk_depth)
        self.filter_stats = {
            "filter/groups_drawn": float(drawn_groups),
            "filter/groups_kept": float(kept_everywhere),
            "filter/gen_batches": float(draw),
            "time/extra_rollout_s": time.perf_counter() - started,
        }
        if kept_everywhere == 0:
            return rows
        return [row for g in kept[:kept_everywhere] for row in g]

    def pack(self, rows: Sequence[Row], device: torch.device, with_logprobs: bool, with_trunk: bool) -> RolloutBatch:
        """The rows as one batch on `device`; the sampler's log-probs and trunk states when asked."""
        return pack_rollouts(
            [sample.prompt_ids for sample, _ in rows],
            [sample.response_ids for sample, _ in rows],
            [reward.score for _, reward in rows],
            self.tokenizer.pad_token_id,
            logprobs=[sample.logprobs for sample, _ in rows] if with_logprobs else None,
            trunk_hidden=[sample.trunk_hidden for sample, _ in rows] if with_trunk else None,
        ).to(device)
