"""Memory banks: one conversation's memories, a scope of a store, searched through an in-process index.

The store (Milvus, Qdrant, or ":memory:"; `memr1.memory.stores`) is the store of record; a filtered
top-30 search in Milvus costs ~35 ms at 20k rows, a numpy scan 2-3 ms. So every bank keeps its live
memories in a `VectorIndex`, updated together with each write, and search never leaves the process.
`fork()` gives rollouts a copy-on-write view: G candidate operations can each be applied to their own
fork without touching the store or the bank.

Ids: a bank names a memory `m<step>`, the bank step at which it was created (steps count writes:
ADD, UPDATE, DELETE, restore, each add of `add_many`); a fork names its memories `f<n>.m<step>`, `n`
unique to the fork in this process, so they never collide with the bank's later ids. Creation steps
are unique in a bank and continue in its forks, which makes (score, created step) a total order:
a fork and a copy of its bank rank equal scores identically.
"""

from __future__ import annotations

import abc
import itertools
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from types import TracebackType

import numpy as np

from memr1.embed import Embedder
from memr1.memory.errors import InvalidOpError, MemoryBankError, StaleForkError, UnknownMemoryError
from memr1.memory.index import Hit, VectorIndex, merge_hits, unit_rows
from memr1.memory.records import (
    RecordStore,
    Revision,
    RevisionAction,
    StoredMemory,
    added,
    check_op,
    deleted,
    live_target,
    restored,
    updated,
    with_score,
)
from memr1.memory.ephemeral import MEMORY_URI
from memr1.memory.stores import move_legacy_bank, open_store, resolve_store_uri
from memr1.types import MemoryEntry, MemoryOp, OpKind

WRITE_BATCH = 1_000  # rows per insert request: ~1.6 MB of vectors, far below gRPC's message limit
_fork_numbers = itertools.count(1)
# (resolved uri, collection) of every bank open in this process: two bank objects on one collection
# would each index only their own writes.
_open_banks: set[tuple[str, str]] = set()


def _reindex(index: VectorIndex, memory: StoredMemory) -> None:
    """`index` follows `memory`'s latest write: a deleted memory leaves it, a live one is put."""
    if memory.deleted:
        if memory.id in index:
            index.remove(memory.id)
    else:
        index.put(memory.id, memory.entry.speaker, memory.entry.created_step, memory.vector)


