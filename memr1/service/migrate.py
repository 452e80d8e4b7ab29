"""Memories kept by the per-scope layout (memr1 before the shared collection) moved into the store.

That layout kept one Milvus collection per scope (`scope_<24 hex of the scope's sha256>`) beside
`service.sqlite`, which named each collection's scope and held the client metadata by memory id
(`scope_<hex>.m<step>`). Each memory moves with its id, text, vector, soft-delete flag, revisions
and metadata, so clients keep the ids they were given. The move is safe to interrupt: a scope's rows
are written (an upsert by id: writing twice changes nothing) before its collection is dropped, and
`service.sqlite` is renamed only when every scope has moved; opening the path again finishes it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
from pathlib import Path

from memr1.memory.records import Revision, StoredMemory
from memr1.memory.store import MilvusStore
from memr1.service.store import ScopedMemory, ScopedStore

log = logging.getLogger(__name__)

LEGACY_DATABASE = "service.sqlite"
MIGRATED_SUFFIX = ".migrated"


def migrate_scoped_collections(path: Path, store: ScopedStore, dim: int) -> int:
    """Move the per-scope layout under `path` (if there is one) into `store`; the memories moved."""
    database = path / LEGACY_DATABASE
    if not database.is_file():
        return 0
    connection = sqlite3.connect(database)
    try:
        scopes = connection.execute("SELECT collection, scope FROM scopes ORDER BY collection").fetchall()
        metadata = {memory_id: json.loads(value) for memory_id, value in connection.execute("SELECT id, metadata FROM metadata")}
    finally:
        connection.close()
    moved = 0
    for collection, scope in scopes:
        if not store.client.has_collection(collection):
            continue  # moved by an earlier, interrupted migration (or never written)
        legacy = MilvusStore.open(store.uri, collection, dim)
        try:
            memories = [_moved(memory, collection, scope, metadata) for memory in legacy.rows()]
        finally:
            legacy.close()
        store.forget([memory.id for memory in memories])  # what an interrupted run of this wrote
        store.write(memories)
        store.flush()
        store.client.drop_collection(collection)
        moved += len(memories)
    database.rename(database.with_name(LEGACY_DATABASE + MIGRATED_SUFFIX))
    log.info("%s: moved %d memories of %d scopes from per-scope collections into %r", path, moved, len(scopes), store.collection)
    return moved


def legacy_collection(scope: str) -> str:
    """The collection the per-scope layout kept `scope` in."""
    return "scope_" + hashlib.sha256(scope.encode()).hexdigest()[:24]


def _moved(memory: StoredMemory, collection: str, scope: str, metadata: dict[str, object]) -> ScopedMemory:
    memory_id = f"{collection}.{memory.entry.id}"
    history = tuple(Revision(r.action, number, r.text, r.timestamp, ()) for number, r in enumerate(memory.history))
    return ScopedMemory(
        id=memory_id,
        scope=scope,
        text=memory.entry.text,
        vector=memory.vector,
        created_at=history[0].timestamp if history else memory.entry.timestamp,
        updated_at=memory.entry.timestamp,
        deleted=memory.deleted,
        history=history,
        metadata=metadata.get(memory_id),
    )
