"""The RL maths of Memory-R1 as pure tensor functions: masked statistics, loss aggregation, GAE,
GRPO group advantages, the exact gradient over enumerated actions, the PPO policy and value losses,
KL estimators and logit helpers.

Conventions (those of verl's ``core_algos.py``):

- ``bs`` is the number of sequences, ``L`` the response length, ``V`` the vocabulary size.
- ``response_mask`` is ``(bs, L)``, bool or float, 1 on the response tokens that count and 0 on
  padding (and on tool / observation tokens in multi-turn rollouts). Masks are binary.
- Per-token tensors (log-probabilities, values, rewards, advantages) are ``(bs, L)``; per-sequence
  tensors (scores, group advantages) are ``(bs,)``.
- Losses are minimised; statistics returned beside them are detached.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
import torch
from torch import Tensor

from memr1.config import KL_KINDS, LOSS_AGG_MODES, KLKind, LossAggMode


def _require_same_shape(**tensors: Tensor) -> None:
    """Raise a ValueError naming every argument and its shape unless all shapes agree."""
    shapes = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name}{list(shape)}" for name, shape in shapes.items())
        raise ValueError(f"shape mismatch: {listed}")


def _require_rank(tensor: Tensor, name: str, rank: int, layout: str) -> None:
    if tensor.dim() != rank:
        raise ValueError(f"{name}: expected {layout}, got shape {list(tensor.shape)}")


# --- masked statistics -----------------------------------------------------------------------------


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `values` where `mask` is 1.

    values, mask: same shape, e.g. (bs, L). Returns a scalar when ``dim`` is None, else the shape of
    `values` without ``dim``.
    """
    _require_same_shape(values=values, mask=mask)
    masked = values * mask.to(values.dtype)
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `values` over the positions where `mask` is 1; 0 where nothing is selected.

    values, mask: same shape, e.g. (bs, L). Returns a scalar when ``dim`` is None, else the shape of
    `values` without ``dim``.
    """
    count = masked_sum(torch.ones_like(values), mask, dim)
    # A binary mask gives integer counts, so clamping at 1 only changes the empty case (sum 0 -> 0).
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_var(values: Tensor, mask: Tensor, dim: int | None = None, unbiased: bool = True) -> Tensor:
    """Variance of `values` over the positions where `mask` is 1.

    values, mask: same shape, e.g. (bs, L); output as for `masked_mean`. ``unbiased`` applies Bessel's
    correction n / (n - 1) like ``torch.var``; with one selected element (where the correction is
    undefined) the variance is 0, and with none it is 0.
    """
    keep = dim is not None
    mean = masked_mean(values, mask, dim)
    centred = values - (mean.unsqueeze(dim) if keep else mean)
    variance = masked_mean(centred.square(), mask, dim)
    if unbiased:
        count = masked_sum(torch.ones_like(values), mask, dim)
        variance = variance * torch.where(count > 1, count / (count - 1).clamp(min=1), torch.ones_like(count))
    return variance


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(values - mean) / sqrt(var + eps) with mean and unbiased var over all masked positions.

    values, mask: (bs, L) -> (bs, L). With ``shift_mean=False`` the mean is added back (only the
    scale changes). Unmasked positions are transformed too; callers mask them.
    """
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + eps)
    return whitened if shift_mean else whitened + mean


def masked_moments(values: Tensor, mask: Tensor) -> Tensor:
    """(count, sum, sum of squares) of `values` over the positions where `mask` is 1.

    values, mask: (bs, L) -> (3,). Moments add up: summed over data-parallel ranks they are the whole
    batch's, which `whiten_with_moments` then applies on each rank.
    """
    mask = mask.float()
    values = values.float()
    return torch.stack([mask.sum(), (values * mask).sum(), (values.square() * mask).sum()])


def whiten_with_moments(values: Tensor, moments: Tensor, eps: float = 1e-8) -> Tensor:
    """(values - mean) / sqrt(var + eps), the mean and unbiased variance taken from `moments`
    (`masked_moments`, possibly summed over ranks): `masked_whiten` over the batch they count.

    values: (bs, L) -> (bs, L); moments: (3,).
    """
    count, total, squares = moments.double().unbind()
    mean = total / count.clamp(min=1)
    variance = (squares - count * mean.square()).clamp(min=0) / (count - 1).clamp(min=1)
    return ((values.double() - mean) * torch.rsqrt(variance + eps)).to(values.dtype)


