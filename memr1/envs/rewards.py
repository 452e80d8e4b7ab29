"""The rewards of both environments: what an answer earns, and the weights that make a reward of an
environment's outcomes (`reward_weights`: the format penalty and the credit, in one place).

The paper's reward is exact match (EM) of the final answer against the gold answer. Ours normalises both
sides the SQuAD way before comparing (lower case, no punctuation, no articles a / an / the), so that
"The park." earns the reward for gold "park": that normalisation is our choice, the paper says EM only.
The reported metrics stay the protocol's (`memr1.metrics`); only the training signal is lenient.

Kinds: "em" (the default), "f1" (token F1 of the Mem0 protocol, a denser signal), and "judge" (an
LLM judge's CORRECT = 1 / WRONG = 0), which needs a `Judge` and is scored in one batch by
`answer_rewards`.
"""

from __future__ import annotations

from collections.abc import Sequence

from memr1.metrics.judge import Judge
from memr1.metrics.lexical import exact_match, token_f1

REWARD_KINDS: tuple[str, ...] = ("em", "f1", "judge")
# The Manager's credit: "outcome" (the paper: the answers' score) or "counterfactual" (memr1's: minus the
# score of the same state under NOOP, the term "noop", so an operation is credited for what it changed).
CREDITS = ("outcome", "counterfactual")
CREDIT_TERMS = ("noop",)  # the terms a credit adds; `Reward.score_without(*CREDIT_TERMS)` is the outcome


def reward_weights(format_penalty: float, credit: str = "outcome") -> dict[str, float]:
    """The weight of each `Reward` term: the answers' score 1, a malformed (or refused) response
    `format_penalty` (<= 0), and under counterfactual credit the state's NOOP score -1.

    reward_weights(-0.1, "counterfactual") == {"answer": 1.0, "noop": -1.0, "malformed": -0.1}
    """
    if not format_penalty <= 0:
        raise ValueError(f"format_penalty: must be <= 0 (it is added to the reward of a malformed response), got {format_penalty}")
    if credit not in CREDITS:
        raise ValueError(f"credit: {credit!r} is not one of {CREDITS}")
    credited = {"noop": -1.0} if credit == "counterfactual" else {}
    return {"answer": 1.0, **credited, "malformed": format_penalty}


def answer_reward(pred: str, gold: str, kind: str = "em") -> float:
    """The reward of answer `pred` for gold answer `gold`, in [0, 1].

    "em": 1.0 when `normalize_answer(pred) == normalize_answer(gold)` (SQuAD normalisation, our choice;
    the paper's reward is plain EM), so answer_reward("The park.", "park") == 1.0.
    "f1": token F1 over token sets, answer_reward("a dog named Rex", "Rex") == 0.4.
    "judge" needs a model: use `answer_rewards` with a `Judge`.
    """
    if kind == "em":
        return exact_match(pred, gold, normalized=True)
    if kind == "f1":
        return token_f1(pred, gold)
    if kind == "judge":
        raise ValueError("answer_reward: kind 'judge' needs a Judge; score it with answer_rewards(..., judge=...)")
    raise ValueError(f"answer_reward: unknown kind {kind!r}; expected one of {REWARD_KINDS}")


def check_reward(kind: str, judge: Judge | None) -> None:
    """Raise ValueError unless `kind` is a reward kind and a judge is given exactly when it needs one."""
    if kind not in REWARD_KINDS:
        raise ValueError(f"reward: unknown kind {kind!r}; expected one of {REWARD_KINDS}")
    if kind == "judge" and judge is None:
        raise ValueError("reward='judge' needs judge= (a memr1.metrics.judge.Judge)")


def answer_rewards(
    questions: Sequence[str], preds: Sequence[str], golds: Sequence[str], kind: str, judge: Judge | None = None
) -> list[float]:
    """`answer_reward` of each (pred, gold); with kind "judge", one batched call of `judge`, where an
    unreadable verdict counts as WRONG (0.0)."""
    check_reward(kind, judge)
    if not (len(questions) == len(preds) == len(golds)):
        raise ValueError(
            f"answer_rewards: {len(questions)} questions, {len(preds)} predictions, {len(golds)} golds must align"
        )
    if kind == "judge":
        assert judge is not None  # check_reward
        return [1.0 if verdict.correct else 0.0 for verdict in judge(questions, golds, preds)]
    return [answer_reward(pred, gold, kind) for pred, gold in zip(preds, golds)]
