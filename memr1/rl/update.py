"""The actor / critic update of one rollout batch (verl's `dp_actor.update_policy`): epochs over
shuffled mini-batches, gradients accumulated over micro-batches, one optimiser step per mini-batch.

Each mini-batch's loss is divided by its own token (or sequence) count, counted once over every
micro-batch and rank (`core.LossDenominator`), so the gradient is the same however the rows are split
into micro-batches or data-parallel ranks. The forwards, the backward and the optimiser steps are the
`Learner`'s (the Lightning module); this file owns the loop and the loss (the policy term is
`algo.policy_loss`'s, `memr1.rl.policy_losses`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch

from memr1.faults import fault_point
from memr1.rl import core, policy_losses
from memr1.rl.algorithms import AlgoConfig
from memr1.rl.batch import RolloutBatch


class Learner(Protocol):
    """What the update needs from the module that owns the models and optimisers."""

    def policy_logprobs(self, micro: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's log-probs `(bs, R)` of the responses, with their graph, and the entropy `(bs, R)`."""
        ...

    def critic_values(self, micro: RolloutBatch) -> torch.Tensor:
        """The critic's values `(bs, R)`, with their graph."""
        ...

    def micro_batches(self, minibatch: RolloutBatch, interruptible: bool) -> Iterator[RolloutBatch]:
        """The micro-batches of `minibatch`; `interruptible`: a stop request may end the step before each."""
        ...

    def denominator(self, response_mask: torch.Tensor) -> core.LossDenominator:
        """This mini-batch's token and sequence counts summed over every rank, and the constant length
        of `seq-mean-token-sum-norm` (the generation budget)."""
        ...

    def accumulate(self, loss: torch.Tensor) -> None:
        """Backward `loss` into the gradients (Lightning's `manual_backward`)."""
        ...

    def step_actor(self, last: bool) -> float:
        """Clip, step and zero the actor's gradients (`last`: the rollout batch's final step); its norm."""
        ...

    def step_critic(self) -> float:
        """The same for the critic."""
        ...


def single_pass(algo: AlgoConfig, rows: int) -> bool:
    """Whether the update is one optimiser step over the whole rollout batch (one epoch, one
    mini-batch): then the policy being updated is pi_old itself, and its own forward, detached, is
    pi_old's log-probs (verl's on-policy shortcut), so none need computing beforehand."""
    return algo.ppo_epochs == 1 and (algo.mini_batch_size == 0 or algo.mini_batch_size >= rows)


def update_actor_critic(
    learner: Learner,
    batch: RolloutBatch,
    algo: AlgoConfig,
    generator: torch.Generator,
    group_size: int,
    with_critic: bool,
) -> dict[str, float]:
    """`algo.ppo_epochs` passes over `batch` (advantages, old log-probs and, for PPO, old values and
    returns filled in; old log-probs may be None for a `single_pass` update), shuffled by whole groups
    of `group_size` rows into mini-batches of `algo.mini_batch_size` rows (0: the whole batch). Returns
    the mean of each logged statistic over the mini-batches; the per-token ones weighted by tokens."""
    policy_loss = policy_losses.load(algo.policy_loss)
    mini_size = algo.mini_batch_size or len(batch)
    if batch.old_logprobs is None and not single_pass(algo, len(batch)):
        raise ValueError("old log-probs are needed: the update makes more than one pass over the batch")
    minibatches = [mb for _ in range(algo.ppo_epochs) for mb in batch.minibatches(mini_size, generator, group_size=group_size)]
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}

    def note(name: str, value: torch.Tensor | float, weight: float = 1.0) -> None:
        sums[name] = sums.get(name, 0.0) + float(value) * weight
        weights[name] = weights.get(name, 0.0) + weight

    for position, minibatch in enumerate(minibatches):
        denominator = learner.denominator(minibatch.response_mask)
        local_tokens = max(float(minibatch.response_mask.sum()), 1.0)
        totals: dict[str, float] = {}
        # Until the first optimiser step a stop loses nothing; after it, the step is finished so that
        # a checkpoint never holds weights halfway through one.
        for micro in learner.micro_batches(minibatch, interruptible=position == 0):
            mask = micro.response_mask.float()
            share = float(mask.sum()) / local_tokens  # of this rank's tokens: weights the logged means
            logprobs, entropy = learner.policy_logprobs(micro)
            old_logprobs = micro.old_logprobs if micro.old_logprobs is not None else logprobs.detach()
            pg_loss, pg_stats = policy_loss(logprobs, old_logprobs, micro.advantages, mask, algo, denominator)
            entropy_loss = core.aggregate_loss(entropy, mask, algo.loss_agg_mode, denominator=denominator)
            loss = pg_loss - algo.entropy_coef * entropy_loss
            parts = {"policy_loss": pg_loss, "entropy": entropy_loss}
            if micro.ref_logprobs is not None and not algo.kl_in_reward:
                kl = core.aggregate_loss(
                    core.kl_penalty(logprobs, micro.ref_logprobs, algo.kl_kind), mask, algo.loss_agg_mode, denominator=denominator
                )
                loss = loss + algo.kl_coef * kl
                parts["kl"] = kl
            learner.accumulate(loss)
            fault_point("micro_batch")
            for name, value in parts.items():  # shares of the mini-batch's value: they add up
                totals[name] = totals.get(name, 0.0) + float(value.detach()) / denominator.ranks
            for key, value in pg_stats.items():
                note(key, value, share)
            if algo.ppo_epochs > 1:  # is the clip active in the later epochs? (the first is on-policy)
                epoch = position * algo.ppo_epochs // len(minibatches)
                note(f"clip_frac/epoch{epoch}", pg_stats["clip_frac"], share)
                note(f"approx_kl/epoch{epoch}", pg_stats["approx_kl"], share)
            if with_critic:
                v_loss, v_clip = core.value_loss(
                    learner.critic_values(micro), micro.old_values, micro.returns, mask, algo.value_clip,
                    algo.loss_agg_mode, denominator=denominator,
                )
                learner.accumulate(v_loss)
                totals["value_loss"] = totals.get("value_loss", 0.0) + float(v_loss.detach()) / denominator.ranks
                note("value_clip_frac", v_clip, share)
        for name, value in totals.items():
            note(name, value)
        if with_critic:
            note("critic_grad_norm", learner.step_critic())
        note("grad_norm", learner.step_actor(last=position == len(minibatches) - 1))
    return {name: sums[name] / weights[name] for name in sums}
