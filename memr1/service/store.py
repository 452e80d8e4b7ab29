"""The service's memories: one Milvus collection for every scope, the scope its partition key.

Milvus' documented way to hold many tenants is one collection with a partition key, not a
collection per tenant: a new user is then one row insert (about a millisecond) instead of a new
collection (about 0.6 s), and a search filtered on the key reads only that key's partition. The
collection is the only copy: every read goes to Milvus (no in-process index), so several `memr1
serve` replicas on one Milvus server see each other's writes at once (the collection is created with
Strong consistency).

Ids are time-ordered UUIDs (version 7: 48 bits of Unix milliseconds, 74 random bits), drawn by
whichever process writes; two replicas never allocate the same one. Deletes are soft and a row keeps
its whole revision history, as the training banks do.

Rows are versioned: a memory's row key is `<id>/<revision>`, and a write inserts the next revision,
then deletes the earlier ones. Not an upsert: the 2.3 servers (the PyPI `milvus` package) put upserted
rows in the wrong partition of a partition-key collection, where a filter on the key never finds
them (measured: found after insert, lost after upsert). A process killed between the insert and the
delete leaves an earlier revision beside the new one: reads by id and listings keep the newest, and
the memory's next write removes it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from memr1.memory.errors import MemoryBankError
from memr1.memory.expr import field_equals, string_literal
from memr1.memory.records import MAX_SPEAKER_BYTES, MAX_TEXT_BYTES, MAX_TIMESTAMP_BYTES, Revision
from memr1.memory.store import JSON_ITEMS, is_lite_uri, json_items, open_collection, quiet_query_iterator, release

COLLECTION = "memr1_memories"
FIELDS = ("row", "id", "revision", "scope", "vector", "text", "created_at", "updated_at", "deleted", "history", "metadata")
MAX_ID_BYTES = 64
MAX_ROW_BYTES = 96
# Milvus Lite searches rows not yet sealed into a segment by brute force, and slowly (measured with
# 30k such rows: 1.1 s a search; 18 ms once flushed); a flush costs ~30-50 ms. So a Lite store flushes
# after this many writes. A server seals segments itself.
LITE_FLUSH_EVERY = 64
DELETE_BATCH = 100  # earlier revisions removed per delete request
_UUID7 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
# Ids of memories written by the per-scope layout (before this store), kept by its migration.
_LEGACY_ID = re.compile(r"scope_[0-9a-f]{24}\.m[0-9]+")


def uuid7() -> str:
    """A version-7 UUID (RFC 9562): Unix milliseconds, then random bits; sorts by creation time."""
    millis = time.time_ns() // 1_000_000
    random = int.from_bytes(os.urandom(10), "big")  # 80 bits, 74 used
    value = (millis & (1 << 48) - 1) << 80 | 0x7 << 76 | (random >> 68) << 64 | 0b10 << 62 | random & (1 << 62) - 1
    return str(uuid.UUID(int=value))


def is_memory_id(memory_id: str) -> bool:
    """Whether `memory_id` has the shape of an id this store gives (or kept from the old layout)."""
    return isinstance(memory_id, str) and bool(_UUID7.fullmatch(memory_id) or _LEGACY_ID.fullmatch(memory_id))


@dataclass(frozen=True, eq=False)
class ScopedMemory:
    """One memory of the service: its scope ("user_id=andrew"), text, unit vector (dim,) float32,
    soft-delete flag, revisions (oldest first; `Revision.step` numbers them) and client metadata."""

    id: str
    scope: str
    text: str
    vector: np.ndarray
    created_at: str
    updated_at: str
    deleted: bool
    history: tuple[Revision, ...]
    metadata: Mapping[str, Any] | None = None
    revision: int = 0  # the row's version: every write of the memory adds one
    score: float | None = None  # set on search results

    @classmethod
    def added(cls, scope: str, text: str, vector: np.ndarray, when: str, metadata: Mapping[str, Any] | None) -> ScopedMemory:
        return cls(uuid7(), scope, text, vector, when, when, False, (Revision("ADD", 0, text, when, ()),), metadata)

    def updated(self, text: str, vector: np.ndarray, when: str) -> ScopedMemory:
        return self._next(text=text, vector=vector, updated_at=when, history=self._revised("UPDATE", when, text))

    def with_metadata(self, metadata: Mapping[str, Any]) -> ScopedMemory:
        return self._next(metadata=dict(metadata))

    def removed(self, when: str) -> ScopedMemory:
        return self._next(deleted=True, updated_at=when, history=self._revised("DELETE", when))

    def restored(self, when: str) -> ScopedMemory:
        return self._next(deleted=False, updated_at=when, history=self._revised("RESTORE", when))

    @property
    def row(self) -> str:
        return f"{self.id}/{self.revision}"

    def _next(self, **changes: Any) -> ScopedMemory:
        return dataclasses.replace(self, revision=self.revision + 1, score=None, **changes)

    def _revised(self, action: str, when: str, text: str | None = None) -> tuple[Revision, ...]:
        return self.history + (Revision(action, len(self.history), self.text if text is None else text, when, ()),)  # type: ignore[arg-type]


class ScopedStore:
    """The collection of every scope's memories (at a Milvus Lite `.db` path or a server URI).

    Thread-safe as pymilvus' client is; callers serialise the read -> decide -> write of one scope."""

    def __init__(self, client: Any, uri: str, collection: str) -> None:
        self.client, self.uri, self.collection = client, uri, collection
        self._writes_since_flush = 0
        self._flush_lock = threading.Lock()

    @classmethod
    def open(cls, uri: str, dim: int, token: str = "", collection: str = COLLECTION) -> ScopedStore:
        client = open_collection(uri, token, collection, dim, FIELDS, "memr1's service memories", _schema)
        return cls(client, uri, collection)

    # -- writes ---------------------------------------------------------------------------------------
    def write(self, memories: Sequence[ScopedMemory]) -> None:
        """Store these memories' new revisions, then delete their earlier ones (see the module
        docstring); an id names one memory for good."""
        if not memories:
            return
        self.client.insert(self.collection, [to_row(memory) for memory in memories])
        earlier = [f"({field_equals('id', m.id)} and revision < {m.revision})" for m in memories if m.revision > 0]
        for start in range(0, len(earlier), DELETE_BATCH):
            self.client.delete(self.collection, filter=" or ".join(earlier[start : start + DELETE_BATCH]))
        if is_lite_uri(self.uri):
            with self._flush_lock:
                self._writes_since_flush += len(memories)
                due = self._writes_since_flush >= LITE_FLUSH_EVERY
                if due:
                    self._writes_since_flush = 0
            if due:
                self.client.flush(self.collection)

    def forget(self, memory_ids: Sequence[str]) -> None:
        """Delete every row of these memories (hard: no history is left)."""
        for start in range(0, len(memory_ids), DELETE_BATCH):
            batch = memory_ids[start : start + DELETE_BATCH]
            self.client.delete(self.collection, filter=f"id in [{', '.join(string_literal(i) for i in batch)}]")

    # -- reads ----------------------------------------------------------------------------------------
    def get(self, memory_id: str) -> ScopedMemory | None:
        """The memory `memory_id`, deleted or not; None if there is none (or the id is not one of ours)."""
        if not is_memory_id(memory_id):
            return None
        rows = self.client.query(self.collection, filter=field_equals("id", memory_id), output_fields=list(FIELDS))
        newest = _newest(from_row(row, self._where()) for row in rows)
        return newest[0] if newest else None

    def search(self, scope: str, vector: np.ndarray, k: int) -> list[ScopedMemory]:
        """The scope's `k` live memories nearest `vector` (dim,), best first, each with its `score`."""
        (hits,) = self.client.search(
            self.collection,
            data=[np.asarray(vector, dtype=np.float32).tolist()],
            anns_field="vector",
            filter=f"{field_equals('scope', scope)} and deleted == false",
            limit=k,
            output_fields=[name for name in FIELDS if name != "vector"],
            search_params={"metric_type": "IP"},
        )
        where = self._where()
        found = [dataclasses.replace(from_row(hit["entity"], where, with_vector=False), score=float(hit["distance"])) for hit in hits]
        newest = {memory.id: memory for memory in _newest(found)}
        return [memory for memory in found if newest.get(memory.id) is memory]

    def live(self, scope: str, limit: int | None = None, with_vector: bool = False) -> list[ScopedMemory]:
        """The scope's live memories, oldest first (by creation time, then id); with their vectors
        only when asked (a write of them needs them, a listing does not)."""
        rows = _newest(self._rows(field_equals("scope", scope), with_vector=with_vector))
        live = sorted((memory for memory in rows if not memory.deleted), key=lambda memory: (memory.created_at, memory.id))
        return live if limit is None else live[:limit]

    def _rows(self, expression: str, with_vector: bool) -> Iterator[ScopedMemory]:
        fields = [name for name in FIELDS if with_vector or name != "vector"]
        where = self._where()
        for batch in quiet_query_iterator(self.client, self.collection, expression, fields):
            yield from (from_row(row, where, with_vector=with_vector) for row in batch)

    def count(self) -> int:
        """Rows in the collection (a memory's earlier revisions are deleted as its next is written)."""
        return int(self.client.query(self.collection, filter="", output_fields=["count(*)"])[0]["count(*)"])

    # -- lifecycle ------------------------------------------------------------------------------------
    def clear(self) -> None:
        """Delete every row (`Memory.reset`); the collection stays, so other replicas keep working."""
        self.client.delete(self.collection, filter="revision >= 0")
        self.client.flush(self.collection)

    def flush(self) -> None:
        self.client.flush(self.collection)

    def close(self) -> None:
        if is_lite_uri(self.uri) and self._writes_since_flush:
            self.client.flush(self.collection)
        self.client.close()
        release(self.uri)

    def _where(self) -> str:
        return f"{self.uri}: collection {self.collection!r}"


