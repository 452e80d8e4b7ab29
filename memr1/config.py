"""The typed config groups: one dataclass per group that the code reads as an object, named by the
group's `_target_`, so every field is a config key, every key a field, and each default is set once
(in the group's YAML; the dataclass defaults are the same values, for library users).

Nothing here imports torch or a model: `memr1.preflight` instantiates these right after Hydra composes
a config, so a misspelt or unknown key fails in about a second with its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from memr1.types import ADD_TEXTS

LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSS_AGG_MODES: tuple[str, ...] = LossAggMode.__args__  # type: ignore[attr-defined]
KLKind = Literal["k1", "k2", "k3", "low_var_kl", "abs"]
KL_KINDS: tuple[str, ...] = KLKind.__args__  # type: ignore[attr-defined]
# The `algo` group's dataclass is memr1.rl.algorithms.AlgoConfig: it asks the registry of algorithms
# there which settings each one reads.


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
    the candidates it is shown, how it decodes and what its ADD stores."""

    ckpt: str | None = None          # its policy export (null: the prompted base model)
    num_candidates: int = 5          # similar memories shown with temporary ids (Mem0: 5)
    max_new_tokens: int = 128        # one JSON operation
    batch_size: int = 8              # facts decided together (one per conversation while banks build)
    add_text: str = "fact"           # what an ADD stores: the fact as given, or the model's text (Mem0's); memr1.agents.manager

    def __post_init__(self) -> None:
        for key in ("num_candidates", "max_new_tokens", "batch_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"manager.{key}: must be >= 1, got {getattr(self, key)}")
        if self.add_text not in ADD_TEXTS:
            raise ValueError(f"manager.add_text: {self.add_text!r} is not one of {ADD_TEXTS}")


BANK_POLICIES = ("add_all", "manager", "oracle")
ORACLE_REWARDS = ("em", "f1")


@dataclass(frozen=True)
class OracleConfig:
    """The search that decides an oracle's banks (`banks=oracle`): the search teacher's tie rule
    (memr1/search_teacher.py) over the reward of the answers to the split's own questions."""

    reward: str = "f1"               # em | f1: what each option's answers are scored by
    min_margin: float = 0.1          # ADD stays unless an option beats it by more (or the answerer's own variation)
    drop_factor: float = 2.0         # NONE / DELETE, which keep none of the fact, must beat ADD by this x the margin

    def __post_init__(self) -> None:
        if self.reward not in ORACLE_REWARDS:
            raise ValueError(f"banks.oracle.reward: {self.reward!r} is not one of {ORACLE_REWARDS}")
        if self.min_margin < 0 or self.drop_factor < 1:
            raise ValueError(f"banks.oracle: min_margin must be >= 0 and drop_factor >= 1, got {self.min_margin}, {self.drop_factor}")


@dataclass(frozen=True)
class BanksConfig:
    """Who writes the banks and where they are kept (`banks` group); with `memory` (what they are built
    from) it is the bank recipe (`memr1.banks.recipe`)."""

    policy: str = "add_all"          # add_all | manager (the `manager` agent decides each fact) | oracle (an upper bound)
    dir: str = "banks"               # built banks are kept here and reused by every identical recipe
    uri: str | None = None           # null: a Milvus Lite file under dir; http://host:port: a server; ":memory:": in the process only
    lock_wait_s: float = 1800.0      # wait this long for another process building or loading them
    embedder: str | None = None      # sentence-transformers model of memories and queries; null: all-MiniLM-L6-v2
    oracle: OracleConfig | None = None  # banks=oracle's search; set by that config alone

    def __post_init__(self) -> None:
        if self.policy not in BANK_POLICIES:
            raise ValueError(f"banks.policy: {self.policy!r} is not one of {BANK_POLICIES}")
        if (self.policy == "oracle") != (self.oracle is not None):
            raise ValueError(
                f"banks.oracle: the oracle's search settings go with banks=oracle and only with it "
                f"(banks.policy={self.policy}, banks.oracle={'set' if self.oracle is not None else 'missing'})"
            )