# --- loss aggregation ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossDenominator:
    """What a mini-batch's loss is divided by, counted once over the whole mini-batch: every
    micro-batch and every rank (verl's global batch info). With it, each micro-batch's share of the
    loss is its sum over this denominator, so the accumulated gradient does not depend on how the rows
    were split into micro-batches or ranks.

    tokens: valid response tokens of the mini-batch; sequences: its rows with at least one valid
    token; ranks: the data-parallel processes whose gradients are averaged (the all-reduce divides by
    it, so each rank's share is multiplied back); norm_length: `seq-mean-token-sum-norm`'s constant
    length (the generation budget).
    """

    tokens: float
    sequences: float
    ranks: int = 1
    norm_length: int | None = None

    @staticmethod
    def of(response_mask: Tensor, ranks: int = 1, norm_length: int | None = None) -> LossDenominator:
        """The denominator of one process's whole mini-batch `response_mask` (bs, L)."""
        mask = response_mask.float()
        return LossDenominator(float(mask.sum()), float((mask.sum(dim=-1) > 0).sum()), ranks, norm_length)


def aggregate_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: LossAggMode = "token-mean",
    norm_length: int | None = None,
    denominator: LossDenominator | None = None,
) -> Tensor:
    """Reduce a per-token loss (bs, L) with its mask (bs, L) to a scalar.

    - ``token-mean``: mean over every valid token of the batch (long answers weigh more).
    - ``seq-mean-token-sum``: per-sequence sum of its tokens, then mean over sequences.
    - ``seq-mean-token-mean``: per-sequence mean of its tokens, then mean over sequences.
    - ``seq-mean-token-sum-norm`` (Dr. GRPO): per-sequence sum divided by a constant length
      ``norm_length`` (default L, the padded length; pass the generation budget to keep it constant
      across batches), then mean over sequences. verl sums over sequences here; the mean keeps the
      scale independent of the batch size (it is verl's value divided by bs).

    Sequence means run over the sequences with at least one valid token. With a `denominator` the
    batch is one micro-batch of a larger mini-batch: the sums above are divided by the whole
    mini-batch's token or sequence count (times its ranks) instead of this batch's own, so the losses of
    all its micro-batches add up to the mini-batch's loss; `denominator.norm_length`, when set, is the
    constant length.
    """
    _require_rank(loss_mat, "loss_mat", 2, "(bs, L)")
    _require_same_shape(loss_mat=loss_mat, mask=mask)
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode: unknown mode {mode!r}; expected one of {LOSS_AGG_MODES}")
    if denominator is not None and denominator.norm_length is not None:
        norm_length = denominator.norm_length
    if mode == "token-mean":
        if denominator is None:
            return masked_mean(loss_mat, mask)
        return masked_sum(loss_mat, mask) * denominator.ranks / max(denominator.tokens, 1.0)
    has_tokens = mask.to(loss_mat.dtype).sum(dim=-1) > 0
    if mode == "seq-mean-token-sum":
        per_sequence = masked_sum(loss_mat, mask, dim=-1)
    elif mode == "seq-mean-token-mean":
        per_sequence = masked_mean(loss_mat, mask, dim=-1)
    else:  # seq-mean-token-sum-norm
        length = loss_mat.shape[-1] if norm_length is None else norm_length
        if length <= 0:
            raise ValueError(f"norm_length: must be positive, got {length}")
        per_sequence = masked_sum(loss_mat, mask, dim=-1) / length
    if denominator is None:
        return masked_mean(per_sequence, has_tokens)
    return masked_sum(per_sequence, has_tokens) * denominator.ranks / max(denominator.sequences, 1.0)


def sft_loss(
    logprobs: Tensor,
    response_mask: Tensor,
    loss_agg_mode: LossAggMode = "token-mean",
    denominator: LossDenominator | None = None,
    weights: Tensor | None = None,
) -> Tensor:
    """Memory-SFT's loss: the negative log-likelihood of the teacher's response tokens (bs, L) under
    their mask (bs, L), aggregated like the RL losses (over the whole mini-batch's `denominator` when
    given); prompt tokens never enter it. `weights` (bs,): each response's tokens weighed by its row's
    weight before the aggregation, whose denominator stays the unweighted token (or sequence) count,
    so a target of weight w pulls w times as hard as one of weight 1."""
    nll = -logprobs if weights is None else -logprobs * weights[:, None]
    return aggregate_loss(nll, response_mask, loss_agg_mode, denominator=denominator)


