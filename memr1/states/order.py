"""The training order: the batch of global step `s` is a pure function of (seed, s).

Every pass over the data visits the states in a fresh permutation seeded by (seed, pass index), cut
into `num_states // batch_size` batches (`batch_indices`). A run resumed at step `s` therefore sees
exactly the batches an unbroken run saw. Under DDP, rank r of w takes positions r, r + w, ... of each
batch.

Where the states are drawn by weight (`kind_balanced_weights`), step s is `weighted_batch_indices`:
distinct states drawn by (seed, s) alone, as resumable, without passes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from torch.utils.data import IterableDataset


def pass_permutation(num_states: int, seed: int, pass_index: int) -> np.ndarray:
    """The order of the states in pass `pass_index` over the data: (num_states,) int64, seeded by
    (seed, pass_index) through numpy's SeedSequence, the same on every machine."""
    return np.random.default_rng([seed, pass_index]).permutation(num_states)


def batch_indices(step: int, num_states: int, batch_size: int, seed: int) -> list[int]:
    """The state indices of global step `step`.

    Each pass over the data is `num_states // batch_size` batches cut from that pass's permutation;
    the last `num_states % batch_size` states of the permutation sit that pass out (different ones
    each pass), so a batch never holds a state twice. Step s is batch s % per_pass of pass s // per_pass.
    """
    if step < 0 or batch_size < 1 or seed < 0 or num_states < batch_size:
        raise ValueError(
            f"batch_indices: need step >= 0, 1 <= batch_size <= num_states, seed >= 0; "
            f"got step={step}, batch_size={batch_size}, num_states={num_states}, seed={seed}"
        )
    pass_index, batch = divmod(step, num_states // batch_size)
    start = batch * batch_size
    return pass_permutation(num_states, seed, pass_index)[start : start + batch_size].tolist()


def kind_balanced_weights(kinds: Sequence[str], alpha: float) -> np.ndarray:
    """Sampling weights `(n,)` summing to 1 for n states, state i labelled `kinds[i]`: a kind holding m
    states is drawn with probability proportional to m ** alpha, shared alike among its states (the
    temperature sampling mT5 and XLM use across languages). alpha 1: every state alike; 0: every kind
    alike. E.g. kinds (a, a, a, b), alpha 0.5: a gets sqrt(3) / (sqrt(3) + 1) = 0.634, so 0.211 a state,
    b 0.366."""
    if not kinds:
        raise ValueError("kind_balanced_weights: no states")
    if not 0 <= alpha <= 1:
        raise ValueError(f"kind_balanced_weights: alpha must be in [0, 1], got {alpha}")
    sizes = Counter(kinds)
    weights = np.array([sizes[kind] ** (alpha - 1.0) for kind in kinds], dtype=np.float64)
    return weights / weights.sum()


def weighted_batch_indices(step: int, weights: np.ndarray, batch_size: int, seed: int) -> list[int]:
    """The state indices of global step `step` when state i is drawn with probability `weights[i]`
    (`(num_states,)`, non-negative, summing to 1): `batch_size` distinct states drawn without
    replacement, seeded by (seed, step), so a resumed run draws what an unbroken one drew. Across steps
    the draws are independent: a heavy state may come back the next step, a light one wait."""
    positive = int(np.count_nonzero(weights > 0))
    if step < 0 or seed < 0 or not 1 <= batch_size <= positive:
        raise ValueError(
            f"weighted_batch_indices: need step >= 0, seed >= 0 and 1 <= batch_size <= the {positive} states of "
            f"positive weight; got step={step}, batch_size={batch_size}, seed={seed}"
        )
    rng = np.random.default_rng([seed, step, 7_919])
    return rng.choice(len(weights), size=batch_size, replace=False, p=weights).tolist()


def step_indices(step: int, num_states: int, batch_size: int, seed: int, weights: np.ndarray | None = None) -> list[int]:
    """The state indices of global step `step`: `batch_indices`, or `weighted_batch_indices` where
    the states are drawn by `weights`."""
    if weights is None:
        return batch_indices(step, num_states, batch_size, seed)
    return weighted_batch_indices(step, weights, batch_size, seed)


def check_weights(weights: Sequence[float] | np.ndarray, num_states: int, batch_size: int) -> np.ndarray:
    """`weights` as sampling probabilities `(num_states,)`, normalised to sum 1; a ValueError names what
    is wrong: the length, a negative or non-finite weight, fewer positive weights than a batch holds."""
    array = np.asarray(weights, dtype=np.float64)
    if array.shape != (num_states,):
        raise ValueError(f"state weights: expected one per training state ({num_states}), got shape {array.shape}")
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError("state weights: every weight must be finite and >= 0")
    if np.count_nonzero(array) < batch_size:
        raise ValueError(
            f"state weights: {np.count_nonzero(array)} states have a positive weight, fewer than the {batch_size} a batch draws"
        )
    return array / array.sum()


class IndexedStates(Protocol):
    """What `StepBatches` draws from: `ManagerStates`, `AnswerStates`, or any sequence."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


@runtime_checkable
class WeighableStates(Protocol):
    """A data module whose training states can be drawn by weight (`RLStatesDataModule`): `weigh` is
    called on its training states once they are loaded and returns one weight per state."""

    def weigh_training_states(self, weigh: Callable[[IndexedStates], Sequence[float] | np.ndarray]) -> None: ...


class StepBatches(IterableDataset[list[Any]]):
    """The batches of global steps `steps` (a range), in order: batch `s` is
    `[states[i] for i in step_indices(s, len(states), batch_size, seed, weights)]`. Load it with
    `DataLoader(..., batch_size=None, num_workers=0)`: it yields whole batches, from one process.

    current_step: where the consumer stands (the data module passes the trainer's batch step). Every
        iteration must begin at `steps.start`: a loader iterated again after its steps ran out (a
        trainer that starts another epoch because its step count disagrees with ours) raises instead
        of replaying batches or spinning through empty epochs.
    shard: (rank, world_size) under DDP: this rank's part of each batch, positions rank::world_size.
    weights: each state's probability of being drawn (`check_weights`); None: the uniform passes.
    """

    def __init__(
        self,
        states: IndexedStates,
        batch_size: int,
        seed: int,
        steps: range,
        current_step: Callable[[], int] | None = None,
        shard: tuple[int, int] = (0, 1),
        weights: np.ndarray | None = None,
    ) -> None:
        if not 1 <= batch_size <= len(states):
            raise ValueError(
                f"StepBatches.batch_size: must be in 1..{len(states)} (the number of states), got {batch_size}"
            )
        if seed < 0:
            raise ValueError(f"StepBatches.seed: must be >= 0, got {seed}")
        if steps.step != 1 or steps.start < 0:
            raise ValueError(f"StepBatches.steps: expected a range of consecutive steps from >= 0, got {steps}")
        rank, world_size = shard
        if not 0 <= rank < world_size <= batch_size:
            raise ValueError(
                f"StepBatches.shard: rank {rank} of {world_size}; every rank needs a state of each batch, "
                f"so world_size must be <= batch_size={batch_size}"
            )
        self.states = states
        self.batch_size = batch_size
        self.seed = seed
        self.steps = steps
        self.current_step = current_step
        self.shard = shard
        self.weights = None if weights is None else check_weights(weights, len(states), batch_size)

    def indices(self, step: int) -> list[int]:
        """This rank's state indices of step `step`."""
        rank, world_size = self.shard
        return step_indices(step, len(self.states), self.batch_size, self.seed, self.weights)[rank::world_size]

    def __iter__(self) -> Iterator[list[Any]]:
        if self.current_step is not None and (current := self.current_step()) != self.steps.start:
            raise RuntimeError(
                f"StepBatches: iterated at batch step {current}, but this loader serves steps {self.steps}; "
                "the trainer went on past them (memr1.lightning_loop: one optimizer step per batch)"
            )
        for step in self.steps:
            yield [self.states[index] for index in self.indices(step)]
