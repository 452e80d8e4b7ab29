"""What one RL step logs about its rollout and update: rewards, group spread, overlong shaping,
advantages, response lengths, format errors and stage times (a pure function of the step's tensors)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from memr1.envs.base import Reward
from memr1.rl import core
from memr1.rl.batch import RolloutBatch


def rl_step_metrics(
    batch: RolloutBatch,
    rewards: Sequence[Reward],
    group: int,
    update: Mapping[str, float],
    stage_seconds: Mapping[str, float],
    overlong_shaping: bool,
) -> dict[str, float]:
    """The step's metrics by name. batch: the step's rows (`group` consecutive rows per state, their
    advantages filled); rewards: one per row; update: `update_actor_critic`'s statistics (value_* and
    critic_* ones go under critic/, the rest under actor/); stage_seconds: seconds per stage."""
    mask = batch.response_mask.float()
    scores = batch.scores
    lengths = mask.sum(dim=1)
    metrics = {f"actor/{name}": value for name, value in update.items() if not name.startswith(("value", "critic"))}
    metrics.update({f"critic/{name}": value for name, value in update.items() if name.startswith(("value", "critic"))})
    metrics["reward/mean"] = float(scores.mean())
    metrics["reward/std"] = float(scores.std()) if len(scores) > 1 else 0.0
    if group > 1:
        group_ids = torch.arange(len(scores)) // group
        metrics["reward/zero_std_group_frac"] = float((~core.groups_with_spread(scores, group_ids)).float().mean())
    if overlong_shaping:
        penalties = [r.terms.get("overlong", 0.0) for r in rewards]
        metrics["reward/overlong_frac"] = sum(p < 0 for p in penalties) / len(penalties)
        metrics["reward/overlong_penalty_mean"] = sum(penalties) / len(penalties)
    valid = mask.bool()
    metrics["advantage/mean"] = float(core.masked_mean(batch.advantages, mask))
    metrics["advantage/max"] = float(batch.advantages[valid].max()) if valid.any() else 0.0
    metrics["advantage/min"] = float(batch.advantages[valid].min()) if valid.any() else 0.0
    # The responses that carry a gradient: a zero advantage teaches nothing, whatever the reward.
    metrics["advantage/nonzero_frac"] = float((batch.advantages.abs().amax(dim=1) > 0).float().mean())
    metrics["response/length_mean"] = float(lengths.mean())
    metrics["response/length_max"] = float(lengths.max())
    metrics["response/format_error_rate"] = sum(r.format_error is not None for r in rewards) / len(rewards)
    for name, seconds in stage_seconds.items():
        metrics[f"time/{name}_s"] = seconds
    if stage_seconds.get("rollout"):
        metrics["time/rollout_tokens_per_s"] = float(lengths.sum()) / stage_seconds["rollout"]
    return metrics
