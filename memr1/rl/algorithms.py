"""The algorithms memr1 trains with, one object each in one registry (verl's `register_adv_est`):
GRPO, Dr. GRPO, RLOO, REINFORCE, PPO, the enumerated policy gradient and Memory-SFT.

An algorithm owns what sets it apart: how many responses it samples per state, whether it needs a
critic or a reference policy, how it turns rewards into advantages, which settings of `AlgoConfig` it
reads, and the checks on them. Nothing else branches on `algo.name`: the RL module asks the algorithm.

This file imports no torch (the advantages load `memr1.rl.core` when called), so `memr1.preflight`
instantiates `AlgoConfig` and refuses a bad setting in about a second, before any model loads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from memr1.config import KL_KINDS, LOSS_AGG_MODES
from memr1.rl import policy_losses

if TYPE_CHECKING:
    from torch import Tensor


@dataclass
class FilterGroups:
    """DAPO's dynamic sampling (verl: `algorithm.filter_groups`): a group whose rewards are all equal
    has zero advantage and teaches nothing; with `enable`, such groups are dropped and more states are
    rolled out until the step has as many groups with spread as it asked for, or `max_num_gen_batches`
    rollout batches were drawn (0: no cap)."""

    enable: bool = False
    max_num_gen_batches: int = 4

    def __post_init__(self) -> None:
        if self.max_num_gen_batches < 0:
            raise ValueError(f"algo.filter_groups.max_num_gen_batches: must be >= 0, got {self.max_num_gen_batches}")


@dataclass
class OverlongBuffer:
    """DAPO's overlong reward shaping (verl: `reward_model.overlong_buffer`): a response longer than
    `max_new_tokens - len` loses `penalty_factor` x (its excess / `len`) of reward, growing linearly to
    `penalty_factor` at the cap, so that length is discouraged before the cut, not punished by it."""

    enable: bool = False
    len: int = 16
    penalty_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.len < 1:
            raise ValueError(f"algo.overlong_buffer.len: must be >= 1, got {self.len}")
        if self.penalty_factor < 0:
            raise ValueError(f"algo.overlong_buffer.penalty_factor: must be >= 0, got {self.penalty_factor}")


@dataclass
class AlgoConfig:
    """The `algo` group: which algorithm (`name`, a key of `ALGORITHMS`) and its hyper-parameters;
    defaults are the paper's (verl's) unless a comment in memr1/conf/algo says why not. How long a response
    may be is the agent's (`max_new_tokens` of `answer` / `manager`). A setting the chosen algorithm
    does not read is listed in its `ignores`; `memr1.preflight` refuses it on the command line."""

    name: str = "grpo"
    group_size: int = 5              # samples per state of the group algorithms
    temperature: float = 1.0         # rollout temperature (evaluation is greedy)
    top_p: float = 1.0
    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    weight_decay: float = 0.01
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0        # dual-clip bound for negative advantages
    policy_loss: str = "vanilla"     # a module of memr1.rl.policy_losses, or a dotted module path
    value_clip: float = 0.5
    gamma: float = 1.0
    lam: float = 1.0
    kl_coef: float = 0.001           # KL to the reference policy in the loss
    kl_kind: str = "low_var_kl"      # verl's k3
    kl_in_reward: bool = False       # the KL as a cost in the reward (verl's use_kl_in_reward), not in the loss
    entropy_coef: float = 0.0
    loss_agg_mode: str = "token-mean"
    ppo_epochs: int = 1
    mini_batch_size: int = 0         # sequences per optimiser step; 0 = the whole rollout batch
    micro_batch_size: int = 2        # sequences per forward/backward (gradient accumulation)
    grad_clip: float = 1.0
    share_prompt: bool = True        # a group's prompt forwarded once, its KV cache shared
    reuse_frozen_trunk: bool = True  # the layers below the adapters run once per token (memr1.llm.trunk)
    operation_temperature: float = 1.0  # algo=enumerated: q = softmax(log pi(reply) / T) over a state's operations
    set_mass_coef: float = 0.0          # algo=enumerated: weight of the operations' total probability lost below the reference's
    operation_objective: str = "expected"  # algo=enumerated: "expected" (the gradient of E_q[R]), "projection" or "listwise" (toward q*)
    projection_beta: float = 0.1        # algo=enumerated, projection and listwise: q* = softmax(log q_ref / T + R / beta)
    change_margin: float = 0.0          # algo=enumerated: each operation's reward less this x what it must beat ADD by under the search's rule
    taught_sampling_alpha: float = 1.0  # algo=enumerated: the search's taught kinds drawn in proportion to their states ** alpha (1: uniform)
    # algo=sft on the Manager: each teacher target's weight in the loss by its operation (OPERATION_NAMES; unnamed: 1)
    operation_weights: dict[str, float] = field(default_factory=dict)
    filter_groups: FilterGroups = field(default_factory=FilterGroups)
    overlong_buffer: OverlongBuffer = field(default_factory=OverlongBuffer)

    def __post_init__(self) -> None:
        # Hydra hands the nested groups over as mappings.
        if isinstance(self.filter_groups, Mapping):
            self.filter_groups = _nested(FilterGroups, "filter_groups", self.filter_groups)
        if isinstance(self.overlong_buffer, Mapping):
            self.overlong_buffer = _nested(OverlongBuffer, "overlong_buffer", self.overlong_buffer)
        self.operation_weights = {str(name): float(weight) for name, weight in dict(self.operation_weights).items()}
        if self.name not in ALGORITHMS:
            raise ValueError(f"algo.name: {self.name!r} is not one of {tuple(ALGORITHMS)}")
        if self.micro_batch_size < 1:
            raise ValueError(f"algo.micro_batch_size: must be >= 1, got {self.micro_batch_size}")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"algo.loss_agg_mode: {self.loss_agg_mode!r} is not one of {LOSS_AGG_MODES}")
        self.algorithm.validate(self)

    @property
    def algorithm(self) -> Algorithm:
        return ALGORITHMS[self.name]


def _nested(schema: type, key: str, values: Mapping[str, Any]) -> Any:
    known = {f.name for f in fields(schema)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"algo.{key}.{unknown[0]}: no such key; the keys are {', '.join(sorted(known))}")
    return schema(**dict(values))


class Algorithm:
    """One training algorithm. Subclasses set the class attributes and, where they differ, override
    the methods; `register` adds an instance to `ALGORITHMS` under `name`."""

    name: ClassVar[str]
    title: ClassVar[str]            # how messages name it
    # The settings of AlgoConfig it does not read, each with the reason, which the refusal quotes.
    ignores: ClassVar[Mapping[str, str]] = {}
    trains_on_rollouts: ClassVar[bool] = True   # False: no sampled rollouts (Memory-SFT, the enumerated gradient)
    # True: every action of a state is scored and weighed by its probability (the Manager's operations,
    # `memr1.modules.enumerated`) instead of sampled.
    enumerates_actions: ClassVar[bool] = False
    needs_critic: ClassVar[bool] = False
    # A group whose rewards are all equal has zero advantage (what dynamic sampling drops). False where
    # a reward is its own advantage, so a per-state constant (counterfactual credit) survives.
    flat_groups_are_zero: ClassVar[bool] = True

    def samples_per_state(self, algo: AlgoConfig) -> int:
        return algo.group_size if "group_size" not in self.ignores else 1

    def uses_reference(self, algo: AlgoConfig) -> bool:
        """A KL term to a frozen reference policy is in the loss."""
        return "kl_coef" not in self.ignores and algo.kl_coef > 0

    def validate(self, algo: AlgoConfig) -> None:
        """Refuse values that cannot work with this algorithm (a ValueError naming the key)."""
        if "group_size" not in self.ignores and algo.group_size < 2:
            raise ValueError(f"algo.group_size: {self.title} compares the samples of a state, it needs at least 2; got {algo.group_size}")
        if "kl_kind" not in self.ignores and algo.kl_kind not in KL_KINDS:
            raise ValueError(f"algo.kl_kind: {algo.kl_kind!r} is not one of {KL_KINDS}")
        if "kl_in_reward" not in self.ignores and algo.kl_in_reward and algo.kl_coef <= 0:
            raise ValueError("algo.kl_in_reward=true: the KL's weight is algo.kl_coef, which is 0; set it > 0")
        if self.trains_on_rollouts and algo.ppo_epochs < 1:
            raise ValueError(f"algo.ppo_epochs: must be >= 1, got {algo.ppo_epochs}")
        if "policy_loss" not in self.ignores:
            policy_losses.check(algo.policy_loss)

    def advantages(
        self,
        scores: Tensor,
        response_mask: Tensor,
        group_ids: Tensor,
        values: Tensor | None,
        algo: AlgoConfig,
        sum_over_ranks: Callable[[Tensor], Tensor] = lambda tensor: tensor,
    ) -> tuple[Tensor, Tensor | None]:
        """Per-token advantages `(bs, L)` and, for a critic, its returns `(bs, L)` (else None), from
        the outcome scores `(bs,)`, the response mask `(bs, L)`, each row's group `(bs,)` and the
        critic's values `(bs, L)` (None without a critic). `sum_over_ranks`: sums a tensor over the
        data-parallel ranks, for a statistic of the whole batch (PPO's whitening); groups never
        span ranks."""
        from memr1.rl import core  # torch loads here, never in the preflight

        return core.broadcast_to_tokens(self.sequence_advantages(scores, group_ids, core), response_mask), None

    def sequence_advantages(self, scores: Tensor, group_ids: Tensor, core: Any) -> Tensor:
        """One advantage per sequence `(bs,)` (outcome algorithms)."""
        raise NotImplementedError(f"{self.title} has no outcome advantage")


ALGORITHMS: dict[str, Algorithm] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    if cls.name in ALGORITHMS:
        raise ValueError(f"algorithm {cls.name!r} is registered twice")
    ALGORITHMS[cls.name] = cls()
    return cls


_SAMPLES = "it samples its responses; the objective over enumerated operations is algo=enumerated's"
ENUMERATED_KEYS = {key: _SAMPLES for key in ("operation_temperature", "set_mass_coef", "operation_objective", "projection_beta", "change_margin", "taught_sampling_alpha")}
_NO_CRITIC = "it has no critic (PPO's)"
CRITIC_KEYS = {key: _NO_CRITIC for key in ("critic_lr", "value_clip", "gamma", "lam")}
_ONE_SAMPLE = "it samples one response per state and has no group"
GROUP_KEYS = {key: _ONE_SAMPLE for key in ("group_size", "share_prompt", "filter_groups")}
_NO_ROLLOUT = "it trains on the teacher's targets: no rollout, no reward, no policy ratio"
_OWN_RESPONSES = "it learns from its own responses; weighing the teacher's targets is algo=sft's"
SFT_KEYS = {"operation_weights": _OWN_RESPONSES}
RL_KEYS = {
    key: _NO_ROLLOUT
    for key in (
        "temperature", "top_p", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "kl_coef", "kl_kind",
        "entropy_coef", "ppo_epochs", "mini_batch_size", "reuse_frozen_trunk", "overlong_buffer", "policy_loss",
        "kl_in_reward",
    )
}


@register
class GRPO(Algorithm):
    """G samples per state; each reward against its group's mean, divided by the group's std."""

    name, title = "grpo", "GRPO"
    ignores = {**CRITIC_KEYS, **ENUMERATED_KEYS, **SFT_KEYS}

    def sequence_advantages(self, scores: Tensor, group_ids: Tensor, core: Any) -> Tensor:
        return core.group_advantages(scores, group_ids, norm_by_std=True)


@register
class DrGRPO(GRPO):
    """Dr. GRPO (Liu et al. 2025): the group mean without the std scaling, and a loss that is not
    divided by each response's length (`seq-mean-token-sum-norm`, a constant length)."""

    name, title = "dr_grpo", "Dr. GRPO"

    def validate(self, algo: AlgoConfig) -> None:
        super().validate(algo)
        if algo.loss_agg_mode not in ("seq-mean-token-sum-norm", "seq-mean-token-sum"):
            raise ValueError(
                f"algo.loss_agg_mode={algo.loss_agg_mode}: Dr. GRPO does not normalise by response length; "
                "use seq-mean-token-sum-norm (its default) or seq-mean-token-sum"
            )

    def sequence_advantages(self, scores: Tensor, group_ids: Tensor, core: Any) -> Tensor:
        return core.group_advantages(scores, group_ids, norm_by_std=False)


@register
class RLOO(GRPO):
    """REINFORCE leave-one-out (Ahmadian et al. 2024): each reward against the mean of the other
    samples of its state."""

    name, title = "rloo", "RLOO"

    def sequence_advantages(self, scores: Tensor, group_ids: Tensor, core: Any) -> Tensor:
        return core.leave_one_out_advantages(scores, group_ids)


@register
class Reinforce(GRPO):
    """REINFORCE with the environment's own baseline: the reward is the advantage. For
    `model.credit=counterfactual`, whose reward is already measured against doing nothing (NOOP); a
    group baseline would cancel that per-state constant."""

    name, title = "reinforce", "REINFORCE"
    ignores = {**CRITIC_KEYS, **ENUMERATED_KEYS, **SFT_KEYS, "filter_groups": "its advantage is the reward itself: a flat group still has a gradient"}
    flat_groups_are_zero = False

    def sequence_advantages(self, scores: Tensor, group_ids: Tensor, core: Any) -> Tensor:
        return scores.float()


@register
class PPO(Algorithm):
    """PPO with a critic: one sample per state, GAE over the critic's values, no KL term in the loss
    (verl's PPO default)."""

    name, title = "ppo", "PPO"
    ignores = {
        **GROUP_KEYS, **ENUMERATED_KEYS, **SFT_KEYS,
        "kl_coef": "it puts no KL term in its loss (verl's PPO)", "kl_kind": "it puts no KL term in its loss (verl's PPO)",
        "kl_in_reward": "it has no KL term (verl's PPO)",
    }
    needs_critic = True

    def advantages(
        self,
        scores: Tensor,
        response_mask: Tensor,
        group_ids: Tensor,
        values: Tensor | None,
        algo: AlgoConfig,
        sum_over_ranks: Callable[[Tensor], Tensor] = lambda tensor: tensor,
    ) -> tuple[Tensor, Tensor | None]:
        from memr1.rl import core

        if values is None:
            raise ValueError("PPO's advantages need the critic's values")
        mask = response_mask.float()
        token_rewards = core.outcome_to_token_rewards(scores, mask)
        advantages, returns = core.compute_gae(token_rewards, values, mask, gamma=algo.gamma, lam=algo.lam, whiten=False)
        # Whitened over the whole batch, every rank's rows (verl whitens the batch on its driver): the
        # same advantages however the rows are split over processes.
        moments = sum_over_ranks(core.masked_moments(advantages, mask))
        return core.whiten_with_moments(advantages, moments) * mask, returns


OPERATION_OBJECTIVES = ("expected", "projection", "listwise")
# The objectives drawn to the KL-regularised best policy q* (`core.enumerated_projection`, `core.enumerated_listwise`).
TARGET_OBJECTIVES = ("projection", "listwise")
_NOTHING_SAMPLED = "it samples nothing: every operation of a state is weighed by its probability"
_EXACT_STEP = "one exact gradient step per batch: no policy ratio, no mini-batches"


@register
class Enumerated(Algorithm):
    """The exact policy gradient over the Memory Manager's operations (`core.enumerated_objective`):
    every operation of a state (NONE, ADD, and UPDATE / DELETE of each candidate, as `teacher=search`
    enumerates and scores them) weighed by the policy's probability, renormalised over them. An
    operation the policy almost never samples (a 135M Manager's UPDATE) still gets its gradient; the
    KL to the reference is exact over the same operations."""

    name, title = "enumerated", "the enumerated policy gradient"
    ignores = {
        **CRITIC_KEYS, **SFT_KEYS,
        "group_size": _NOTHING_SAMPLED, "filter_groups": _NOTHING_SAMPLED, "temperature": _NOTHING_SAMPLED,
        "top_p": _NOTHING_SAMPLED, "overlong_buffer": _NOTHING_SAMPLED,
        "clip_ratio_low": _EXACT_STEP, "clip_ratio_high": _EXACT_STEP, "clip_ratio_c": _EXACT_STEP,
        "ppo_epochs": _EXACT_STEP, "mini_batch_size": _EXACT_STEP, "policy_loss": _EXACT_STEP,
        "micro_batch_size": "a state's operations are one forward (they share its prompt)",
        "kl_kind": "its KL is exact over the enumerated operations, not an estimator",
        "kl_in_reward": "its KL is exact over the enumerated operations, in its objective",
        "entropy_coef": "it has no entropy bonus",
        "loss_agg_mode": "its objective is one expected reward per state, not a sum over tokens",
        "reuse_frozen_trunk": "it scores fixed responses; the frozen trunk is recorded by sampling",
    }
    trains_on_rollouts = False
    enumerates_actions = True

    def samples_per_state(self, algo: AlgoConfig) -> int:
        return 1

    def uses_reference(self, algo: AlgoConfig) -> bool:
        """Its KL, the set-mass term and q*, the target of the projection and the listwise loss, all read the
        reference's log-probs."""
        return algo.kl_coef > 0 or algo.set_mass_coef > 0 or algo.operation_objective in TARGET_OBJECTIVES

    def validate(self, algo: AlgoConfig) -> None:
        super().validate(algo)
        if algo.kl_coef < 0:
            raise ValueError(f"algo.kl_coef: must be >= 0, got {algo.kl_coef}")
        if algo.operation_temperature <= 0:
            raise ValueError(f"algo.operation_temperature: must be > 0, got {algo.operation_temperature}")
        if algo.set_mass_coef < 0:
            raise ValueError(f"algo.set_mass_coef: must be >= 0, got {algo.set_mass_coef}")
        if algo.change_margin < 0:
            raise ValueError(f"algo.change_margin: must be >= 0, got {algo.change_margin}")
        if not 0 <= algo.taught_sampling_alpha <= 1:
            raise ValueError(
                f"algo.taught_sampling_alpha: must be in [0, 1] (1 draws states uniformly, 0 every taught kind alike), "
                f"got {algo.taught_sampling_alpha}"
            )
        if algo.operation_objective not in OPERATION_OBJECTIVES:
            raise ValueError(f"algo.operation_objective: {algo.operation_objective!r} is not one of {OPERATION_OBJECTIVES}")
        if algo.operation_objective in TARGET_OBJECTIVES:
            if algo.projection_beta <= 0:
                raise ValueError(f"algo.projection_beta: must be > 0, got {algo.projection_beta}")
        if algo.operation_objective == "projection" and (algo.set_mass_coef > 0 or algo.kl_coef > 0):
            raise ValueError(
                "algo.operation_objective=projection: its target already weighs the reward against the reference "
                "(projection_beta) and keeps the operations' mass; set algo.set_mass_coef=0 and algo.kl_coef=0"
            )
        if algo.operation_objective == "listwise" and algo.kl_coef > 0:
            raise ValueError(
                "algo.operation_objective=listwise: its target already weighs the reward against the reference "
                "(projection_beta); set algo.kl_coef=0 (algo.set_mass_coef holds the operations' mass)"
            )


# The Manager's operations as algo.operation_weights names them (OpKind's values, lower case).
OPERATION_NAMES = ("add", "update", "delete", "noop")


@register
class SFT(Algorithm):
    """Memory-SFT: the negative log-likelihood of the teacher's targets (`memr1.modules.sft`), each
    target's weighed by its operation where `operation_weights` says (the Manager's)."""

    name, title = "sft", "Memory-SFT"
    ignores = {**CRITIC_KEYS, **GROUP_KEYS, **RL_KEYS, **{key: _NO_ROLLOUT for key in ENUMERATED_KEYS}}
    trains_on_rollouts = False

    def validate(self, algo: AlgoConfig) -> None:
        super().validate(algo)
        for name, weight in algo.operation_weights.items():
            if name not in OPERATION_NAMES:
                raise ValueError(f"algo.operation_weights.{name}: not an operation; the operations are {', '.join(OPERATION_NAMES)}")
            if not math.isfinite(weight) or weight < 0:
                raise ValueError(f"algo.operation_weights.{name}: must be a finite weight >= 0, got {weight}")
