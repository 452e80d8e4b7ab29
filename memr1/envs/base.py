"""What an RL environment is to the trainer: a prompt per state, and a reward per (state, response)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

StateT = TypeVar("StateT", contravariant=True)


@dataclass(frozen=True)
class Reward:
    """The reward of one response.

    score: the RL reward, format penalty included.
    format_error: the parser's reason the response was malformed (or the environment's, such as an
        operation the bank rejected), None when it was well formed.
    info: numbers and labels for logging, e.g. {"em": 1.0, "f1": 0.5, "op": "UPDATE"}.
    """

    score: float
    format_error: str | None
    info: dict[str, float | str] = field(default_factory=dict)


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


def check_format_penalty(format_penalty: float) -> None:
    if not format_penalty <= 0:
        raise ValueError(
            f"format_penalty: must be <= 0 (it is added to the reward of a malformed response), got {format_penalty}"
        )
