"""The Memory Manager's temporal bank: the memories of the `window` turns strictly before a fact's turn,
cut out of a bank built over the whole conversation (the paper's temporal bank)."""

from __future__ import annotations

from collections.abc import Mapping

from memr1.memory import BankFork, MemoryView
from memr1.types import MemoryOp, OpKind, knowable_at


def in_window(memory_position: int | None, fact_position: int, window: int) -> bool:
    """Whether a memory known at `memory_position` is among the `window` turns strictly before the fact's
    turn: fact_position - window <= memory_position < fact_position. A memory of no turn never is."""
    return memory_position is not None and fact_position - window <= memory_position < fact_position


def window_bank(teacher: MemoryView, positions: Mapping[str, int], fact_position: int, window: int) -> BankFork:
    """A fork of `teacher` in which every memory outside the window before `fact_position` is deleted."""
    bank = teacher.fork()
    for entry in teacher.entries():
        if not in_window(knowable_at(entry.provenance, positions), fact_position, window):
            bank.apply(MemoryOp(OpKind.DELETE, target_id=entry.id))
    return bank
