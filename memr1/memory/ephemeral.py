"""The store of banks that live only in memory: `uri=":memory:"`, as SQLite names an in-memory database.

A bank already holds every record and its search index in the process; Milvus is what makes them
outlive it. Runs that rebuild their banks each time and machines without Milvus (a GPU image without
pymilvus and milvus-lite, whose wheels come to ~90 MB) use this store: writes go nowhere, a reopened
bank starts empty, and nothing imports pymilvus.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from memr1.memory.errors import MemoryBankError
from memr1.memory.records import StoredMemory

MEMORY_URI = ":memory:"


class EphemeralStore:
    """A `RecordStore` that keeps nothing beyond the bank that owns it."""

    uri = MEMORY_URI

    def __init__(self, collection: str) -> None:
        self.collection = collection

    def insert(self, memories: Sequence[StoredMemory]) -> None:
        pass

    def upsert(self, memories: Sequence[StoredMemory]) -> None:
        pass

    def flush(self) -> None:
        pass

    def rows(self) -> Iterator[StoredMemory]:
        return iter(())

    def search(self, vectors: np.ndarray, speaker: str | None, k: int) -> list[list[tuple[str, float]]]:
        raise MemoryBankError(f"bank {self.collection!r} lives in memory ({MEMORY_URI}): there is no store to search")

    def close(self) -> None:
        pass