# --- the exact gradient over enumerated actions ----------------------------------------------------


@dataclass(frozen=True)
class EnumeratedObjective:
    """One state's `enumerated_objective`: `objective` () with its graph; the rest detached."""

    objective: Tensor
    probs: Tensor            # (n,) q, the policy renormalised over the n actions (and tempered)
    expected_reward: Tensor  # () E_q[R]
    kl: Tensor               # () KL(q || q_ref), 0 without a reference
    set_mass: Tensor         # () sum of pi(a): how much of the policy the n actions hold


def enumerated_objective(
    seq_logprobs: Tensor,
    rewards: Tensor,
    ref_seq_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    temperature: float = 1.0,
    set_mass_coef: float = 0.0,
) -> EnumeratedObjective:
    """The expected reward of one state's enumerated actions, every action weighed by its probability
    instead of sampled: no exploration is needed to reach an action the policy seldom takes.

    seq_logprobs (n,): log pi(a), each action's whole response (EOS included) under the policy, with
    its graph; rewards (n,): each action's reward; ref_seq_logprobs (n,): the reference policy's.

    q = softmax(seq_logprobs / temperature) is the policy renormalised over the n actions and
    J = sum_a q(a) R(a) - kl_coef * KL(q || q_ref) + set_mass_coef * min(0, log m - log m_ref), q_ref
    tempered alike, m = sum_a pi(a) the probability that the reply is one of the actions and m_ref the
    reference's. At temperature 1 the first term's gradient is the exact policy gradient over the
    actions: sum_a q(a) (R(a) - E_q R) grad log pi(a), REINFORCE with every action in and E_q R as the
    baseline.

    What it optimises, stated:
    - the policy restricted to these actions: the first two terms move only their log-probabilities
      relative to each other. The mass outside them (malformed replies, other texts) is neither
      rewarded nor pushed down by those terms, and with shared weights it can grow while they climb (a
      Manager whose greedy replies leave its operations). The third term holds it where it fell below
      the reference's: there its gradient is that of log m, the log-likelihood of "one of the actions",
      sum_a (pi(a) / m) grad log pi(a). That gradient raises each action by its share of m, so it
      favours the likeliest; kept on everywhere it pinned a Manager to its ADD (UPDATE's share 7% ->
      1% in 7 steps), hence only below the reference. set_mass_coef = 0 drops it;
    - at temperature T > 1, the expected reward of that policy flattened by T. Whole replies differ by
      tens of nats, so at T = 1 an action the policy gives e^-30 gets e^-30 of the push, however good
      it is; flattened, it gets a share. Without KL the maximiser is unchanged (all mass on the best
      action); with kl_coef = b > 0 it is q* proportional to q_ref * exp(R / b) in the tempered terms.
    """
    _require_rank(seq_logprobs, "seq_logprobs", 1, "(n,)")
    _require_same_shape(seq_logprobs=seq_logprobs, rewards=rewards)
    if temperature <= 0:
        raise ValueError(f"enumerated_objective: temperature must be > 0, got {temperature}")
    if set_mass_coef < 0:
        raise ValueError(f"enumerated_objective: set_mass_coef must be >= 0, got {set_mass_coef}")
    log_q = torch.log_softmax(seq_logprobs.float() / temperature, dim=0)
    q = log_q.exp()
    expected = (q * rewards.float()).sum()
    kl = torch.zeros((), device=seq_logprobs.device)
    mass_term = torch.zeros((), device=seq_logprobs.device)
    log_set_mass = torch.logsumexp(seq_logprobs.float(), dim=0)
    if ref_seq_logprobs is not None:
        _require_same_shape(seq_logprobs=seq_logprobs, ref_seq_logprobs=ref_seq_logprobs)
        kl = (q * (log_q - torch.log_softmax(ref_seq_logprobs.float() / temperature, dim=0))).sum()
        mass_term = (log_set_mass - torch.logsumexp(ref_seq_logprobs.float(), dim=0)).clamp(max=0.0)
    elif set_mass_coef > 0:
        raise ValueError("enumerated_objective: set_mass_coef > 0 holds the mass at the reference's: pass ref_seq_logprobs")
    return EnumeratedObjective(
        objective=expected - kl_coef * kl + set_mass_coef * mass_term,
        probs=q.detach(),
        expected_reward=expected.detach(),
        kl=kl.detach(),
        set_mass=log_set_mass.detach().exp(),
    )


