"""What an RL environment is to the trainer: a prompt per state, and a reward per (state, response)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, TypeVar

StateT = TypeVar("StateT", contravariant=True)


@dataclass(frozen=True)
class Reward:
    """The reward of one response: the weighted sum of what the environment measured.

    terms: the outcomes by name, in the order they are summed: "answer" (the answers' score, in
        [0, 1]), "noop" (the Manager state's score under NOOP), "malformed" (1.0 when the response did
        not parse or its operation was refused), "overlong" (the rollout's length shaping).
    weights: what each term counts (`memr1.envs.rewards.reward_weights`: the format penalty and the
        credit live there); a term without a weight counts 0.
    format_error: the parser's reason the response was malformed (or the environment's, such as an
        operation the bank rejected), None when it was well formed.
    info: numbers and labels for logging, e.g. {"em": 1.0, "f1": 0.5, "op": "UPDATE"}.
    """

    terms: Mapping[str, float]
    weights: Mapping[str, float]
    format_error: str | None = None
    info: dict[str, float | str] = field(default_factory=dict)

    @classmethod
    def of(cls, score: float, format_error: str | None = None, info: dict[str, float | str] | None = None) -> Reward:
        """A reward of one term, "answer", worth `score`."""
        return cls({"answer": score}, ANSWER_ONLY, format_error, info or {})

    @property
    def score(self) -> float:
        """The RL reward: sum of weight x term, in the terms' order."""
        return self.score_without()

    def score_without(self, *names: str) -> float:
        """The reward less the terms `names` (say, the credit's baseline)."""
        return sum(self.weights.get(name, 0.0) * value for name, value in self.terms.items() if name not in names)

    def with_term(self, name: str, value: float, weight: float) -> Reward:
        """This reward with one more term (the rollout's shaping), summed after the others."""
        if name in self.terms:
            raise ValueError(f"reward term {name!r} is set already")
        return Reward({**self.terms, name: value}, {**self.weights, name: weight}, self.format_error, self.info)


ANSWER_ONLY: Mapping[str, float] = MappingProxyType({"answer": 1.0})


class Environment(Protocol[StateT]):
    """Turns states into chat prompts for the policy and scores the policy's responses."""

    def prompt(self, state: StateT) -> list[dict[str, str]]:
        """The chat messages the policy answers."""
        ...

    def score(self, states: Sequence[StateT], responses: Sequence[str]) -> list[Reward]:
        """One Reward per response; `states[i]` produced `responses[i]` (a GRPO group repeats its state
        G times in a row). Never raises on the text of a response."""
        ...


def check_aligned(states: Sequence[object], responses: Sequence[str]) -> None:
    """`score`'s arguments must pair up: a mismatch is a caller's bug, not a model's output."""
    if len(states) != len(responses):
        raise ValueError(f"score: {len(states)} states but {len(responses)} responses; they must pair up")
