"""The training order: the batch of global step `s` is a pure function of (seed, s).

Every pass over the data visits the states in a fresh permutation seeded by (seed, pass index), cut
into `num_states // batch_size` batches (`batch_indices`). A run resumed at step `s` therefore sees
exactly the batches an unbroken run saw. Under DDP, rank r of w takes positions r, r + w, ... of each
batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

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


class IndexedStates(Protocol):
    """What `StepBatches` draws from: `ManagerStates`, `AnswerStates`, or any sequence."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


class StepBatches(IterableDataset[list[Any]]):
    """The batches of global steps `steps` (a range), in order: batch `s` is
    `[states[i] for i in batch_indices(s, len(states), batch_size, seed)]`. Load it with
    `DataLoader(..., batch_size=None, num_workers=0)`: it yields whole batches, from one process.

    current_step: where the consumer stands (the data module passes the trainer's batch step). Every
        iteration must begin at `steps.start`: a loader iterated again after its steps ran out (a
        trainer that starts another epoch because its step count disagrees with ours) raises instead
        of replaying batches or spinning through empty epochs.
    shard: (rank, world_size) under DDP: this rank's part of each batch, positions rank::world_size.
    """

    def __init__(
        self,
        states: IndexedStates,
        batch_size: int,
        seed: int,
        steps: range,
        current_step: Callable[[], int] | None = None,
        shard: tuple[int, int] = (0, 1),
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

    def indices(self, step: int) -> list[int]:
        """This rank's state indices of step `step`."""
        rank, world_size = self.shard
        return batch_indices(step, len(self.states), self.batch_size, self.seed)[rank::world_size]

    def __iter__(self) -> Iterator[list[Any]]:
        if self.current_step is not None and (current := self.current_step()) != self.steps.start:
            raise RuntimeError(
                f"StepBatches: iterated at batch step {current}, but this loader serves steps {self.steps}; "
                "the trainer went on past them (memr1.lightning_loop: one optimizer step per batch)"
            )
        for step in self.steps:
            yield [self.states[index] for index in self.indices(step)]
