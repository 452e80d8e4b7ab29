"""The typed config groups: one dataclass per group that the code reads as an object, named by the
group's `_target_`, so every field is a config key, every key a field, and each default is set once
(in the group's YAML; the dataclass defaults are the same values, for library users).

Nothing here imports torch or a model: `memr1.preflight` instantiates these right after Hydra composes
a config, so a misspelt or unknown key fails in about a second with its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ALGORITHMS = ("ppo", "grpo", "sft")  # sft: memr1.modules.sft
BASELINES = ("group", "none")
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSS_AGG_MODES: tuple[str, ...] = LossAggMode.__args__  # type: ignore[attr-defined]


@dataclass
class AlgoConfig:
    """PPO / GRPO / SFT hyper-parameters (`algo` group); defaults are the paper's (verl's) unless a
    comment in conf/algo says why not. How long a response may be is the agent's (`max_new_tokens` of
    `answer` / `manager`), not the algorithm's: rollouts, validation and evaluation decode alike."""

    name: str = "grpo"
    group_size: int = 5              # GRPO samples per state (PPO: 1)
    temperature: float = 1.0         # rollout temperature (evaluation is greedy)
    top_p: float = 1.0
    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    weight_decay: float = 0.01
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0        # dual-clip bound for negative advantages
    value_clip: float = 0.5
    gamma: float = 1.0
    lam: float = 1.0
    kl_coef: float = 0.001           # GRPO: KL to the reference policy in the loss
    kl_kind: str = "low_var_kl"      # verl's k3
    entropy_coef: float = 0.0
    norm_adv_by_std: bool = True     # False: Dr. GRPO
    baseline: str = "group"          # GRPO's group mean; "none": the reward itself (counterfactual credit)
    loss_agg_mode: str = "token-mean"
    ppo_epochs: int = 1
    mini_batch_size: int = 0         # sequences per optimiser step; 0 = the whole rollout batch
    micro_batch_size: int = 2        # sequences per forward/backward (gradient accumulation)
    grad_clip: float = 1.0
    share_prompt: bool = True        # a GRPO group's prompt forwarded once, its KV cache shared
    reuse_frozen_trunk: bool = True  # the layers below the adapters run once per token (memr1.llm.trunk)

    def __post_init__(self) -> None:
        if self.name not in ALGORITHMS:
            raise ValueError(f"algo.name: {self.name!r} is not one of {ALGORITHMS}")
        if self.name == "grpo" and self.group_size < 2:
            raise ValueError(f"algo.group_size: GRPO needs at least 2 samples per state, got {self.group_size}")
        if self.micro_batch_size < 1:
            raise ValueError(f"algo.micro_batch_size: must be >= 1, got {self.micro_batch_size}")
        if self.baseline not in BASELINES:
            raise ValueError(f"algo.baseline: {self.baseline!r} is not one of {BASELINES}")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"algo.loss_agg_mode: {self.loss_agg_mode!r} is not one of {LOSS_AGG_MODES}")


@dataclass(frozen=True)
class AnswerConfig:
    """The Answer Agent (`answer` group), the same for training and evaluation: its policy, how it
    retrieves, prompts, decodes and parses."""

    ckpt: str | None = None          # its policy export (null: the base model); training starts from it
    distill: bool = True             # false: answer directly from all memories (the no-distill ablation)
    k_per_speaker: int = 30          # memories retrieved per speaker (the paper: 30, 60 in all)
    max_answer_words: int = 6
    max_new_tokens: int = 256        # room for the distilled memories before **Answer:**
    batch_size: int = 8              # prompts decoded together

    def __post_init__(self) -> None:
        for key in ("k_per_speaker", "max_answer_words", "max_new_tokens", "batch_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"answer.{key}: must be >= 1, got {getattr(self, key)}")


@dataclass(frozen=True)
class ManagerConfig:
    """The Memory Manager (`manager` group), the same for training and for building banks: its policy,
    the candidates it is shown and how it decodes."""

    ckpt: str | None = None          # its policy export (null: the prompted base model)
    num_candidates: int = 5          # similar memories shown with temporary ids (Mem0: 5)
    max_new_tokens: int = 128        # one JSON operation
    batch_size: int = 8              # facts decided together (one per conversation while banks build)

    def __post_init__(self) -> None:
        for key in ("num_candidates", "max_new_tokens", "batch_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"manager.{key}: must be >= 1, got {getattr(self, key)}")


BANK_POLICIES = ("add_all", "manager")


@dataclass(frozen=True)
class BanksConfig:
    """Who writes the banks and where they are kept (`banks` group); with `memory` (what they are built
    from) it is the bank recipe (`memr1.banks.recipe`)."""

    policy: str = "add_all"          # add_all | manager (the `manager` agent decides each fact)
    dir: str = "banks"               # built banks are kept here and reused by every identical recipe
    uri: str | None = None           # null: a Milvus Lite file under dir; or http://host:port for a server
    lock_wait_s: float = 1800.0      # wait this long for another process building or loading them

    def __post_init__(self) -> None:
        if self.policy not in BANK_POLICIES:
            raise ValueError(f"banks.policy: {self.policy!r} is not one of {BANK_POLICIES}")
