"""memr1.rl.core against values worked out by hand (the arithmetic is in the comments) and a plain
loop oracle for GAE."""

from __future__ import annotations

import math

import pytest
import torch

from memr1.rl.core import (
    LOSS_AGG_MODES,
    LossDenominator,
    aggregate_loss,
    broadcast_to_tokens,
    compute_gae,
    entropy_from_logits,
    enumerated_listwise,
    enumerated_objective,
    enumerated_projection,
    explained_variance,
    group_advantages,
    groups_with_spread,
    kl_in_reward,
    kl_penalty,
    leave_one_out_advantages,
    logprobs_from_logits,
    masked_mean,
    masked_moments,
    masked_sum,
    masked_var,
    masked_whiten,
    outcome_to_token_rewards,
    overlong_penalty,
    policy_loss,
    value_loss,
    whiten_with_moments,
)

INV_SQRT2 = 1 / math.sqrt(2)


def close(actual: torch.Tensor, expected, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-5)


# --- masked statistics -----------------------------------------------------------------------------

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # selects 1, 2 and 4


@pytest.mark.parametrize("mask", [MASK, MASK.bool()], ids=["float-mask", "bool-mask"])
def test_masked_sum_and_mean(mask):
    close(masked_sum(VALUES, mask), 7.0)
    close(masked_sum(VALUES, mask, dim=-1), [3.0, 4.0])
    close(masked_mean(VALUES, mask), 7 / 3)
    close(masked_mean(VALUES, mask, dim=-1), [1.5, 4.0])
    close(masked_mean(VALUES, mask, dim=0), [2.5, 2.0, 0.0])  # column 3 selects nothing: 0


def test_masked_var():
    # deviations from 7/3: -4/3, -1/3, 5/3; squares sum to (16 + 1 + 25) / 9 = 14/3
    close(masked_var(VALUES, MASK, unbiased=False), 14 / 9)
    close(masked_var(VALUES, MASK), 7 / 3)  # 14/3 / (3 - 1)
    # per row: {1, 2} has unbiased var 0.5; {4} alone has 0
    close(masked_var(VALUES, MASK, dim=-1), [0.5, 0.0])
    close(masked_var(VALUES, torch.zeros_like(MASK)), 0.0)


def test_masked_whiten():
    scale = 1 / math.sqrt(7 / 3)  # mean 7/3, unbiased var 7/3
    whitened = masked_whiten(VALUES, MASK)
    close(whitened[MASK.bool()], [-4 / 3 * scale, -1 / 3 * scale, 5 / 3 * scale])
    rescaled = masked_whiten(VALUES, MASK, shift_mean=False)
    close(rescaled[MASK.bool()], [7 / 3 - 4 / 3 * scale, 7 / 3 - 1 / 3 * scale, 7 / 3 + 5 / 3 * scale])


def test_shape_mismatch_names_the_arguments():
    with pytest.raises(ValueError, match=r"shape mismatch: values\[2, 3\], mask\[2, 2\]"):
        masked_mean(VALUES, MASK[:, :2])


# --- loss aggregation ------------------------------------------------------------------------------

# A ragged batch: 4 valid tokens, 2 valid tokens, and an empty row whose 9s must never count.
LOSS_MAT = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
LOSS_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 3.5),  # (1 + 2 + 3 + 4 + 5 + 6) / 6
        ("seq-mean-token-sum", 10.5),  # (10 + 11) / 2, the empty row excluded
        ("seq-mean-token-mean", 4.0),  # (10/4 + 11/2) / 2 = (2.5 + 5.5) / 2
        ("seq-mean-token-sum-norm", 2.625),  # (10/4 + 11/4) / 2 with L = 4
    ],
)
def test_aggregate_loss_modes_on_a_ragged_mask(mode, expected):
    close(aggregate_loss(LOSS_MAT, LOSS_MASK, mode), expected)


