"""What a bank keeps per memory, and the pure rules that turn a memory operation into a new record.

A bank never edits a record: each write builds the next record from the current one, so a bank, a
fork and a copy of a bank apply an operation identically, and a write that fails validation leaves
nothing half-changed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from memr1.memory.errors import InvalidOpError, UnknownMemoryError
from memr1.types import MemoryEntry, MemoryOp, OpKind

# Field limits of the Milvus schema (VARCHAR max_length counts UTF-8 bytes).
MAX_TEXT_BYTES = 65_535
MAX_SPEAKER_BYTES = 1_024
MAX_TIMESTAMP_BYTES = 256

RevisionAction = Literal["ADD", "UPDATE", "DELETE", "RESTORE"]


@dataclass(frozen=True)
class Revision:
    """One write to a memory: what it did, at which bank step, and the memory's content after it."""

    action: RevisionAction
    step: int
    text: str
    timestamp: str
    provenance: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class StoredMemory:
    """A memory as a bank holds it: the entry, its unit vector (dim,) float32, the soft-delete flag
    and every revision, oldest first."""

    entry: MemoryEntry
    vector: np.ndarray
    deleted: bool
    history: tuple[Revision, ...]

    @property
    def id(self) -> str:
        return self.entry.id


class RecordStore(Protocol):
    """Where a bank's records are kept: a Milvus collection (`memr1.memory.store.MilvusStore`) or
    nowhere beyond the process (`memr1.memory.ephemeral.EphemeralStore`)."""

    uri: str

    def insert(self, memories: Sequence[StoredMemory]) -> None: ...

    def upsert(self, memories: Sequence[StoredMemory]) -> None: ...

    def flush(self) -> None: ...

    def rows(self) -> Iterator[StoredMemory]:
        """Every stored memory, deleted ones included, in no particular order."""
        ...

    def search(self, vectors: np.ndarray, speaker: str | None, k: int) -> list[list[tuple[str, float]]]:
        """The store's own exact search over live rows: vectors (q, dim) -> q lists of (id, score)."""
        ...

    def close(self) -> None: ...


def check_op(op: MemoryOp, bank: str) -> None:
    """Raise `InvalidOpError` if `op` lacks what its kind needs or exceeds a field limit."""
    where = f"bank {bank!r}: {op.kind.value}"
    if op.kind in (OpKind.ADD, OpKind.UPDATE):
        if not op.text.strip():
            raise InvalidOpError(f"{where}: text is empty")
        _check_size(op.text, MAX_TEXT_BYTES, f"{where}: text")
    if op.kind is OpKind.ADD:
        if not op.speaker:
            raise InvalidOpError(f"{where}: speaker is missing")
        _check_size(op.speaker, MAX_SPEAKER_BYTES, f"{where}: speaker")
    if op.kind in (OpKind.UPDATE, OpKind.DELETE) and not op.target_id:
        raise InvalidOpError(f"{where}: target_id is missing")
    _check_size(op.timestamp, MAX_TIMESTAMP_BYTES, f"{where}: timestamp")


def _check_size(value: str, limit: int, where: str) -> None:
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as error:
        raise InvalidOpError(f"{where}: not valid Unicode ({error.reason} at {error.start})") from None
    if size > limit:
        raise InvalidOpError(f"{where}: {size} UTF-8 bytes, the limit is {limit}")


def live_target(memory: StoredMemory | None, op: MemoryOp, bank: str) -> StoredMemory:
    """The live memory an UPDATE / DELETE acts on; `UnknownMemoryError` if it is absent or deleted."""
    if memory is None:
        raise UnknownMemoryError(bank, op.target_id)
    if memory.deleted:
        raise UnknownMemoryError(bank, op.target_id, "deleted (restore it first)")
    if op.speaker and op.speaker != memory.entry.speaker:
        raise InvalidOpError(
            f"bank {bank!r}: {op.kind.value} of {op.target_id!r}: speaker {op.speaker!r} "
            f"but the memory belongs to {memory.entry.speaker!r}"
        )
    return memory


def added(op: MemoryOp, memory_id: str, step: int, vector: np.ndarray) -> StoredMemory:
    entry = MemoryEntry(
        id=memory_id,
        text=op.text,
        speaker=op.speaker or "",
        timestamp=op.timestamp,
        provenance=tuple(op.provenance),
        created_step=step,
        updated_step=step,
    )
    return StoredMemory(entry, vector, deleted=False, history=(_revision("ADD", step, entry),))


def updated(memory: StoredMemory, op: MemoryOp, step: int, vector: np.ndarray) -> StoredMemory:
    """New text and vector, the op's timestamp when it has one, provenance merged in order."""
    entry = dataclasses.replace(
        memory.entry,
        text=op.text,
        timestamp=op.timestamp or memory.entry.timestamp,
        provenance=tuple(dict.fromkeys(memory.entry.provenance + tuple(op.provenance))),
        updated_step=step,
    )
    return StoredMemory(entry, vector, deleted=False, history=memory.history + (_revision("UPDATE", step, entry),))


def deleted(memory: StoredMemory, step: int) -> StoredMemory:
    entry = dataclasses.replace(memory.entry, updated_step=step)
    history = memory.history + (_revision("DELETE", step, entry),)
    return StoredMemory(entry, memory.vector, deleted=True, history=history)


def restored(memory: StoredMemory, step: int) -> StoredMemory:
    entry = dataclasses.replace(memory.entry, updated_step=step)
    history = memory.history + (_revision("RESTORE", step, entry),)
    return StoredMemory(entry, memory.vector, deleted=False, history=history)


def _revision(action: RevisionAction, step: int, entry: MemoryEntry) -> Revision:
    return Revision(action, step, entry.text, entry.timestamp, entry.provenance)


def with_score(entry: MemoryEntry, score: float) -> MemoryEntry:
    # The constructor, not dataclasses.replace: half the cost, and a search builds 30-60 of these.
    return MemoryEntry(
        entry.id,
        entry.text,
        entry.speaker,
        entry.timestamp,
        entry.provenance,
        entry.created_step,
        entry.updated_step,
        score,
    )