def kl_regularised_target(ref_seq_logprobs: Tensor, rewards: Tensor, beta: float, temperature: float) -> tuple[Tensor, Tensor]:
    """(log q_ref, q*), each (n,): the reference renormalised over a state's n actions and flattened by
    T, and q* = softmax(log q_ref + R / beta), the maximiser of E_q[R] - beta KL(q || q_ref)."""
    log_q_ref = torch.log_softmax(ref_seq_logprobs.float() / temperature, dim=0)
    return log_q_ref, torch.softmax(log_q_ref + rewards.float() / beta, dim=0)


def enumerated_projection(
    seq_logprobs: Tensor,
    response_lengths: Tensor,
    rewards: Tensor,
    ref_seq_logprobs: Tensor,
    beta: float,
    temperature: float = 1.0,
) -> EnumeratedObjective:
    """The KL-regularised best policy over one state's enumerated actions, and the policy drawn to it
    by cross-entropy (MPO's and AWR's policy improvement, with every action's reward known exactly).

    seq_logprobs (n,): log pi(a) of each action's whole response, with its graph; response_lengths
    (n,): its tokens; rewards (n,); ref_seq_logprobs (n,): the reference policy's.

    The target is q*(a) = softmax(log pi_ref(a) / T + R(a) / beta) over the actions: the maximiser of
    E_q[R] - beta KL(q || q_ref), q_ref the reference renormalised over them and flattened by T. The
    objective is sum_a q*(a) log pi(a) / mean_a |a|: the replies' log-likelihood weighed by the target,
    divided by their mean length (one constant a state, for Memory-SFT's per-token scale; dividing each
    reply by its own length would favour the short ones). Its maximiser is pi = q* on the actions, all of
    the mass on them. Where rewards tie, q* = q_ref; where one action beats the reference's choice by more than
    beta times the log-odds against it, it takes most of q*. Unlike `enumerated_objective`, a rare
    action that q* wants gets the likelihood's full push (its gradient does not shrink with pi(a)), and
    no mass can leak out of the set.
    """
    _require_rank(seq_logprobs, "seq_logprobs", 1, "(n,)")
    _require_same_shape(seq_logprobs=seq_logprobs, rewards=rewards, ref_seq_logprobs=ref_seq_logprobs, response_lengths=response_lengths)
    if temperature <= 0 or beta <= 0:
        raise ValueError(f"enumerated_projection: temperature and beta must be > 0, got {temperature} and {beta}")
    log_q_ref, target = kl_regularised_target(ref_seq_logprobs, rewards, beta, temperature)
    log_q = torch.log_softmax(seq_logprobs.detach().float() / temperature, dim=0)
    q = log_q.exp()
    return EnumeratedObjective(
        objective=(target * seq_logprobs.float()).sum() / response_lengths.float().mean().clamp(min=1.0),
        probs=q,
        expected_reward=(q * rewards.float()).sum(),
        kl=(q * (log_q - log_q_ref)).sum(),
        set_mass=torch.logsumexp(seq_logprobs.detach().float(), dim=0).exp(),
    )


