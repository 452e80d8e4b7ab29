"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): the importance ratio and its clip
are a whole response's, not a token's.

A response's ratio is the geometric mean of its tokens' ratios,
s = exp(mean_t (log pi(y_t) - log pi_old(y_t))), so that one token's wild ratio no longer moves or clips
the response alone, and the reward (a sequence's) and the correction (now a sequence's) match. Its
token form (GSPO-token) gives token t the ratio sg[s] * pi(y_t) / sg[pi(y_t)]: the same value as s for
every token and the gradient s * grad log pi(y_t), so the response's gradient is s times the mean of its
tokens' (the paper's, with the 1/|y| from the token mean of `loss_agg_mode=seq-mean-token-mean`,
conf/algo/gspo.yaml). Per token, l = max(-A s_t, -A clip(s_t, 1 - low, 1 + high)); the paper's clip
range is narrow (3e-4, 4e-4), since a sequence's ratio moves far less than a token's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from memr1.rl import core
from memr1.rl.policy_losses import LossSettings

# exp() of a sequence's mean log-ratio, bounded as verl bounds it, so that a diverged response cannot
# overflow; at 10 the ratio is 22,000, far outside any clip.
MAX_LOG_RATIO = 10.0


def sequence_ratios(logprobs: Tensor, old_logprobs: Tensor, response_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Each response's log-ratio, its tokens' mean `(bs,)` (detached), and the per-token ratio of
    GSPO-token `(bs, L)`: equal to the response's ratio in value, with the gradient of log pi(y_t)."""
    mask = response_mask.to(logprobs.dtype)
    lengths = mask.sum(dim=-1).clamp(min=1.0)
    sequence_log_ratio = (((logprobs - old_logprobs) * mask).sum(dim=-1) / lengths).detach()
    token_log_ratio = logprobs - logprobs.detach() + sequence_log_ratio.unsqueeze(-1)
    return sequence_log_ratio, token_log_ratio.clamp(max=MAX_LOG_RATIO).exp()


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    algo: LossSettings,
    denominator: core.LossDenominator | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """logprobs (with gradient), old_logprobs, advantages, response_mask: (bs, L) -> (loss, stats).

    stats: `clip_frac` (the tokens, so the responses, whose clipped term is the larger), `approx_kl`
    (the mean of old - new log-probs over the tokens, as the vanilla loss logs it), `seq_ratio_mean`
    (the mean response ratio)."""
    sequence_log_ratio, ratio = sequence_ratios(logprobs, old_logprobs, response_mask)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - algo.clip_ratio_low, 1.0 + algo.clip_ratio_high)
    losses = torch.maximum(unclipped, clipped)
    loss = core.aggregate_loss(losses, response_mask, algo.loss_agg_mode, denominator=denominator)
    with torch.no_grad():
        has_tokens = response_mask.sum(dim=-1) > 0
        stats = {
            "clip_frac": core.masked_mean((clipped > unclipped).float(), response_mask),
            "approx_kl": core.masked_mean(old_logprobs - logprobs, response_mask),
            "seq_ratio_mean": sequence_log_ratio[has_tokens].exp().mean(),
        }
    return loss, stats
