"""What a store keeps per memory, the store protocol both memory layers stand on, and the pure rules
that turn a memory operation into the next record.

A store holds the memories of many scopes: a training bank is one scope (its conversation's name), a
`memr1.Memory` holds one per user / agent / run ("user_id=andrew"). Nothing edits a record: each write
builds the next revision from the current one, so a bank, a fork, a copy of a bank and the service
apply an operation identically, and a write that fails validation leaves nothing half-changed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

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
    """A memory as a store holds it: whose it is (`scope`), the entry, its unit vector (dim,) float32
    (empty when read without vectors), the soft-delete flag, every revision (oldest first), the
    record's version (every write adds one) and a client's metadata (the service's; None in banks)."""

    scope: str
    entry: MemoryEntry
    vector: np.ndarray
    deleted: bool
    history: tuple[Revision, ...]
    revision: int = 0
    metadata: Mapping[str, Any] | None = None

    @property
    def id(self) -> str:
        return self.entry.id

    @property
    def created_at(self) -> str:
        """The timestamp of the memory's first write."""
        return self.history[0].timestamp if self.history else self.entry.timestamp


class RecordStore(Protocol):
    """Where memories are kept, opened by URI (`memr1.memory.stores.open_store`): Milvus (a Lite `.db`
    path or a server), Qdrant (the `qdrant` extra) or nowhere beyond the process (":memory:"). One
    collection holds many scopes; a memory id names one memory of its scope for good. Every store
    passes the same contract tests (tests/test_memory_bank.py, tests/test_service_store.py)."""

    uri: str

    def write(self, memories: Sequence[StoredMemory]) -> None:
        """Store new memories and new revisions of stored ones (`revision` one above the stored); a
        read after this returns sees them, and a process killed after it returns loses none."""
        ...

    def rows(self, scope: str, with_vectors: bool = True) -> Iterator[StoredMemory]:
        """Every memory of `scope`, deleted ones included, each at its newest revision, in no order."""
        ...

    def get(self, memory_id: str, scope: str | None = None) -> StoredMemory | None:
        """The memory `memory_id` (of `scope`, or of whichever scope holds that id), with its vector;
        None if there is none."""
        ...

    def search(self, vectors: np.ndarray, scope: str, speaker: str | None, k: int) -> list[list[StoredMemory]]:
        """The store's own exact inner-product search over the live memories of `scope` (and of
        `speaker`): vectors (q, dim) -> q lists of at most `k`, best first, each with its `entry.score`
        and without its vector."""
        ...

    def forget(self, scope: str, memory_ids: Sequence[str]) -> None:
        """Remove these memories of `scope` for good, history and all."""
        ...

    def clear(self) -> None:
        """Remove every memory of every scope; the collection stays."""
        ...

    def count(self) -> int:
        """Stored records (at most one per memory once its writes have finished)."""
        ...

    def flush(self) -> None:
        """Make the writes so far fast to search (Milvus Lite seals them into a segment)."""
        ...

    def legacy_rows(self, name: str, scope: str) -> list[StoredMemory] | None:
        """The memories of `name`, a collection of the layout before scopes (a collection per bank),
        as memories of `scope`; None if the store has no such collection."""
        ...

    def drop_legacy(self, name: str) -> None:
        """Drop the collection `name` of the layout before scopes, once its memories are moved."""
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


def added(op: MemoryOp, scope: str, memory_id: str, step: int, vector: np.ndarray, metadata: Mapping[str, Any] | None = None) -> StoredMemory:
    entry = MemoryEntry(
        id=memory_id,
        text=op.text,
        speaker=op.speaker or "",
        timestamp=op.timestamp,
        provenance=tuple(op.provenance),
        created_step=step,
        updated_step=step,
    )
    history = (_revision("ADD", step, entry),)
    return StoredMemory(scope, entry, vector, deleted=False, history=history, metadata=None if metadata is None else dict(metadata))


def updated(memory: StoredMemory, op: MemoryOp, step: int, vector: np.ndarray) -> StoredMemory:
    """New text and vector, the op's timestamp when it has one, provenance merged in order."""
    entry = dataclasses.replace(
        memory.entry,
        text=op.text,
        timestamp=op.timestamp or memory.entry.timestamp,
        provenance=tuple(dict.fromkeys(memory.entry.provenance + tuple(op.provenance))),
        updated_step=step,
    )
    return _next(memory, entry=entry, vector=vector, deleted=False, history=memory.history + (_revision("UPDATE", step, entry),))


def deleted(memory: StoredMemory, step: int, timestamp: str = "") -> StoredMemory:
    """Soft-deleted at `step` (and at `timestamp`, when given: the service dates its deletes)."""
    entry = dataclasses.replace(memory.entry, timestamp=timestamp or memory.entry.timestamp, updated_step=step)
    return _next(memory, entry=entry, deleted=True, history=memory.history + (_revision("DELETE", step, entry),))


def restored(memory: StoredMemory, step: int, timestamp: str = "") -> StoredMemory:
    entry = dataclasses.replace(memory.entry, timestamp=timestamp or memory.entry.timestamp, updated_step=step)
    return _next(memory, entry=entry, deleted=False, history=memory.history + (_revision("RESTORE", step, entry),))


def with_metadata(memory: StoredMemory, metadata: Mapping[str, Any]) -> StoredMemory:
    """New client metadata, replacing the old; the text and its history are unchanged."""
    return _next(memory, metadata=dict(metadata))


def _next(memory: StoredMemory, **changes: Any) -> StoredMemory:
    return dataclasses.replace(memory, revision=memory.revision + 1, **changes)


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


def newest(memories: Iterable[StoredMemory]) -> list[StoredMemory]:
    """Each memory's newest revision, in first-seen order."""
    latest: dict[tuple[str, str], StoredMemory] = {}
    for memory in memories:
        key = (memory.scope, memory.id)
        if key not in latest or memory.revision > latest[key].revision:
            latest[key] = memory
    return list(latest.values())


def newest_of_found(found: list[StoredMemory]) -> list[StoredMemory]:
    """Search hits less any revision older than another hit of the same memory, best first."""
    keep = {id(memory) for memory in newest(found)}
    return [memory for memory in found if id(memory) in keep]


def scored(memory: StoredMemory, score: float) -> StoredMemory:
    """A search hit: the memory with its entry's `score`."""
    return dataclasses.replace(memory, entry=with_score(memory.entry, score))


def revision_item(revision: Revision) -> dict[str, Any]:
    return {"action": revision.action, "step": revision.step, "text": revision.text, "timestamp": revision.timestamp,
            "provenance": list(revision.provenance)}


def revisions(items: Iterable[Mapping[str, Any]]) -> tuple[Revision, ...]:
    return tuple(
        Revision(r["action"], int(r["step"]), str(r["text"]), str(r["timestamp"]), tuple(map(str, r.get("provenance", ()))))
        for r in items
    )
