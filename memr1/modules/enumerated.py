"""The Memory Manager trained by the exact policy gradient over its operations (`algo=enumerated`).

GRPO learns an operation only once it samples it, and the lift's Manager never sampled an UPDATE or a
DELETE (docs/cpu_lift.md). Here nothing is sampled. One step, per state of the batch:

1. its operations, as `teacher=search` enumerates them (`memr1.search_teacher.options`: NONE, ADD, and
   UPDATE-merge / UPDATE-replace / DELETE of each candidate), each written as the Manager's JSON reply;
2. each operation's reward: the search teacher's scores (the same frozen answerer, questions and reward
   as RL), searched once per state and cached with the targets (`TeacherTrajectories.details`). The
   answerer is greedy and frozen, so a cached score is the reward itself, not an estimate;
3. each reply's log-probability under the policy (teacher-forced, the state's prompt forwarded once),
   and under the reference for the KL and the operations' total probability;
4. `core.enumerated_objective`: the expected reward under the policy renormalised over the operations,
   less the KL, less what the operations' total probability lost below the reference's (in log); or,
   with `algo.operation_objective=projection`, `core.enumerated_projection`: the operations' likelihood
   weighed by the KL-regularised best policy q* (reference x exp(R / beta)); with `listwise`,
   `core.enumerated_listwise`: the cross-entropy from q* to the policy's choice among the operations,
   less what their total probability lost below the reference's (in log); its gradient, accumulated
   over the batch's states, is one clipped optimiser step. With `algo.change_margin` > 0 each reward is
   first lowered by that many times what the search's rule asks the operation to beat ADD by
   (`margins_over_add`): where every option answers alike, ADD is worth the most, as the teacher has it.

With `algo.taught_sampling_alpha` < 1 the training states are not drawn uniformly: each is labelled by
the kind of operation the search teaches there, and the rare kinds (13 DELETE among 1,070 states on
the dropped set) are drawn more often (`memr1.states.order.kind_balanced_weights`). Each state's own
objective is unchanged; the batch's mean weighs the states by how often they are drawn, so `reward/*`
describes the drawn states, not the uniform set (validation stays uniform).

A reply longer than the Manager's `max_new_tokens` is left out: the policy cannot say it. The step logs
the probability each kind of operation holds (`ops/*_frac`, GRPO's keys: what sampling would draw, in
expectation) and the states whose operations' rewards differ (`enum/states_with_spread`).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import numpy as np
import torch
from torch import nn

from memr1.envs.manager import ManagerState
from memr1.faults import fault_point
from memr1.interrupt import raise_if_requested
from memr1.llm.engines import encode_prompts
from memr1.modules.manager import ManagerRLModule
from memr1.modules.outputs import StepOutput
from memr1.rl import core
from memr1.rl.batch import RolloutBatch, pack_rollouts, response_logprobs
from memr1.search_teacher import OPERATIONS, Option, SearchManagerTeacher, label, margins_over_add, options
from memr1.states.order import IndexedStates, WeighableStates, kind_balanced_weights
from memr1.teachers import TeacherTrajectories

# The search's operations under the names GRPO's operation mix logs (`ManagerRLModule.extra_metrics`).
OP_KIND = {"NONE": "noop", "ADD": "add", "MERGE": "update", "REPLACE": "update", "DELETE": "delete"}

log = logging.getLogger(__name__)


class ManagerEnumeratedModule(ManagerRLModule):
    """trajectories: the search teacher's cache, whose rows hold every operation's score."""

    def __init__(self, *args: Any, trajectories: TeacherTrajectories, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(trajectories.teacher, SearchManagerTeacher):
            raise ValueError("algo=enumerated: the operations' rewards come from teacher=search")
        self.trajectories = trajectories
        self.search: SearchManagerTeacher = trajectories.teacher

    def setup(self, stage: str) -> None:
        """Before fitting, with `algo.taught_sampling_alpha` < 1: the data module draws its training
        states by `taught_kind_weights`."""
        if stage != "fit" or self.algo.taught_sampling_alpha == 1.0:
            return
        data = self.trainer.datamodule if self.trainer is not None else None
        if not isinstance(data, WeighableStates):
            raise ValueError(
                f"algo.taught_sampling_alpha={self.algo.taught_sampling_alpha}: the data module "
                f"({type(data).__name__}) cannot draw its training states by weight (it has no weigh_training_states)"
            )
        data.weigh_training_states(self.taught_kind_weights)

    def taught_kind_weights(self, states: IndexedStates) -> np.ndarray:
        """Each training state's draw probability `(len(states),)`: `kind_balanced_weights` of the kind
        of operation the search teaches there (ADD, UPDATE, DELETE, NONE), at `algo.taught_sampling_alpha`.
        A state the cache lacks is searched here, once, as training would search it."""
        loaded: list[ManagerState] = [states[index] for index in range(len(states))]
        taught = self.trajectories.details(loaded, [self.env.prompt(state) for state in loaded])
        kinds = [OP_KIND[details["operation"]] for details in taught]
        weights = kind_balanced_weights(kinds, self.algo.taught_sampling_alpha)
        shares: Counter[str] = Counter()
        for kind, weight in zip(kinds, weights):
            shares[kind] += float(weight)
        log.info(
            "training states drawn by the search's taught kind (alpha %s): %s",
            self.algo.taught_sampling_alpha,
            ", ".join(f"{kind} {count} states, {shares[kind]:.1%} of draws" for kind, count in Counter(kinds).most_common()),
        )
        return weights

    def training_step(self, states: list[ManagerState], batch_idx: int) -> dict[str, StepOutput]:
        self.stage_seconds.clear()
        prompts = [self.env.prompt(state) for state in states]
        with self.stage_seconds.timing("reward"):
            searched = self.trajectories.details(states, prompts)
        optimizer = self._optimizers()[0]
        mass: Counter[str] = Counter()
        stats: Counter[str] = Counter()
        with self.stage_seconds.timing("update"), self.compute_precision():
            for state, prompt_ids, details in zip(states, encode_prompts(self.tokenizer, prompts), searched):
                raise_if_requested()  # before the optimizer step nothing has changed: a stop loses nothing
                state_scores = details["scores"]
                found, batch = self._operations(state, prompt_ids, state_scores)
                stats["too_long"] += len(options(state)) - len(found)
                if not found:
                    continue
                scored = batch.scores.float()
                rewards = scored - self.algo.change_margin * scored.new_tensor(
                    margins_over_add(found, details["margin"], self.search.drop_factor)
                )
                reference = None
                if self.algorithm.uses_reference(self.algo):
                    with torch.no_grad(), self._reference() as frozen:
                        reference = self._sequence_logprobs(frozen, batch)
                logprobs = self._sequence_logprobs(self.policy, batch)
                if self.algo.operation_objective == "projection":
                    assert reference is not None
                    result = core.enumerated_projection(
                        logprobs, batch.response_mask.sum(dim=-1), rewards, reference, self.algo.projection_beta, self.algo.operation_temperature
                    )
                elif self.algo.operation_objective == "listwise":
                    assert reference is not None
                    result = core.enumerated_listwise(
                        logprobs, rewards, reference, self.algo.projection_beta, self.algo.operation_temperature, self.algo.set_mass_coef
                    )
                else:
                    result = core.enumerated_objective(
                        logprobs,
                        rewards,
                        reference,
                        kl_coef=self.algo.kl_coef,
                        temperature=self.algo.operation_temperature,
                        set_mass_coef=self.algo.set_mass_coef,
                    )
                self.manual_backward(-result.objective / len(states))  # the batch's mean objective
                fault_point("micro_batch")
                for option, probability in zip(found, result.probs.tolist()):
                    mass[option.operation] += probability
                stats["states"] += 1
                stats["options"] += len(found)
                stats["spread"] += float(scored.max() > scored.min())
                stats["expected"] += float((result.probs * scored).sum())  # as scored, before change_margin
                stats["best"] += float(scored.max())
                stats["add"] += state_scores["ADD"]
                stats["set_mass"] += float(result.set_mass)
                stats["kl"] += float(result.kl)
        grad_norm = self._step(optimizer, self.policy)
        metrics = self._metrics(mass, stats, len(states))
        metrics.update({
            "actor/grad_norm": grad_norm,
            "actor/lr": float(optimizer.param_groups[0]["lr"]),
            "actor/skipped_steps": float(self.skipped_steps),
            **{f"time/{stage}_s": seconds for stage, seconds in self.stage_seconds.items()},
        })
        metrics.update(self.probe_metrics())
        self.last_step = StepOutput(dict(metrics))
        self.log("reward/mean", metrics.pop("reward/mean"), on_step=True, prog_bar=True, batch_size=len(states))
        self.log_dict(metrics, on_step=True, prog_bar=False, batch_size=len(states))
        return self.last_step.as_outputs()

    def _operations(self, state: ManagerState, prompt_ids: list[int], scores: dict[str, float]) -> tuple[list[Option], RolloutBatch]:
        """The state's operations the policy can say within `max_new_tokens`, as one batch whose rows
        share the prompt, each with its reward as its score."""
        eos = self.tokenizer.eos_token_id
        found, responses = [], []
        for option in options(state):
            ids = self.tokenizer(option.reply, add_special_tokens=False).input_ids + [eos]
            if len(ids) <= self.max_new_tokens:
                found.append(option)
                responses.append(ids)
        rewards = [scores[label(option)] for option in found]
        return found, pack_rollouts([prompt_ids] * len(found), responses, rewards, self.tokenizer.pad_token_id).to(self.device)

    def _sequence_logprobs(self, model: nn.Module, batch: RolloutBatch) -> torch.Tensor:
        """log pi(reply) `(n,)`: the sum of each row's response token log-probabilities."""
        logprobs, _ = response_logprobs(model, batch, share_prompt=self.algo.share_prompt)
        return (logprobs * batch.response_mask.float()).sum(dim=-1)

    @staticmethod
    def _metrics(mass: Counter[str], stats: Counter[str], batch_states: int) -> dict[str, float]:
        scored = max(stats["states"], 1)
        metrics = {
            "reward/mean": stats["expected"] / scored,  # E_q[R]: what the policy would earn, in expectation
            "reward/best_mean": stats["best"] / scored,
            "reward/add_mean": stats["add"] / scored,
            "enum/states_with_spread": stats["spread"] / scored,
            "enum/options_mean": stats["options"] / scored,
            "enum/too_long_frac": stats["too_long"] / max(stats["options"] + stats["too_long"], 1),
            "enum/set_mass": stats["set_mass"] / scored,
            "enum/kl": stats["kl"] / scored,
            "enum/states_scored": float(stats["states"]) / max(batch_states, 1),
        }
        kinds: Counter[str] = Counter()
        for operation in OPERATIONS:
            kinds[OP_KIND[operation]] += mass[operation]
        metrics.update({f"ops/{kind}_frac": kinds[kind] / scored for kind in ("add", "update", "delete", "noop")})
        metrics.update({f"enum/{operation.lower()}_frac": mass[operation] / scored for operation in ("MERGE", "REPLACE")})
        return metrics