def enumerated_listwise(
    seq_logprobs: Tensor,
    rewards: Tensor,
    ref_seq_logprobs: Tensor,
    beta: float,
    temperature: float = 1.0,
    set_mass_coef: float = 0.0,
) -> EnumeratedObjective:
    """The choice among one state's enumerated actions drawn to the KL-regularised best one: the
    cross-entropy from q* to the policy renormalised over the actions (ListNet's listwise loss with
    q* as the target list), instead of `enumerated_projection`'s to the policy itself.

    seq_logprobs (n,): log pi(a) of each action's whole response, with its graph; rewards (n,);
    ref_seq_logprobs (n,): the reference policy's.

    q* = softmax(log q_ref + R / beta) as in `enumerated_projection`, q = softmax(seq_logprobs / T) and
    J = sum_a q*(a) log q(a) + set_mass_coef * min(0, log m - log m_ref), m = sum_a pi(a). Its gradient
    in log pi(a) is (q*(a) - q(a)) / T, plus set_mass_coef * pi(a) / m where m fell below m_ref:
    - it moves only the choice. The projection's sum_a q*(a) log pi(a) is this first term plus log m,
      whose gradient raises every action by its share of m, the likeliest (a Manager's ADD) most; here
      a state where q already is q* pushes nothing, and one where q* wants a rare action pushes it up
      and the action q over-weighs down, each by the difference of the two shares;
    - the mass outside the actions (malformed replies) is not held by the first term: the second holds
      it where it fell below the reference's. There, at set_mass_coef 1, the gradient is q*(a): the
      projection's, without its division by the replies' mean length;
    - its maximiser is q = q* (tempered alike), whatever the mass, which the second term keeps at or
      above the reference's.
    """
    _require_rank(seq_logprobs, "seq_logprobs", 1, "(n,)")
    _require_same_shape(seq_logprobs=seq_logprobs, rewards=rewards, ref_seq_logprobs=ref_seq_logprobs)
    if temperature <= 0 or beta <= 0:
        raise ValueError(f"enumerated_listwise: temperature and beta must be > 0, got {temperature} and {beta}")
    if set_mass_coef < 0:
        raise ValueError(f"enumerated_listwise: set_mass_coef must be >= 0, got {set_mass_coef}")
    log_q_ref, target = kl_regularised_target(ref_seq_logprobs, rewards, beta, temperature)
    log_q = torch.log_softmax(seq_logprobs.float() / temperature, dim=0)
    log_set_mass = torch.logsumexp(seq_logprobs.float(), dim=0)
    mass_term = (log_set_mass - torch.logsumexp(ref_seq_logprobs.float(), dim=0)).clamp(max=0.0)
    q = log_q.detach().exp()
    return EnumeratedObjective(
        objective=(target * log_q).sum() + set_mass_coef * mass_term,
        probs=q,
        expected_reward=(q * rewards.float()).sum(),
        kl=(q * (log_q.detach() - log_q_ref)).sum(),
        set_mass=log_set_mass.detach().exp(),
    )


# --- rewards and advantages ------------------------------------------------------------------------


def outcome_to_token_rewards(scores: Tensor, response_mask: Tensor) -> Tensor:
    """Place each sequence's scalar reward on its last valid response token.

    scores: (bs,); response_mask: (bs, L) -> token rewards (bs, L), zero elsewhere. A row with no
    valid token gets no reward (there is no token to credit).
    """
    _require_rank(response_mask, "response_mask", 2, "(bs, L)")
    _require_rank(scores, "scores", 1, "(bs,)")
    if scores.shape[0] != response_mask.shape[0]:
        raise ValueError(f"scores has {scores.shape[0]} rows but response_mask has {response_mask.shape[0]}")
    positions = torch.arange(response_mask.shape[-1], device=response_mask.device)
    last = torch.where(response_mask.bool(), positions, -1).amax(dim=-1)  # -1 for an empty row
    at_last = positions.unsqueeze(0) == last.unsqueeze(1)
    return at_last.to(scores.dtype) * scores.unsqueeze(1)


