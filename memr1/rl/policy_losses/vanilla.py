"""PPO's clipped surrogate with dual clipping, per token (verl's `vanilla`; GRPO's and PPO's loss)."""

from __future__ import annotations

from torch import Tensor

from memr1.rl import core
from memr1.rl.policy_losses import LossSettings


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    algo: LossSettings,
    denominator: core.LossDenominator | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """`core.policy_loss` with the run's clip ratios and aggregation; shapes as there, (bs, L)."""
    return core.policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        response_mask,
        clip_ratio_low=algo.clip_ratio_low,
        clip_ratio_high=algo.clip_ratio_high,
        clip_ratio_c=algo.clip_ratio_c,
        loss_agg_mode=algo.loss_agg_mode,
        denominator=denominator,
    )