def _schema(client: Any, dim: int) -> Any:
    from pymilvus import DataType

    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("row", DataType.VARCHAR, is_primary=True, max_length=MAX_ROW_BYTES)
    schema.add_field("id", DataType.VARCHAR, max_length=MAX_ID_BYTES)
    schema.add_field("revision", DataType.INT64)
    schema.add_field("scope", DataType.VARCHAR, max_length=MAX_SPEAKER_BYTES, is_partition_key=True)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
    schema.add_field("created_at", DataType.VARCHAR, max_length=MAX_TIMESTAMP_BYTES)
    schema.add_field("updated_at", DataType.VARCHAR, max_length=MAX_TIMESTAMP_BYTES)
    schema.add_field("deleted", DataType.BOOL)
    schema.add_field("history", DataType.JSON)
    schema.add_field("metadata", DataType.JSON)
    return schema


def _newest(memories: Iterable[ScopedMemory]) -> list[ScopedMemory]:
    """Each memory's newest revision, in first-seen order."""
    newest: dict[str, ScopedMemory] = {}
    for memory in memories:
        if memory.id not in newest or memory.revision > newest[memory.id].revision:
            newest[memory.id] = memory
    return list(newest.values())


def to_row(memory: ScopedMemory) -> dict[str, Any]:
    return {
        "row": memory.row,
        "id": memory.id,
        "revision": memory.revision,
        "scope": memory.scope,
        "vector": np.asarray(memory.vector, dtype=np.float32).tolist(),
        "text": memory.text,
        "created_at": memory.created_at,
        "updated_at": memory.updated_at,
        "deleted": memory.deleted,
        "history": {
            JSON_ITEMS: [{"action": r.action, "step": r.step, "text": r.text, "timestamp": r.timestamp} for r in memory.history]
        },
        # Milvus 2.3 servers take JSON objects only at the top level, so the value (a mapping or null) is wrapped.
        "metadata": {"value": None if memory.metadata is None else dict(memory.metadata)},
    }


def from_row(row: Mapping[str, Any], where: str, with_vector: bool = True) -> ScopedMemory:
    """A memory from a Milvus row; `MemoryBankError` naming the row and field if malformed."""
    try:
        history = tuple(
            Revision(r["action"], int(r["step"]), str(r["text"]), str(r["timestamp"]), ()) for r in json_items(row["history"])
        )
        metadata = row["metadata"]["value"]
        return ScopedMemory(
            id=str(row["id"]),
            scope=str(row["scope"]),
            text=str(row["text"]),
            vector=np.asarray(row["vector"], dtype=np.float32) if with_vector else np.empty(0, dtype=np.float32),
            created_at=str(row["created_at"]),
            updated_at=str(row["updated_at"]),
            deleted=bool(row["deleted"]),
            history=history,
            metadata=metadata,
            revision=int(row["revision"]),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise MemoryBankError(f"{where}: row {row.get('id')!r}: malformed field {error}") from error