class MemoryView(abc.ABC):
    """What a bank and its forks share: applying operations, searching, listing, forking."""

    name: str
    embedder: Embedder
    step: int
    _version: int  # advances on every write; a fork is valid while its parent's version is unchanged

    def apply(self, op: MemoryOp) -> MemoryEntry | None:
        """Apply one operation and return the memory it wrote (NOOP: None).

        ADD creates a memory with a fresh id; UPDATE replaces the text (re-embedded), takes the op's
        timestamp if it has one and merges provenance; DELETE soft-deletes. An UPDATE or DELETE of an
        unknown or deleted id raises `UnknownMemoryError`, other bad ops `InvalidOpError`; either way
        nothing changes.
        """
        self._check_usable()
        if op.kind is OpKind.NOOP:
            return None
        check_op(op, self.name)
        step = self.step + 1
        if op.kind is OpKind.ADD:
            memory = added(op, self.name, self._new_id(step), step, self._embed_one(op.text))
        else:
            current = live_target(self._get(op.target_id), op, self.name)
            if op.kind is OpKind.UPDATE:
                memory = updated(current, op, step, self._embed_one(op.text))
            else:
                memory = deleted(current, step)
        self._commit([memory])
        return memory.entry

    def search(self, query: str, speaker: str | None = None, k: int = 30) -> list[MemoryEntry]:
        """The `k` live memories most similar to `query` (of `speaker`, or of everyone), best first,
        each with its cosine `score`."""
        return self.search_by_vector(self._embed_one(query), speaker, k)

    def search_many(self, queries: Sequence[str], speaker: str | None = None, k: int = 30) -> list[list[MemoryEntry]]:
        """`search` for several queries with one embedding call."""
        return self.search_by_vectors(self.embedder.encode(queries), speaker, k)

    def search_by_vector(self, vector: np.ndarray, speaker: str | None = None, k: int = 30) -> list[MemoryEntry]:
        """`search` with a precomputed unit query vector (dim,)."""
        vector = np.asarray(vector)
        if vector.ndim != 1:
            raise ValueError(
                f"bank {self.name!r}: search_by_vector: expected shape ({self.embedder.dim},), got {vector.shape}"
            )
        return self.search_by_vectors(vector[None, :], speaker, k)[0]

    def search_by_vectors(
        self, vectors: np.ndarray, speaker: str | None = None, k: int = 30
    ) -> list[list[MemoryEntry]]:
        """`search` with precomputed unit query vectors (q, dim): q result lists."""
        self._check_usable()
        if k < 0:
            raise ValueError(f"bank {self.name!r}: search: k must be >= 0, got {k}")
        if speaker is not None and not isinstance(speaker, str):
            raise TypeError(f"bank {self.name!r}: search: speaker must be a str or None, got {type(speaker).__name__}")
        queries = unit_rows(vectors, self.embedder.dim, f"bank {self.name!r}: search query vectors")
        hits = self._hits(queries.astype(np.float64), speaker, k, frozenset())
        return [[self._scored(hit) for hit in query_hits] for query_hits in hits]

    def fork(self) -> BankFork:
        """A copy-on-write view of this bank, valid until this bank next changes."""
        return BankFork(self)

    def _embed_one(self, text: str) -> np.ndarray:
        return self.embedder.encode([text])[0]

    def _scored(self, hit: Hit) -> MemoryEntry:
        memory = self._get(hit.id)
        assert memory is not None, f"index hit {hit.id!r} has no record"
        return with_score(memory.entry, hit.score)

    def _commit(self, memories: Sequence[StoredMemory]) -> None:
        """Write memories (all created or changed at consecutive steps after `self.step`)."""
        self._write(memories)
        self.step = memories[-1].entry.updated_step
        self._version += 1

    @abc.abstractmethod
    def _check_usable(self) -> None: ...

    @abc.abstractmethod
    def _new_id(self, step: int) -> str: ...

    @abc.abstractmethod
    def _get(self, memory_id: str | None) -> StoredMemory | None:
        """The memory with this id, live or deleted; None if unknown."""

    @abc.abstractmethod
    def _write(self, memories: Sequence[StoredMemory]) -> None: ...

    @abc.abstractmethod
    def _hits(self, queries: np.ndarray, speaker: str | None, k: int, exclude: Collection[str]) -> list[list[Hit]]:
        """Best `k` live hits per query, skipping ids in `exclude`. queries (q, dim) float64."""

    @abc.abstractmethod
    def entries(self, speaker: str | None = None) -> list[MemoryEntry]:
        """Live memories (of `speaker`, or everyone's) in creation order."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of live memories."""