def test_aggregate_loss_modes_are_all_tested_and_norm_length_is_constant():
    assert set(LOSS_AGG_MODES) == {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"}
    close(aggregate_loss(LOSS_MAT, LOSS_MASK, "seq-mean-token-sum-norm", norm_length=8), 1.3125)  # (10/8 + 11/8) / 2


@pytest.mark.parametrize(
    ("mode", "first_two_rows", "last_row"),
    [
        # over the whole batch's 6 tokens: rows 0-1 give (10 + 11) / 6, the empty row 0
        ("token-mean", 21 / 6, 0.0),
        # over its 2 sequences with tokens: (10 + 11) / 2
        ("seq-mean-token-sum", 10.5, 0.0),
        ("seq-mean-token-mean", 4.0, 0.0),  # (2.5 + 5.5) / 2
        ("seq-mean-token-sum-norm", 21 / 8 / 2, 0.0),  # norm_length 8 from the denominator: (10/8 + 11/8) / 2
    ],
)
def test_micro_batch_losses_over_the_mini_batch_denominator_add_up_to_its_loss(mode, first_two_rows, last_row):
    denominator = LossDenominator.of(LOSS_MASK, norm_length=8)
    assert (denominator.tokens, denominator.sequences) == (6.0, 2.0)
    close(aggregate_loss(LOSS_MAT[:2], LOSS_MASK[:2], mode, denominator=denominator), first_two_rows)
    close(aggregate_loss(LOSS_MAT[2:], LOSS_MASK[2:], mode, denominator=denominator), last_row)
    whole = aggregate_loss(LOSS_MAT, LOSS_MASK, mode, norm_length=8)
    close(whole, first_two_rows + last_row)
    # two ranks: each rank's share is doubled, since DDP averages the two ranks' gradients
    doubled = LossDenominator(denominator.tokens, denominator.sequences, ranks=2, norm_length=8)
    close(aggregate_loss(LOSS_MAT[:2], LOSS_MASK[:2], mode, denominator=doubled), 2 * first_two_rows)


def test_leave_one_out_advantages_by_hand():
    # group a: 1, 0, 0 -> 1 - 0 = 1, 0 - (1 + 0)/2 = -0.5, -0.5; group b: 2, 4 -> -2, 2; group c alone: 0
    close(leave_one_out_advantages(torch.tensor([1.0, 0.0, 2.0, 0.0, 4.0, 7.0]), ["a", "a", "b", "a", "b", "c"]),
          [1.0, -0.5, -2.0, -0.5, 2.0, 0.0])


def test_groups_with_spread_marks_the_rows_of_groups_whose_rewards_differ():
    spread = groups_with_spread(torch.tensor([1.0, 1.0, 0.0, 0.5, 0.5, 2.0]), torch.tensor([0, 0, 1, 1, 2, 3]))
    assert spread.tolist() == [False, False, True, True, False, False]


def test_overlong_penalty_by_hand():
    # cap 64, buffer 16: free up to 48 tokens, then -(l - 48) / 16 * 0.5, reaching -0.5 at 64
    close(overlong_penalty(torch.tensor([10, 48, 52, 64]), 64, 16, 0.5), [0.0, 0.0, -0.125, -0.5])
    with pytest.raises(ValueError, match="buffer_length: must be in 1..64"):
        overlong_penalty(torch.tensor([1]), 64, 65, 1.0)


def test_aggregate_loss_rejects_unknown_mode():
    with pytest.raises(ValueError, match=r"loss_agg_mode: unknown mode 'mean'"):
        aggregate_loss(LOSS_MAT, LOSS_MASK, "mean")


# --- rewards and GAE -------------------------------------------------------------------------------


def test_outcome_reward_goes_to_the_last_valid_token():
    scores = torch.tensor([1.0, -0.5, 2.0, 3.0])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]])  # row 4 has a hole
    expected = [[0, 1.0, 0, 0], [0, 0, 0, -0.5], [0, 0, 0, 0], [0, 0, 3.0, 0]]
    close(outcome_to_token_rewards(scores, mask), expected)


def test_gae_two_tokens_by_hand():
    # gamma 0.9, lam 0.8, V = [0.5, 0.2], r = [0, 1]:
    #   t=1: delta = 1 + 0.9 * 0 - 0.2 = 0.8,        A1 = 0.8
    #   t=0: delta = 0 + 0.9 * 0.2 - 0.5 = -0.32,    A0 = -0.32 + 0.9 * 0.8 * 0.8 = 0.256
    #   returns = A + V = [0.756, 1.0]
    rewards = torch.tensor([[0.0, 1.0]])
    values = torch.tensor([[0.5, 0.2]])
    advantages, returns = compute_gae(rewards, values, torch.ones(1, 2), gamma=0.9, lam=0.8, whiten=False)
    close(advantages, [[0.256, 0.8]])
    close(returns, [[0.756, 1.0]])


def test_gae_skips_masked_positions():
    # The same two tokens with padding after each: the pads' rewards (5, 3) and values (99, 7) are
    # ignored, and both outputs are 0 there.
    rewards = torch.tensor([[0.0, 5.0, 1.0, 3.0]])
    values = torch.tensor([[0.5, 99.0, 0.2, 7.0]])
    mask = torch.tensor([[1, 0, 1, 0]])
    advantages, returns = compute_gae(rewards, values, mask, gamma=0.9, lam=0.8, whiten=False)
    close(advantages, [[0.256, 0.0, 0.8, 0.0]])
    close(returns, [[0.756, 0.0, 1.0, 0.0]])
    # Whitened: {0.256, 0.8} has mean 0.528 and unbiased std 0.272 * sqrt(2), so -+1/sqrt(2).
    whitened, returns_again = compute_gae(rewards, values, mask, gamma=0.9, lam=0.8)
    close(whitened, [[-INV_SQRT2, 0.0, INV_SQRT2, 0.0]])
    close(returns_again, returns)  # returns are never whitened


