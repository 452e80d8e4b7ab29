"""Stores opened by URI, and the move of banks kept in the layout before scopes.

    ":memory:"                    the process only (`EphemeralStore`)
    "banks.db", "http://host:19530"  Milvus: a Lite file or a server (`MilvusStore`)
    "qdrant:DIR", "qdrant+http://host:6333"  Qdrant, embedded or a server (`QdrantStore`, the `qdrant` extra)

Each backend is imported only when its URI is opened: a run on ":memory:" never imports pymilvus.
"""

from __future__ import annotations

import logging
from pathlib import Path

from memr1.memory.ephemeral import MEMORY_URI, EphemeralStore
from memr1.memory.records import RecordStore, StoredMemory

log = logging.getLogger(__name__)

BANK_COLLECTION = "memr1_banks"


def resolve_store_uri(uri: str | Path) -> str:
    """The URI's canonical form (paths absolute): one key per store, whichever way it was spelt."""
    uri = str(uri)
    if uri == MEMORY_URI:
        return uri
    if uri.startswith("qdrant"):
        from memr1.memory import qdrant_store

        return qdrant_store.resolve_uri(uri)
    from memr1.memory import store

    return store.resolve_uri(uri)


def open_store(uri: str | Path, dim: int, *, collection: str = BANK_COLLECTION, token: str = "") -> RecordStore:
    """The store at `uri` (see the module docstring), its `collection` created if missing and checked
    for vectors of `dim`."""
    resolved = resolve_store_uri(uri)
    if resolved == MEMORY_URI:
        return EphemeralStore()
    if resolved.startswith("qdrant"):
        from memr1.memory.qdrant_store import QdrantStore

        return QdrantStore.open(resolved, dim, token, collection)
    from memr1.memory.store import MilvusStore

    return MilvusStore.open(resolved, dim, token, collection)


def move_legacy_bank(store: RecordStore, name: str) -> int:
    """Move the bank `name` kept by the layout before scopes (its own collection) into `store` as the
    scope `name`, if there is one; the memories moved. Safe to interrupt: the scope's rows are written
    (what an interrupted move wrote is first removed) before the old collection is dropped, and the
    next open finishes the move."""
    memories = store.legacy_rows(name, scope=name)
    if memories is None:
        return 0
    rewrite(store, name, memories)
    store.drop_legacy(name)
    log.info("%s: moved bank %r (%d memories) from its own collection into the shared one", store.uri, name, len(memories))
    return len(memories)


def rewrite(store: RecordStore, scope: str, memories: list[StoredMemory]) -> None:
    """Write `memories` of `scope` as they are, first removing whatever is stored under their ids (what
    an interrupted move of them wrote: Milvus would keep a second row of the same key)."""
    store.forget(scope, [memory.id for memory in memories])
    store.write(memories)
    store.flush()
