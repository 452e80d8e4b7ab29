"""The store of memories that live only in the process: `uri=":memory:"`, as SQLite names an in-memory
database.

A bank already holds every record and its search index in the process; Milvus is what makes them
outlive it. Runs that rebuild their banks each time, machines without Milvus (a GPU image without
pymilvus and milvus-lite, whose wheels come to ~90 MB) and tests of the service use this store: it
keeps the records in a dict, searches them exactly with numpy, and nothing of it outlives the object.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from memr1.memory.index import top_k
from memr1.memory.records import StoredMemory, scored

MEMORY_URI = ":memory:"


class EphemeralStore:
    """A `RecordStore` in a dict: the same contract as Milvus', kept by nothing but this object."""

    uri = MEMORY_URI

    def __init__(self) -> None:
        self._memories: dict[tuple[str, str], StoredMemory] = {}

    def write(self, memories: Sequence[StoredMemory]) -> None:
        for memory in memories:
            self._memories[memory.scope, memory.id] = memory

    def rows(self, scope: str, with_vectors: bool = True) -> Iterator[StoredMemory]:
        return iter([memory for (owner, _), memory in self._memories.items() if owner == scope])

    def get(self, memory_id: str, scope: str | None = None) -> StoredMemory | None:
        if scope is not None:
            return self._memories.get((scope, memory_id))
        return next((memory for (_, owned), memory in self._memories.items() if owned == memory_id), None)

    def search(self, vectors: np.ndarray, scope: str, speaker: str | None, k: int) -> list[list[StoredMemory]]:
        live = [
            memory for (owner, _), memory in self._memories.items()
            if owner == scope and not memory.deleted and (speaker is None or memory.entry.speaker == speaker)
        ]
        if not live:
            return [[] for _ in vectors]
        scores = np.asarray(vectors, dtype=np.float32) @ np.stack([memory.vector for memory in live]).T  # (q, n)
        steps = np.array([memory.entry.created_step for memory in live], dtype=np.int64)
        return [[scored(live[i], float(row[i])) for i in top_k(row, steps, k)] for row in scores]

    def forget(self, scope: str, memory_ids: Sequence[str]) -> None:
        for memory_id in memory_ids:
            self._memories.pop((scope, memory_id), None)

    def clear(self) -> None:
        self._memories.clear()

    def count(self) -> int:
        return len(self._memories)

    def flush(self) -> None:
        """Nothing to seal."""

    def legacy_rows(self, name: str, scope: str) -> list[StoredMemory] | None:
        return None  # nothing outlives the process, so no earlier layout either

    def drop_legacy(self, name: str) -> None:
        raise KeyError(name)

    def close(self) -> None:
        """Nothing to release: the memories go with the object."""