def test_gae_outcome_reward_with_default_gamma_lambda():
    # gamma = lam = 1 and a single reward R = 1 at the end: A_t = R - V_t, returns = R.
    values = torch.tensor([[0.1, 0.2, 0.3]], requires_grad=True)
    rewards = outcome_to_token_rewards(torch.tensor([1.0]), torch.ones(1, 3))
    advantages, returns = compute_gae(rewards, values, torch.ones(1, 3), whiten=False)
    close(advantages, [[0.9, 0.8, 0.7]])
    close(returns, [[1.0, 1.0, 1.0]])
    assert not advantages.requires_grad and not returns.requires_grad


def gae_loop_oracle(rewards, values, mask, gamma, lam):
    """Textbook GAE per row over the valid tokens only, in float64 Python loops."""
    advantages = torch.zeros_like(values, dtype=torch.float64)
    for row in range(values.shape[0]):
        next_value = next_advantage = 0.0
        for t in reversed([t for t in range(values.shape[1]) if mask[row, t]]):
            delta = rewards[row, t].item() + gamma * next_value - values[row, t].item()
            next_advantage = delta + gamma * lam * next_advantage
            next_value = values[row, t].item()
            advantages[row, t] = next_advantage
    returns = (advantages + values.double()) * mask
    return advantages, returns


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.8)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_the_loop_oracle_on_random_masked_batches(gamma, lam, seed):
    generator = torch.Generator().manual_seed(seed)
    rewards = torch.randn(6, 9, generator=generator)
    values = torch.randn(6, 9, generator=generator)
    mask = torch.rand(6, 9, generator=generator) < 0.7  # holes anywhere
    mask[0] = False  # an empty row
    mask[1] = torch.arange(9) >= 4  # left padding
    mask[2] = torch.arange(9) < 3  # right padding
    expected_advantages, expected_returns = gae_loop_oracle(rewards, values, mask, gamma, lam)

    advantages, returns = compute_gae(rewards, values, mask, gamma, lam, whiten=False)
    close(advantages, expected_advantages * mask, atol=1e-4)
    close(returns, expected_returns, atol=1e-4)

    whitened, _ = compute_gae(rewards, values, mask, gamma, lam)
    valid = expected_advantages[mask]
    close(whitened[mask], (valid - valid.mean()) / valid.std(), atol=1e-4)
    assert (whitened[~mask] == 0).all()


# --- group advantages ------------------------------------------------------------------------------

# Two interleaved groups of GRPO samples and a lone one:
#   u1: [1, 0, 1, 0]  mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 1/sqrt(3), A = +-0.5 * sqrt(3)
#   u2: [2, 2, 5]     mean 3,   deviations [-1, -1, 2], unbiased std sqrt(6 / 2) = sqrt(3)
#   u3: [7]           a group of one: 0
GROUP_SCORES = torch.tensor([1.0, 2.0, 0.0, 7.0, 2.0, 1.0, 5.0, 0.0])
GROUP_UIDS = ["u1", "u2", "u1", "u3", "u2", "u1", "u2", "u1"]
HALF_SQRT3 = math.sqrt(3) / 2
INV_SQRT3 = 1 / math.sqrt(3)


@pytest.mark.parametrize(
    "group_index", [GROUP_UIDS, torch.tensor([10, 20, 10, 30, 20, 10, 20, 10])], ids=["uids", "int-tensor"]
)
def test_group_advantages_grpo(group_index):
    expected = [HALF_SQRT3, -INV_SQRT3, -HALF_SQRT3, 0.0, -INV_SQRT3, HALF_SQRT3, 2 * INV_SQRT3, -HALF_SQRT3]
    close(group_advantages(GROUP_SCORES, group_index), expected)


def test_group_advantages_dr_grpo_and_flat_groups():
    close(group_advantages(GROUP_SCORES, GROUP_UIDS, norm_by_std=False), [0.5, -1.0, -0.5, 0.0, -1.0, 0.5, 2.0, -0.5])
    # every sample right (or wrong): nothing to learn, all 0
    close(group_advantages(torch.tensor([1.0, 1.0, 1.0]), [0, 0, 0]), [0.0, 0.0, 0.0])


def test_broadcast_to_tokens():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    close(broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask), [[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]])


# --- policy loss -----------------------------------------------------------------------------------