class MemoryBank(MemoryView):
    """One conversation's memories: a Milvus collection plus the in-process index that serves search.

    Open with `MemoryBank.open`; use as a context manager or call `close()`. Not thread-safe.
    """

    def __init__(self, store: RecordStore, name: str, embedder: Embedder, memories: Iterable[StoredMemory]) -> None:
        self.name = name
        self.embedder = embedder
        self._store = store
        self._records: dict[str, StoredMemory] = {}
        self._index = VectorIndex(embedder.dim)
        self._closed = False
        self._released = False
        self._version = 0
        for memory in memories:
            self._remember(memory)
        self.step = max((memory.entry.updated_step for memory in self._records.values()), default=0)

    @classmethod
    def open(cls, uri: str | Path, name: str, embedder: Embedder, *, token: str = "") -> MemoryBank:
        """Open (creating if needed) the bank `name`, a scope of the store at `uri`: a Milvus Lite path
        ending in `.db` (a directory; one process per file, `BankLockedError` otherwise), a Milvus
        server URI, `qdrant:PATH` or `qdrant+http://host:port` (Qdrant, embedded or a server: the
        `qdrant` extra), or ":memory:" (a new, empty bank that keeps nothing once closed; no store is
        imported). A bank kept in its own collection by an earlier memr1 is moved in first."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"bank name: expected a non-empty string, got {name!r}")
        resolved = resolve_store_uri(uri)
        if resolved != MEMORY_URI and (resolved, name) in _open_banks:
            raise MemoryBankError(f"{resolved}: bank {name!r} is already open in this process: share that MemoryBank")
        store = open_store(resolved, embedder.dim, token=token)
        try:
            move_legacy_bank(store, name)
            bank = cls(store, name, embedder, store.rows(name))
        except BaseException:
            store.close()
            raise
        if resolved != MEMORY_URI:
            _open_banks.add((resolved, name))
        return bank

    @property
    def uri(self) -> str:
        return self._store.uri

    def add_many(self, ops: Sequence[MemoryOp], vectors: np.ndarray | None = None) -> list[MemoryEntry]:
        """ADD many memories at once (ADD-all banks, bulk loads): one embedding call, inserts of
        `WRITE_BATCH` rows, then a Milvus flush. `vectors` (len(ops), dim) unit rows skip the embedder.
        Every op is checked before anything is written."""
        self._check_usable()
        for position, op in enumerate(ops):
            if op.kind is not OpKind.ADD:
                raise InvalidOpError(f"bank {self.name!r}: add_many: ops[{position}] is {op.kind.value}, expected ADD")
            try:
                check_op(op, self.name)
            except InvalidOpError as error:
                raise InvalidOpError(f"add_many: ops[{position}]: {error}") from None
        if vectors is None:
            vectors = self.embedder.encode([op.text for op in ops])
        vectors = unit_rows(vectors, self.embedder.dim, f"bank {self.name!r}: add_many vectors")
        if len(vectors) != len(ops):
            raise ValueError(f"bank {self.name!r}: add_many: {len(vectors)} vectors for {len(ops)} ops")
        entries: list[MemoryEntry] = []
        for start in range(0, len(ops), WRITE_BATCH):
            batch_ops, batch_vectors = ops[start : start + WRITE_BATCH], vectors[start : start + WRITE_BATCH]
            steps = range(self.step + 1, self.step + 1 + len(batch_ops))
            batch = [
                added(op, self.name, self._new_id(step), step, vector) for op, vector, step in zip(batch_ops, batch_vectors, steps)
            ]
            self._commit(batch)
            entries.extend(memory.entry for memory in batch)
        if entries:
            self._store.flush()
        return entries

    def restore(self, memory_id: str) -> MemoryEntry:
        """Undo the soft delete of `memory_id`: it is live again with its last text and vector."""
        self._check_usable()
        memory = self._records.get(memory_id)
        if memory is None:
            raise UnknownMemoryError(self.name, memory_id)
        if not memory.deleted:
            raise InvalidOpError(f"bank {self.name!r}: restore of {memory_id!r}: the memory is not deleted")
        restored_memory = restored(memory, self.step + 1)
        self._commit([restored_memory])
        return restored_memory.entry

    def history(self, memory_id: str) -> list[Revision]:
        """Every write to `memory_id`, oldest first (deleted memories included)."""
        memory = self._records.get(memory_id)
        if memory is None:
            raise UnknownMemoryError(self.name, memory_id)
        return list(memory.history)

    def revision_counts(self) -> Counter[RevisionAction]:
        """The writes the bank holds, by action, over every memory (deleted ones included)."""
        return Counter(revision.action for memory in self._records.values() for revision in memory.history)

    def entries(self, speaker: str | None = None) -> list[MemoryEntry]:
        self._check_usable()
        live = (memory.entry for memory in self._records.values() if not memory.deleted)
        chosen = (entry for entry in live if speaker is None or entry.speaker == speaker)
        return sorted(chosen, key=lambda entry: entry.created_step)

    def search_in_store(self, vector: np.ndarray, speaker: str | None = None, k: int = 30) -> list[MemoryEntry]:
        """The store's own filtered search (Milvus', Qdrant's, or numpy's in memory) over its rows: the
        reference the index is checked and benchmarked against (much slower; `search` is the one to use)."""
        self._check_usable()
        if self._released:
            raise MemoryBankError(f"bank {self.name!r}: search_in_store needs the store, which was released")
        where = f"bank {self.name!r}: search_in_store vector"
        query = unit_rows(np.asarray(vector)[None, :], self.embedder.dim, where)
        return [memory.entry for memory in self._store.search(query, self.name, speaker, k)[0]]

    def release_store(self) -> None:
        """Close the Milvus connection and keep the in-process index: the bank still serves every read
        (search, entries, history, forks) and refuses writes. A Milvus Lite file is then free for other
        processes, so evaluations of two checkpoints can share one built bank."""
        self._check_usable()
        if not self._released:
            self._released = True
            self._store.close()

    @property
    def read_only(self) -> bool:
        return self._released

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _open_banks.discard((self._store.uri, self.name))
        if not self._released:
            self._store.close()

    def __enter__(self) -> MemoryBank:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return f"MemoryBank(name={self.name!r}, uri={self._store.uri!r}, live={len(self._index)}, step={self.step})"

    def _check_usable(self) -> None:
        if self._closed:
            raise MemoryBankError(f"bank {self.name!r} is closed")

    def _new_id(self, step: int) -> str:
        return f"m{step}"

    def _get(self, memory_id: str | None) -> StoredMemory | None:
        return self._records.get(memory_id) if memory_id is not None else None

    def _write(self, memories: Sequence[StoredMemory]) -> None:
        if self._released:
            raise MemoryBankError(f"bank {self.name!r} is read-only (its store was released): reopen it to write")
        # The store first: if the write fails, the bank's state has not moved.
        self._store.write(memories)
        for memory in memories:
            self._remember(memory)

    def _remember(self, memory: StoredMemory) -> None:
        self._records[memory.id] = memory
        _reindex(self._index, memory)

    def _hits(self, queries: np.ndarray, speaker: str | None, k: int, exclude: Collection[str]) -> list[list[Hit]]:
        return self._index.search(queries, speaker, k, exclude)


class BankFork(MemoryView):
    """A copy-on-write view of a bank (or of another fork) for rollouts.

    It shares its parent's index and holds only its own overlay: the memories it added or changed
    (with their vectors) and the parent ids it updated or deleted. It never writes to Milvus or to the
    parent, costs microseconds to create, and searches exactly as a copy of the parent with the same
    ops applied would. It is valid until the parent changes or closes (`StaleForkError` after that).
    """

    def __init__(self, parent: MemoryView) -> None:
        parent._check_usable()
        self.name = parent.name
        self.embedder = parent.embedder
        self.step = parent.step
        self._version = 0
        self._parent = parent
        self._parent_version = parent._version
        self._number = next(_fork_numbers)
        self._overlay: dict[str, StoredMemory] = {}
        self._index = VectorIndex(parent.embedder.dim)
        self._shadowed: set[str] = set()  # live parent memories this fork updated or deleted

    def entries(self, speaker: str | None = None) -> list[MemoryEntry]:
        self._check_usable()
        inherited = [entry for entry in self._parent.entries(speaker) if entry.id not in self._shadowed]
        own = [
            memory.entry
            for memory in self._overlay.values()
            if not memory.deleted and (speaker is None or memory.entry.speaker == speaker)
        ]
        return sorted(inherited + own, key=lambda entry: entry.created_step)

    def __len__(self) -> int:
        self._check_usable()
        return len(self._parent) - len(self._shadowed) + len(self._index)

    def __repr__(self) -> str:
        return f"BankFork(name={self.name!r}, number={self._number}, overlay={len(self._overlay)}, step={self.step})"

    def _check_usable(self) -> None:
        self._parent._check_usable()
        if self._parent._version != self._parent_version:
            raise StaleForkError(
                f"fork f{self._number} of bank {self.name!r}: its parent changed after the fork was made; fork again"
            )

    def _new_id(self, step: int) -> str:
        return f"f{self._number}.m{step}"

    def _get(self, memory_id: str | None) -> StoredMemory | None:
        memory = self._overlay.get(memory_id) if memory_id is not None else None
        return memory if memory is not None else self._parent._get(memory_id)

    def _write(self, memories: Sequence[StoredMemory]) -> None:
        for memory in memories:
            if memory.id not in self._overlay and self._parent._get(memory.id) is not None:
                self._shadowed.add(memory.id)
            self._overlay[memory.id] = memory
            _reindex(self._index, memory)

    def _hits(self, queries: np.ndarray, speaker: str | None, k: int, exclude: Collection[str]) -> list[list[Hit]]:
        hidden = self._shadowed.union(exclude) if exclude else self._shadowed
        inherited = self._parent._hits(queries, speaker, k, hidden)
        own = self._index.search(queries, speaker, k, exclude)
        return [merge_hits(pair, k) for pair in zip(inherited, own)]
