"""The policy losses the RL update can use, one module each (verl's `register_policy_loss`).

`algo.policy_loss` names one: a module of this package (`vanilla`, `gspo`) or, for a loss kept
outside memr1, a dotted module path (`my_project.losses.cispo`). A loss module defines

    def policy_loss(logprobs, old_logprobs, advantages, response_mask, algo, denominator)
        -> tuple[Tensor, dict[str, Tensor]]

with logprobs (with their graph), old_logprobs, advantages and response_mask `(bs, L)`, `algo` the
run's settings (`LossSettings`: the `AlgoConfig`) and `denominator` the mini-batch's
`core.LossDenominator`; it returns the scalar loss and detached scalar statistics, `clip_frac` and
`approx_kl` among them (logged per epoch when the update makes several). Adding a loss is one file here
and a preset YAML in conf/algo that names it; nothing else changes.

This module imports no torch: the preflight checks a name by finding its module, without loading it.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from torch import Tensor

    from memr1.rl.core import LossDenominator


class LossSettings(Protocol):
    """What a loss may read of the run's `AlgoConfig`."""

    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    loss_agg_mode: str


class PolicyLoss(Protocol):
    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        algo: LossSettings,
        denominator: LossDenominator | None,
    ) -> tuple[Tensor, dict[str, Tensor]]: ...


def names() -> list[str]:
    """The losses that ship with memr1."""
    return sorted(module.name for module in pkgutil.iter_modules(__path__))


def module_name(name: str) -> str:
    return name if "." in name else f"{__name__}.{name}"


def check(name: str) -> None:
    """Refuse a name that has no module, before anything loads (a ValueError naming the key)."""
    try:
        found = importlib.util.find_spec(module_name(name)) is not None
    except ModuleNotFoundError:  # a dotted path whose package does not exist
        found = False
    if not found:
        raise ValueError(
            f"algo.policy_loss: {name!r} is not one of memr1's ({', '.join(names())}) nor an importable module path"
        )


def load(name: str) -> PolicyLoss:
    """The `policy_loss` function of the loss `name`."""
    check(name)
    module = importlib.import_module(module_name(name))
    loss: Callable[..., tuple[Tensor, dict[str, Tensor]]] | None = getattr(module, "policy_loss", None)
    if not callable(loss):
        raise ValueError(f"algo.policy_loss: module {module.__name__} defines no policy_loss function")
    return loss