@torch.no_grad()
def compute_gae(
    token_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over the valid tokens (verl semantics).

    token_rewards, values, response_mask: (bs, L) -> (advantages, returns), both (bs, L).

    The reverse scan steps over masked positions: for a valid token t whose next valid token is t',
    ``delta_t = r_t + gamma * V_t' - V_t`` and ``A_t = delta_t + gamma * lam * A_t'`` (V and A are 0
    after the last valid token), so rewards and values on masked positions are ignored.
    ``returns = A + V`` is taken before whitening; ``whiten`` (verl's default) then normalises the
    advantages over the mask. Both outputs are 0 on masked positions. No gradient flows.
    """
    _require_rank(response_mask, "response_mask", 2, "(bs, L)")
    _require_same_shape(token_rewards=token_rewards, values=values, response_mask=response_mask)
    rewards, values = token_rewards.float(), values.float()
    mask = response_mask.float()
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[-1])):
        valid = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        # A masked step carries the next valid token's value and advantage back unchanged.
        next_value = valid * values[:, t] + (1 - valid) * next_value
        next_advantage = valid * advantage + (1 - valid) * next_advantage
        advantages[:, t] = next_advantage
    returns = (advantages + values) * mask
    if whiten:
        advantages = masked_whiten(advantages, mask)
    return advantages * mask, returns


def _group_ids(group_index: Tensor | Sequence[Hashable], scores: Tensor) -> Tensor:
    if not isinstance(group_index, Tensor):
        ids: dict[Hashable, int] = {}
        group_index = torch.tensor([ids.setdefault(key, len(ids)) for key in group_index], dtype=torch.long)
    if group_index.shape != scores.shape:
        raise ValueError(f"group_index has shape {list(group_index.shape)} but scores has {list(scores.shape)}")
    return group_index.to(scores.device)


def group_advantages(
    scores: Tensor, group_index: Tensor | Sequence[Hashable], norm_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO outcome advantages: each score against the other samples of its group.

    scores: (bs,); group_index: (bs,) group ids (an integer tensor, or any hashables such as prompt
    uids) -> advantages (bs,), float32.

    ``A_i = (r_i - mean_g) / (std_g + eps)`` with the *unbiased* std (``torch.std``'s default, as
    verl uses); ``norm_by_std=False`` gives Dr. GRPO's ``A_i = r_i - mean_g``. A group of one sample
    has nothing to compare with and gets 0 (verl instead gives it the raw score), and so does a group
    whose scores are all equal.
    """
    _require_rank(scores, "scores", 1, "(bs,)")
    scores = scores.float()
    _, group, size = torch.unique(_group_ids(group_index, scores), return_inverse=True, return_counts=True)
    size = size.to(scores.dtype)
    mean = torch.zeros_like(size).index_add_(0, group, scores) / size
    deviation = scores - mean[group]  # exactly 0 in a group of one
    if not norm_by_std:
        return deviation
    squares = torch.zeros_like(size).index_add_(0, group, deviation.square())
    std = (squares / (size - 1).clamp(min=1)).sqrt()
    return deviation / (std[group] + eps)


def leave_one_out_advantages(scores: Tensor, group_index: Tensor | Sequence[Hashable]) -> Tensor:
    """RLOO advantages: each score against the mean of the *other* scores of its group.

    scores: (bs,); group_index: (bs,) group ids -> (bs,) float32. ``A_i = r_i - (S_g - r_i) / (n_g - 1)``
    ``= n_g / (n_g - 1) * (r_i - mean_g)``; a group of one sample gets 0.
    """
    _require_rank(scores, "scores", 1, "(bs,)")
    scores = scores.float()
    _, group, size = torch.unique(_group_ids(group_index, scores), return_inverse=True, return_counts=True)
    size = size.to(scores.dtype)
    total = torch.zeros_like(size).index_add_(0, group, scores)
    others = (size - 1)[group]
    return torch.where(others > 0, scores - (total[group] - scores) / others.clamp(min=1), torch.zeros_like(scores))


def groups_with_spread(scores: Tensor, group_index: Tensor | Sequence[Hashable]) -> Tensor:
    """Which rows belong to a group whose scores are not all equal: scores (bs,), group_index (bs,)
    -> (bs,) bool. A flat group's group-relative advantages are all 0 (DAPO's dynamic sampling drops it)."""
    _require_rank(scores, "scores", 1, "(bs,)")
    _, group = torch.unique(_group_ids(group_index, scores), return_inverse=True)
    groups = int(group.max()) + 1 if len(group) else 0
    high = torch.full((groups,), -torch.inf, device=scores.device).scatter_reduce(0, group, scores.float(), "amax")
    low = torch.full((groups,), torch.inf, device=scores.device).scatter_reduce(0, group, scores.float(), "amin")
    return (high > low)[group]


def overlong_penalty(response_lengths: Tensor, max_length: int, buffer_length: int, penalty_factor: float) -> Tensor:
    """DAPO's soft overlong punishment: response_lengths (bs,) -> reward added (bs,), float32, <= 0.

    With ``expected = max_length - buffer_length``, a response of length ``l`` gets
    ``min(0, -(l - expected) / buffer_length * penalty_factor)``: 0 up to ``expected``, then falling
    linearly to ``-penalty_factor`` at ``max_length``.
    """
    _require_rank(response_lengths, "response_lengths", 1, "(bs,)")
    if not 0 < buffer_length <= max_length:
        raise ValueError(f"buffer_length: must be in 1..{max_length} (the length cap), got {buffer_length}")
    excess = response_lengths.float() - (max_length - buffer_length)
    return (-excess / buffer_length * penalty_factor).clamp(max=0.0)


def broadcast_to_tokens(per_sequence: Tensor, response_mask: Tensor) -> Tensor:
    """Give every valid token its sequence's value: per_sequence (bs,), response_mask (bs, L) -> (bs, L)."""
    _require_rank(per_sequence, "per_sequence", 1, "(bs,)")
    _require_rank(response_mask, "response_mask", 2, "(bs, L)")
    if per_sequence.shape[0] != response_mask.shape[0]:
        raise ValueError(
            f"per_sequence has {per_sequence.shape[0]} rows but response_mask has {response_mask.shape[0]}"
        )
    return per_sequence.unsqueeze(1) * response_mask.to(per_sequence.dtype)


# --- losses ----------------------------------------------------------------------------------------


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: LossAggMode = "token-mean",
    denominator: LossDenominator | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate with dual clipping (the GRPO actor loss too).

    logprobs (with gradient), old_logprobs, advantages, response_mask: (bs, L) -> (loss, stats).

    Per token, with ``ratio = exp(logprobs - old_logprobs)``:
    ``l = max(-A * ratio, -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high))``, and for
    ``A < 0`` additionally ``l = min(l, -A * clip_ratio_c)``, which bounds the loss when a bad action
    became far likelier. The token losses are aggregated with `aggregate_loss` (over the mini-batch's
    `denominator` when given).

    stats (detached scalars): ``clip_frac`` (tokens where the clipped term is the larger),
    ``dual_clip_frac`` (negative-advantage tokens bounded by ``clip_ratio_c``), ``approx_kl``
    (k1 estimate of KL(old || new): the mean of ``old_logprobs - logprobs``).
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c: must be > 1.0 for dual clipping, got {clip_ratio_c}")
    _require_rank(response_mask, "response_mask", 2, "(bs, L)")
    _require_same_shape(
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, response_mask=response_mask
    )
    # Clamped like verl so that one wild token cannot overflow exp().
    log_ratio = (logprobs - old_logprobs).clamp(min=-20.0, max=20.0)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    ppo_losses = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    losses = torch.where(negative, torch.minimum(ppo_losses, dual_bound), ppo_losses)
    loss = aggregate_loss(losses, response_mask, loss_agg_mode, denominator=denominator)
    with torch.no_grad():
        stats = {
            "clip_frac": masked_mean((clipped > unclipped).float(), response_mask),
            "dual_clip_frac": masked_mean((negative & (ppo_losses > dual_bound)).float(), response_mask),
            "approx_kl": masked_mean(-log_ratio, response_mask),
        }
    return loss, stats


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    clip_range: float = 0.5,
    loss_agg_mode: LossAggMode = "token-mean",
    denominator: LossDenominator | None = None,
) -> tuple[Tensor, Tensor]:
    """Clipped critic loss.

    values (with gradient), old_values, returns, response_mask: (bs, L) -> (loss, clip_frac).

    ``clipped = old_values + clip(values - old_values, -clip_range, clip_range)``;
    per token ``0.5 * max((values - returns)^2, (clipped - returns)^2)``, aggregated with
    `aggregate_loss` (over `denominator` when given). ``clip_frac`` (detached) is the share of tokens where the clipped error is the
    larger.
    """
    _require_rank(response_mask, "response_mask", 2, "(bs, L)")
    _require_same_shape(values=values, old_values=old_values, returns=returns, response_mask=response_mask)
    clipped = old_values + (values - old_values).clamp(-clip_range, clip_range)
    unclipped_error = (values - returns).square()
    clipped_error = (clipped - returns).square()
    loss = 0.5 * aggregate_loss(torch.maximum(unclipped_error, clipped_error), response_mask, loss_agg_mode, denominator=denominator)
    with torch.no_grad():
        clip_frac = masked_mean((clipped_error > unclipped_error).float(), response_mask)
    return loss, clip_frac