def test_policy_loss_clipping_by_hand():
    # Per token (ratio, A):
    #   (1.5, +1): max(-1.5, -1.2) = -1.2             clipped at 1 + 0.2
    #   (5,   -1): max(5, 1.2) = 5, min(5, 3) = 3      dual-clipped at clip_ratio_c = 3
    #   (1,  0.5): -0.5                               inside the trust region
    #   (0.5, -1): max(0.5, 0.8) = 0.8                clipped at 1 - 0.2
    #   the pads (ratio e^10, A = 100) are masked out.
    # token-mean = (-1.2 + 3 - 0.5 + 0.8) / 4 = 0.525; clip_frac 2/4; dual_clip_frac 1/4;
    # approx_kl = mean(old - new) = -(ln 1.5 + ln 5 + ln 1 + ln 0.5) / 4 = -ln(3.75) / 4
    ratios = torch.tensor([[1.5, 5.0, math.exp(10)], [1.0, 0.5, math.exp(10)]])
    logprobs = ratios.log().requires_grad_()
    advantages = torch.tensor([[1.0, -1.0, 100.0], [0.5, -1.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    loss, stats = policy_loss(logprobs, torch.zeros(2, 3), advantages, mask)
    close(loss, 0.525)
    close(stats["clip_frac"], 0.5)
    close(stats["dual_clip_frac"], 0.25)
    close(stats["approx_kl"], -math.log(3.75) / 4)
    # Only the unclipped token carries gradient: d(-A * ratio / 4) / d logp = -0.5 * 1 / 4.
    loss.backward()
    close(logprobs.grad, [[0.0, 0.0, 0.0], [-0.125, 0.0, 0.0]])


def test_policy_loss_asymmetric_clip_and_aggregation():
    # DAPO-style clip_ratio_high = 0.28: ratio 1.5 with A = +1 stops at -1.28. A second row
    # (ratio 1, A = 1, loss -1) makes the modes differ: token-mean (-1.28 - 1 - 1) / 3 = -3.28/3,
    # seq-mean-token-mean (-1.28 + (-1)) / 2 = -1.14.
    logprobs = torch.tensor([[math.log(1.5), 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 0], [1, 1]])
    advantages = torch.ones(2, 2)
    token_mean, _ = policy_loss(logprobs, torch.zeros(2, 2), advantages, mask, clip_ratio_high=0.28)
    seq_mean, _ = policy_loss(
        logprobs, torch.zeros(2, 2), advantages, mask, clip_ratio_high=0.28, loss_agg_mode="seq-mean-token-mean"
    )
    close(token_mean, -3.28 / 3)
    close(seq_mean, -1.14)


def test_policy_gradient_raises_logprob_of_positive_advantage():
    logprobs = torch.zeros(1, 2, requires_grad=True)
    optimizer = torch.optim.SGD([logprobs], lr=0.1)
    loss, _ = policy_loss(logprobs, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    loss.backward()
    close(logprobs.grad, [[-0.5, 0.5]])  # d(mean(-A * ratio)) / d logp at ratio 1 = -A / 2
    optimizer.step()
    assert logprobs[0, 0] > 0 > logprobs[0, 1]


def test_policy_loss_rejects_a_dual_clip_bound_below_one():
    with pytest.raises(ValueError, match="clip_ratio_c: must be > 1.0"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), clip_ratio_c=0.9)


# --- value loss ------------------------------------------------------------------------------------


def test_value_loss_by_hand():
    # clip_range 0.5; per token (old, new, return):
    #   (1, 2, 3):     clipped 1.5; errors (2-3)^2 = 1, (1.5-3)^2 = 2.25 -> 2.25 (clipped larger)
    #   (1, 1.2, 0):   clipped 1.2 (inside); both 1.44 -> 1.44
    #   (0, -1, 0):    clipped -0.5; errors 1, 0.25 -> 1
    #   a pad with wild numbers, masked out.
    # loss = 0.5 * (2.25 + 1.44 + 1) / 3 = 0.781667; clip_frac = 1/3
    old_values = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    values = torch.tensor([[2.0, 1.2, -1.0, 50.0]], requires_grad=True)
    returns = torch.tensor([[3.0, 0.0, 0.0, -50.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, clip_frac = value_loss(values, old_values, returns, mask)
    close(loss, 0.5 * 4.69 / 3)
    close(clip_frac, 1 / 3)
    # gradients 0.5 * 2 * (v - R) / 3 where the unclipped error counts; 0 where the clip holds
    loss.backward()
    close(values.grad, [[0.0, 1.2 / 3, -1 / 3, 0.0]])


# --- KL estimators ---------------------------------------------------------------------------------


def test_kl_penalty_estimators_by_hand():
    logprobs = torch.tensor([[0.0, -1.0, -30.0]])
    ref_logprobs = torch.tensor([[-1.0, 0.0, 0.0]])  # log r = logp - ref = [1, -1, -30]
    close(kl_penalty(logprobs, ref_logprobs, "k1"), [[1.0, -1.0, -30.0]])
    close(kl_penalty(logprobs, ref_logprobs, "k2"), [[0.5, 0.5, 450.0]])
    close(kl_penalty(logprobs, ref_logprobs, "abs"), [[1.0, 1.0, 30.0]])
    # k3 = exp(-log r) + log r - 1: e^-1 + 1 - 1 = 0.3679; e + (-1) - 1 = 0.7183; at log r = -30
    # the exponent is clamped to 20 and the result to 10.
    k3 = [[math.exp(-1), math.e - 2, 10.0]]
    close(kl_penalty(logprobs, ref_logprobs, "k3"), k3)
    close(kl_penalty(logprobs, ref_logprobs, "low_var_kl"), k3)


def test_kl_penalty_rejects_unknown_kind():
    with pytest.raises(ValueError, match=r"kl kind: unknown estimator 'k4'"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")


# --- logits ----------------------------------------------------------------------------------------

NEG_INF = float("-inf")


def test_entropy_from_logits_by_hand():
    probs = torch.tensor([0.5, 0.25, 0.25, 0.0])
    logits = torch.stack(
        [
            torch.zeros(4),  # uniform over 4: ln 4
            probs.log() + 7.0,  # H = 0.5 ln 2 + 2 * 0.25 ln 4 = 1.5 ln 2 (shift-invariant; -inf for p = 0)
            torch.tensor([1000.0, 1000.0, 0.0, 0.0]),  # two huge equal logits: ln 2, no overflow
            torch.tensor([0.0, NEG_INF, NEG_INF, NEG_INF]),  # certain: 0, not nan
        ]
    ).unsqueeze(0)  # (1, 4, 4)
    close(entropy_from_logits(logits), [[math.log(4), 1.5 * math.log(2), math.log(2), 0.0]])
    assert entropy_from_logits(logits.bfloat16()).dtype == torch.float32


def test_logprobs_from_logits_by_hand():
    logits = (torch.tensor([0.5, 0.25, 0.25]).log() + 7.0).expand(1, 2, 3)  # (bs 1, L 2, V 3)
    close(logprobs_from_logits(logits, torch.tensor([[0, 2]])), [[math.log(0.5), math.log(0.25)]])
    with pytest.raises(ValueError, match=r"labels has \[1, 3\]"):
        logprobs_from_logits(logits, torch.tensor([[0, 1, 2]]))


# --- explained variance ----------------------------------------------------------------------------


def test_explained_variance_by_hand():
    returns = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    close(explained_variance(torch.tensor([[1.0, 2.0, 3.0, 0.0]]), returns, mask), 1.0)  # perfect critic
    close(explained_variance(torch.full((1, 4), 2.0), returns, mask), 0.0)  # the constant mean
    # residuals [-2, 0, 2]: var 4 against var(returns) 1 -> 1 - 4 = -3
    close(explained_variance(torch.tensor([[3.0, 2.0, 1.0, 0.0]]), returns, mask), -3.0)
    assert explained_variance(torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3)).isnan()


def test_whitening_with_moments_summed_over_ranks_is_the_whole_batchs():
    """Two ranks' moments added give the whole batch's whitening (PPO over DDP/FSDP ranks); by hand:
    the masked values 1, 2, 3, 6 have mean 3 and unbiased variance (4 + 1 + 0 + 9) / 3 = 14 / 3."""
    values = torch.tensor([[1.0, 2.0, 9.0], [3.0, 6.0, -5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    moments = masked_moments(values[:1], mask[:1]) + masked_moments(values[1:], mask[1:])
    assert moments.tolist() == [4.0, 12.0, 50.0]
    whitened = whiten_with_moments(values, moments, eps=0.0)
    expected = (torch.tensor([1.0, 2.0, 3.0, 6.0]) - 3.0) / (14.0 / 3.0) ** 0.5
    assert torch.allclose(whitened[mask.bool()], expected, atol=1e-6)
    assert torch.allclose(whitened * mask, masked_whiten(values, mask, eps=0.0) * mask, atol=1e-6)


def test_the_kl_in_the_reward_by_hand():
    # k1 per token: log pi - log pi_ref. Row 0: 0.5 + 0.5 (the third token is padding); row 1: -0.2.
    # kl_coef 0.1: the scores 1 and 0 become 1 - 0.1 and 0 + 0.02.
    logprobs = torch.tensor([[-0.5, -1.0, -9.0], [-1.2, 0.0, 0.0]])
    reference = torch.tensor([[-1.0, -1.5, 0.0], [-1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    scores, kl = kl_in_reward(torch.tensor([1.0, 0.0]), logprobs, reference, mask, kl_coef=0.1, kind="k1")
    assert kl.tolist() == pytest.approx([1.0, -0.2]) and scores.tolist() == pytest.approx([0.9, 0.02])


def test_the_enumerated_objective_and_its_gradient_by_hand():
    # q = (1/2, 1/4, 1/4) (the actions hold all the mass), R = (0, 1, 0.5): E_q R = 0.375 and
    # dJ/dlog pi(a) = q(a) (R(a) - 0.375) = (-0.1875, 0.15625, 0.03125).
    logprobs = torch.tensor([0.5, 0.25, 0.25]).log().requires_grad_()
    result = enumerated_objective(logprobs, torch.tensor([0.0, 1.0, 0.5]))
    result.objective.backward()
    assert float(result.objective.detach()) == pytest.approx(0.375) and float(result.set_mass) == pytest.approx(1.0)
    assert logprobs.grad.tolist() == pytest.approx([-0.1875, 0.15625, 0.03125])
    # Mass outside the set changes nothing but set_mass: the same actions at a tenth of the probability.
    tenth = (torch.tensor([0.5, 0.25, 0.25]) / 10).log().requires_grad_()
    shrunk = enumerated_objective(tenth, torch.tensor([0.0, 1.0, 0.5]))
    shrunk.objective.backward()
    assert float(shrunk.set_mass) == pytest.approx(0.1) and tenth.grad.tolist() == pytest.approx([-0.1875, 0.15625, 0.03125])


def test_the_set_mass_term_by_hand():
    # pi = (0.05, 0.05) over the actions, so m = 0.1; R = (1, 0), q = (1/2, 1/2), coefficient 2. The
    # reference held m_ref = 0.5, more: J = 1/2 + 2 (log 0.1 - log 0.5), and dJ/dlog pi(a) =
    # q(a) (R(a) - 1/2) + 2 pi(a) / m = (1/4 + 1, -1/4 + 1). (The KL is 0: q and q_ref are both uniform.)
    rewards = torch.tensor([1.0, 0.0])
    logprobs = torch.tensor([0.05, 0.05]).log().requires_grad_()
    result = enumerated_objective(logprobs, rewards, torch.tensor([0.25, 0.25]).log(), set_mass_coef=2.0)
    result.objective.backward()
    assert float(result.objective.detach()) == pytest.approx(0.5 + 2 * math.log(0.2))
    assert logprobs.grad.tolist() == pytest.approx([1.25, 0.75])
    # A reference that held less (m_ref = 0.02): the term is 0, and so is its gradient.
    logprobs.grad = None
    result = enumerated_objective(logprobs, rewards, torch.tensor([0.01, 0.01]).log(), set_mass_coef=2.0)
    result.objective.backward()
    assert float(result.objective.detach()) == pytest.approx(0.5) and logprobs.grad.tolist() == pytest.approx([0.25, -0.25])
    with pytest.raises(ValueError, match="set_mass_coef must be >= 0"):
        enumerated_objective(logprobs, rewards, set_mass_coef=-1.0)
    with pytest.raises(ValueError, match="pass ref_seq_logprobs"):
        enumerated_objective(logprobs, rewards, set_mass_coef=1.0)


def test_the_set_mass_term_stops_shared_weights_from_emptying_the_set():
    # Three replies with logits (0, t, 2t): the actions are the first two (R = 0, 1), the third is
    # outside (a malformed reply). Raising t is the only way to prefer the better action, and it feeds
    # the outside reply twice as fast: the renormalised objective alone empties the set. The reference
    # is the start, t = 0, and m falls for every t > 0, so there the term is c (log m(t) - log m(0)) and
    # the optimum is where d/dt [s(t) + c log m(t)] = 0, s the sigmoid and
    # d log m / dt = s(t) - (e^t + 2 e^2t) / (1 + e^t + e^2t): found here by bisection.
    rewards, coef = torch.tensor([0.0, 1.0]), 0.1

    def log_pi(t: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(torch.stack([torch.zeros(()), t, 2 * t]), dim=0)[:2]

    reference = log_pi(torch.zeros(()))

    def ascend(set_mass_coef: float) -> float:
        t = torch.zeros((), requires_grad=True)
        optimizer = torch.optim.SGD([t], lr=1.0)
        for _ in range(4000):
            optimizer.zero_grad()
            (-enumerated_objective(log_pi(t), rewards, reference, set_mass_coef=set_mass_coef).objective).backward()
            optimizer.step()
        return float(t.detach())

    def slope(t: float) -> float:
        s = 1 / (1 + math.exp(-t))
        return s * (1 - s) + coef * (s - (math.exp(t) + 2 * math.exp(2 * t)) / (1 + math.exp(t) + math.exp(2 * t)))

    low, high = 0.0, 10.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if slope(middle) > 0 else (low, middle)
    optimum = (low + high) / 2

    def set_mass(t: float) -> float:
        return (1 + math.exp(t)) / (1 + math.exp(t) + math.exp(2 * t))

    assert set_mass(ascend(0.0)) < 0.01
    held = ascend(coef)
    assert held == pytest.approx(optimum, abs=1e-3) and set_mass(held) > 0.09


def test_the_enumerated_projection_by_hand():
    # q_ref = (1/2, 1/2), R = (1, 0), beta 1, T 1: q* = (e, 1) / (e + 1). Replies of 3 and 1 tokens, a
    # mean of 2: J = (q*(0) log pi(0) + q*(1) log pi(1)) / 2, so dJ/dlog pi = q* / 2.
    target = [math.e / (math.e + 1), 1 / (math.e + 1)]
    logprobs = torch.tensor([0.2, 0.1]).log().requires_grad_()
    result = enumerated_projection(logprobs, torch.tensor([3, 1]), torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]).log(), beta=1.0)
    result.objective.backward()
    assert float(result.objective.detach()) == pytest.approx((target[0] * math.log(0.2) + target[1] * math.log(0.1)) / 2)
    assert logprobs.grad.tolist() == pytest.approx([target[0] / 2, target[1] / 2])
    assert float(result.set_mass) == pytest.approx(0.3) and result.probs.tolist() == pytest.approx([2 / 3, 1 / 3])
    with pytest.raises(ValueError, match="temperature and beta must be > 0"):
        enumerated_projection(logprobs, torch.tensor([2, 1]), torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]).log(), beta=0.0)


def test_the_projection_reaches_the_kl_regularised_optimum_from_a_rare_best_arm():
    # The bandit that the expected reward's gradient leaves at e^-30 (the test below): the projection
    # pulls its policy to q* = softmax(ref / T + R / beta) whatever the start, the best arm included.
    rewards = torch.tensor([0.5, 1.0, 0.0])
    reference = torch.log_softmax(torch.tensor([0.0, -30.0, -2.0]), dim=0)
    lengths = torch.tensor([1, 1, 1])
    for temperature, beta in [(10.0, 0.1), (1.0, 0.05)]:
        logits = reference.clone().requires_grad_()
        optimizer = torch.optim.SGD([logits], lr=5.0)
        for _ in range(2000):
            optimizer.zero_grad()
            logprobs = torch.log_softmax(logits, dim=0)
            (-enumerated_projection(logprobs, lengths, rewards, reference, beta, temperature).objective).backward()
            optimizer.step()
        optimum = torch.softmax(reference / temperature + rewards / beta, dim=0)
        assert torch.softmax(logits.detach(), dim=0).tolist() == pytest.approx(optimum.tolist(), abs=1e-3)
    # At T 10 the best arm's 30 nats become 3, and a reward margin of 0.5 at beta 0.1 is worth 5: it wins.
    assert float(torch.softmax(reference / 10 + rewards / 0.1, dim=0)[1]) > 0.8


def test_the_enumerated_listwise_loss_by_hand():
    # q_ref = (1/2, 1/2), R = (1, 0), beta 1, T 1: q* = (e, 1) / (e + 1). pi = (0.2, 0.1): the choice
    # q = (2/3, 1/3), the mass m = 0.3 below the reference's 1. J = sum q* log q (+ c log 0.3), so
    # dJ/dlog pi = q* - q, and at c = 1, + q: q*, the projection's step without its length division.
    target = [math.e / (math.e + 1), 1 / (math.e + 1)]
    choice = [2 / 3, 1 / 3]
    for set_mass_coef, gradient in [(0.0, [t - c for t, c in zip(target, choice)]), (1.0, target)]:
        logprobs = torch.tensor([0.2, 0.1]).log().requires_grad_()
        result = enumerated_listwise(logprobs, torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]).log(), beta=1.0, set_mass_coef=set_mass_coef)
        result.objective.backward()
        expected = target[0] * math.log(2 / 3) + target[1] * math.log(1 / 3) + set_mass_coef * math.log(0.3)
        assert float(result.objective.detach()) == pytest.approx(expected)
        assert logprobs.grad.tolist() == pytest.approx(gradient)
        assert float(result.set_mass) == pytest.approx(0.3) and result.probs.tolist() == pytest.approx(choice)
    # A mass above the reference's (0.3 against 0.2) is not pushed: the step is the choice's alone.
    logprobs = torch.tensor([0.2, 0.1]).log().requires_grad_()
    enumerated_listwise(logprobs, torch.tensor([1.0, 0.0]), torch.tensor([0.1, 0.1]).log(), beta=1.0, set_mass_coef=1.0).objective.backward()
    assert logprobs.grad.tolist() == pytest.approx([t - c for t, c in zip(target, choice)])
    # Where the choice already is q* and the mass is held, nothing is pushed: q_ref = (1/2, 1/2) and R =
    # (log 2, 0) at beta 1 make q* = (2/3, 1/3), the choice of pi = (0.2, 0.1).
    logprobs = torch.tensor([0.2, 0.1]).log().requires_grad_()
    enumerated_listwise(logprobs, torch.tensor([math.log(2), 0.0]), torch.tensor([0.1, 0.1]).log(), beta=1.0, set_mass_coef=1.0).objective.backward()
    assert logprobs.grad.tolist() == pytest.approx([0.0, 0.0], abs=1e-7)
    with pytest.raises(ValueError, match="temperature and beta must be > 0"):
        enumerated_listwise(logprobs, torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]).log(), beta=0.0)
    with pytest.raises(ValueError, match="set_mass_coef must be >= 0"):
        enumerated_listwise(logprobs, torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]).log(), beta=1.0, set_mass_coef=-1.0)


def test_the_listwise_loss_reaches_the_kl_regularised_optimum_from_a_rare_best_arm():
    # The bandit of the projection's test: the policy's choice is pulled to q* = softmax(ref / T + R / beta),
    # the arm the reference gives e^-30 included. The choice is softmax(logits / T) and the gradient in the
    # logits (q* - q) / T, so the step is scaled by T^2 to move the choice alike at each T.
    rewards = torch.tensor([0.5, 1.0, 0.0])
    reference = torch.log_softmax(torch.tensor([0.0, -30.0, -2.0]), dim=0)
    for temperature, beta in [(10.0, 0.1), (1.0, 0.05)]:
        logits = reference.clone().requires_grad_()
        optimizer = torch.optim.SGD([logits], lr=5.0 * temperature**2)
        for _ in range(2000):
            optimizer.zero_grad()
            logprobs = torch.log_softmax(logits, dim=0)
            (-enumerated_listwise(logprobs, rewards, reference, beta, temperature).objective).backward()
            optimizer.step()
        optimum = torch.softmax(reference / temperature + rewards / beta, dim=0)
        choice = torch.softmax(torch.log_softmax(logits.detach(), dim=0) / temperature, dim=0)
        assert choice.tolist() == pytest.approx(optimum.tolist(), abs=1e-3)


def test_the_enumerated_kl_by_hand():
    # q = (1/2, 1/2), q_ref = (1/4, 3/4): KL = 1/2 log 2 + 1/2 log(2/3).
    result = enumerated_objective(torch.tensor([0.0, 0.0]), torch.tensor([1.0, 0.0]), torch.tensor([0.25, 0.75]).log(), kl_coef=0.5)
    kl = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    assert float(result.kl) == pytest.approx(kl) and float(result.objective) == pytest.approx(0.5 - 0.5 * kl)


@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
def test_ascending_the_enumerated_objective_reaches_the_bandits_known_optimum(kl_coef):
    # A four-armed bandit whose policy is its logits, started at a reference that all but ignores the
    # best arm: without KL the best arm (1) takes the mass; with KL b the optimum is q_ref exp(R / b) / Z.
    rewards = torch.tensor([0.2, 0.9, 0.5, 0.0])
    reference = torch.tensor([0.4, 0.01, 0.3, 0.29]).log()
    logits = reference.clone().requires_grad_()
    optimizer = torch.optim.SGD([logits], lr=2.0)
    for _ in range(3000):
        optimizer.zero_grad()
        (-enumerated_objective(logits, rewards, reference, kl_coef).objective).backward()
        optimizer.step()
    q = torch.softmax(logits.detach(), dim=0)
    if kl_coef == 0.0:
        assert float(q[1]) > 0.99
    else:
        optimum = torch.softmax(reference + rewards / kl_coef, dim=0)
        assert q.tolist() == pytest.approx(optimum.tolist(), abs=1e-4)


def test_a_temperature_reaches_the_best_arm_that_the_exact_gradient_leaves_at_e_minus_30():
    # The policy is sure of arm 0 (a 135M Manager of its ADD); arm 1, the best, has e^-30 of it. The
    # exact gradient (T = 1) pushes arm 1 by q(1) (R(1) - E R) ~ e^-30: it stays where it is. Flattened by
    # T = 10 it gets a share of the push, and the maximiser is the same arm.
    rewards = torch.tensor([0.5, 1.0, 0.0])
    start = torch.tensor([0.0, -30.0, -2.0])
    for temperature, reaches in [(1.0, False), (10.0, True)]:
        logits = start.clone().requires_grad_()
        optimizer = torch.optim.SGD([logits], lr=20.0)
        for _ in range(1000):
            optimizer.zero_grad()
            (-enumerated_objective(logits, rewards, temperature=temperature).objective).backward()
            optimizer.step()
        assert (float(torch.softmax(logits.detach(), dim=0)[1]) > 0.99) is reaches
    with pytest.raises(ValueError, match="temperature must be > 0"):
        enumerated_objective(start, rewards, temperature=0.0)
