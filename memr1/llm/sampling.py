"""Sampling settings shared by every generation engine, and the pure maths of choosing a token."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample responses.

    temperature: 0 means greedy (argmax); otherwise logits are divided by it before top-p.
    top_p: nucleus sampling; 1.0 keeps the whole vocabulary.
    n: samples per prompt (GRPO's group size).
    stop: strings that end a response; the returned text stops before the first one.
    seed: makes sampling reproducible (for the same prompts and batch size) without touching the
        global RNG; None draws from torch's global RNG.
    constraint: a factory of `memr1.llm.constraints.TokenConstraint`s (one per reply): only the tokens
        its grammar allows are sampled (the HF engine; JSON replies of the service).
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    constraint: Callable[[], Any] | None = None

    @classmethod
    def greedy_up_to(cls, max_new_tokens: int) -> SamplingConfig:
        """How an agent decodes outside RL rollouts: validation, evaluation, a frozen agent, bank building."""
        return cls(max_new_tokens=max_new_tokens, temperature=0.0)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            raise ValueError(
                f"SamplingConfig.stop: expected a sequence of strings, got the string {self.stop!r}"
            )
        stop = tuple(self.stop)  # configs give lists (or omegaconf ListConfig)
        object.__setattr__(self, "stop", stop)
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingConfig.max_new_tokens: must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"SamplingConfig.temperature: must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingConfig.top_p: must be in (0, 1], got {self.top_p}")
        if self.n < 1:
            raise ValueError(f"SamplingConfig.n: must be >= 1, got {self.n}")
        for index, text in enumerate(stop):
            if not isinstance(text, str) or not text:
                raise ValueError(f"SamplingConfig.stop[{index}]: must be a non-empty string, got {text!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def nucleus_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most probable tokens whose probability reaches `top_p`.

    logits: `(bs, V)`. Returns `(bs, V)` with the other tokens set to -inf. A token is kept when the
    probability of all more probable tokens is still below `top_p`, so the most probable token always
    survives. Example: probs [0.5, 0.3, 0.15, 0.05], top_p 0.75 -> the first two are kept.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def choose_tokens(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Pick the next token of each row: `(bs, V)` logits -> `(bs,)` int64 token ids.

    temperature 0 is greedy (argmax, ties to the lowest id); otherwise sample from
    softmax(nucleus_filter(logits / temperature, top_p)).
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = nucleus_filter(logits.float() / temperature, top_p).softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def cut_at_first_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """`text` up to (excluding) the earliest occurrence of any stop string, and whether one occurred.

    Example: cut_at_first_stop("a\\nb END c", ["END", "\\n"]) -> ("a", True).
    """
    positions = [found for found in (text.find(s) for s in stop) if found >= 0]
    if not positions:
        return text, False
    return text[: min(positions)], True