def kl_in_reward(
    scores: Tensor, logprobs: Tensor, ref_logprobs: Tensor, response_mask: Tensor, kl_coef: float, kind: KLKind
) -> tuple[Tensor, Tensor]:
    """The outcome scores less the KL to the reference (verl's `use_kl_in_reward`), the KL then a cost
    the advantages see rather than a term of the loss.

    scores (bs,); logprobs (pi_old's, the sampled tokens'), ref_logprobs, response_mask (bs, L) ->
    (penalised scores (bs,), each response's summed KL estimate (bs,)): ``score - kl_coef * sum_t kl_t``
    over the valid tokens, ``kl_t`` the `kind` estimator (`kl_penalty`). verl subtracts ``kl_coef *
    kl_t`` from each token's reward; an outcome advantage (GRPO's) reads their sum, which is this.
    """
    _require_rank(response_mask, "response_mask", 2, "(bs, L)")
    _require_rank(scores, "scores", 1, "(bs,)")
    kl = (kl_penalty(logprobs, ref_logprobs, kind) * response_mask.to(logprobs.dtype)).sum(dim=-1)
    return scores - kl_coef * kl.to(scores.dtype), kl


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: KLKind) -> Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens' log-probabilities.

    logprobs, ref_logprobs: (bs, L) -> (bs, L). With ``log_r = logprobs - ref_logprobs``:

    - ``k1``: ``log_r`` (unbiased, high variance, can be negative);
    - ``k2``: ``0.5 * log_r^2``;
    - ``k3`` / ``low_var_kl``: ``exp(-log_r) + log_r - 1`` (unbiased, never negative), clamped to
      [-10, 10] as verl does, with ``-log_r`` first clamped to [-20, 20] against overflow;
    - ``abs``: ``|log_r|``.
    """
    _require_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    log_ratio = logprobs - ref_logprobs
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind in ("k3", "low_var_kl"):
        ref_minus_policy = (-log_ratio).clamp(min=-20.0, max=20.0)
        return (ref_minus_policy.exp() - ref_minus_policy - 1).clamp(min=-10.0, max=10.0)
    if kind == "abs":
        return log_ratio.abs()
    raise ValueError(f"kl kind: unknown estimator {kind!r}; expected one of {KL_KINDS}")


# --- logits ----------------------------------------------------------------------------------------


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the categorical distribution at each position: (bs, L, V) -> (bs, L), float32.

    Computed as ``-sum p * log_softmax`` (no exp of raw logits, so large logits are safe); tokens with
    probability 0 (``-inf`` logits) contribute 0 instead of ``0 * -inf = nan``.
    """
    _require_rank(logits, "logits", 3, "(bs, L, V)")
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    probs = log_probs.exp()
    return -(probs * torch.where(probs > 0, log_probs, torch.zeros_like(log_probs))).sum(dim=-1)


def logprobs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """Log-probability of each label: logits (bs, L, V), labels (bs, L) int -> (bs, L), float32.

    The logits must already be aligned with the labels (position t predicts labels[:, t]).
    """
    _require_rank(logits, "logits", 3, "(bs, L, V)")
    if logits.shape[:2] != labels.shape:
        raise ValueError(f"logits has shape {list(logits.shape)} but labels has {list(labels.shape)}; expected (bs, L)")
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return log_probs.gather(dim=-1, index=labels.long().unsqueeze(-1)).squeeze(-1)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """Critic quality ``1 - Var(returns - values) / Var(returns)`` over the mask; a scalar.

    values, returns, mask: (bs, L). 1 is a perfect critic, 0 no better than a constant, negative
    worse; NaN when the returns do not vary (the ratio is undefined). No gradient flows.
    """
    _require_same_shape(values=values, returns=returns, mask=mask)
    with torch.no_grad():
        returns_var = masked_var(returns.float(), mask)
        residual_var = masked_var((returns - values).float(), mask)
        return torch.where(returns_var > 0, 1 - residual_var / returns_var, torch.full_like(returns_var, float("nan")))
