"""Memories kept by the service's earlier layouts, moved into its collection of the store with their ids.

Two layouts came before, both in Milvus:
- per scope (the first): a Milvus collection per scope (`scope_<24 hex of the scope's sha256>`, a
  training bank's layout then) beside `service.sqlite`, which named each collection's scope and held
  the client metadata by memory id (`scope_<hex>.m<step>`);
- shared, before the banks' records (`memr1_memories`): one collection for every scope, with the
  service's own schema (`created_at` / `updated_at` instead of the banks' fields).

Each memory moves with its id, text, vector, soft-delete flag, revisions and metadata, so clients keep
the ids they were given. A move is safe to interrupt: a scope's rows are written (what an interrupted
move wrote is first removed) before the old collection is dropped, and `service.sqlite` is renamed only
when every scope has moved; opening the path again finishes it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from memr1.memory.errors import MemoryBankError
from memr1.memory.records import RecordStore, StoredMemory, newest, revisions
from memr1.memory.stores import rewrite
from memr1.types import MemoryEntry

if TYPE_CHECKING:
    from memr1.memory.store import MilvusStore

log = logging.getLogger(__name__)

LEGACY_DATABASE = "service.sqlite"
MIGRATED_SUFFIX = ".migrated"
SHARED_COLLECTION_BEFORE = "memr1_memories"
_SHARED_FIELDS_BEFORE = ("id", "revision", "scope", "vector", "text", "created_at", "updated_at", "deleted", "history", "metadata")


def migrate_earlier_layouts(path: Path, store: RecordStore) -> int:
    """Move what the earlier layouts left under `path` (Milvus only: no other store had them) into
    `store`; the memories moved."""
    from memr1.memory.store import MilvusStore  # the earlier layouts were Milvus'

    if not isinstance(store, MilvusStore):
        return 0
    return migrate_scoped_collections(path, store) + migrate_shared_collection(store)


def migrate_scoped_collections(path: Path, store: RecordStore) -> int:
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
        legacy = store.legacy_rows(collection, scope)
        if legacy is None:
            continue  # moved by an earlier, interrupted migration (or never written)
        memories = [_renamed(memory, collection, metadata) for memory in legacy]
        rewrite(store, scope, memories)
        store.drop_legacy(collection)
        moved += len(memories)
    database.rename(database.with_name(LEGACY_DATABASE + MIGRATED_SUFFIX))
    log.info("%s: moved %d memories of %d scopes from per-scope collections", path, moved, len(scopes))
    return moved


def migrate_shared_collection(store: MilvusStore) -> int:
    """Move the shared collection of the service's own schema (if the store has one) in; the
    memories moved."""
    from memr1.memory.store import load_collection, quiet_query_iterator

    client = store.client
    if not client.has_collection(SHARED_COLLECTION_BEFORE):
        return 0
    load_collection(client, store.uri, SHARED_COLLECTION_BEFORE)
    where = f"{store.uri}: collection {SHARED_COLLECTION_BEFORE!r}"
    rows = (row for batch in quiet_query_iterator(client, SHARED_COLLECTION_BEFORE, "", list(_SHARED_FIELDS_BEFORE)) for row in batch)
    memories = newest(_from_shared_row(row, where) for row in rows)
    by_scope: dict[str, list[StoredMemory]] = {}
    for memory in memories:
        by_scope.setdefault(memory.scope, []).append(memory)
    for scope, owned in by_scope.items():
        rewrite(store, scope, owned)
    client.drop_collection(SHARED_COLLECTION_BEFORE)
    log.info("%s: moved %d memories of %d scopes from %r", store.uri, len(memories), len(by_scope), SHARED_COLLECTION_BEFORE)
    return len(memories)


def legacy_collection(scope: str) -> str:
    """The collection the per-scope layout kept `scope` in."""
    return "scope_" + hashlib.sha256(scope.encode()).hexdigest()[:24]


def _renamed(memory: StoredMemory, collection: str, metadata: Mapping[str, object]) -> StoredMemory:
    """A memory of the per-scope layout under the id the service gave it, its revisions numbered as
    the service numbers them (by position)."""
    memory_id = f"{collection}.{memory.entry.id}"
    history = tuple(dataclasses.replace(revision, step=number, provenance=()) for number, revision in enumerate(memory.history))
    entry = MemoryEntry(memory_id, memory.entry.text, memory.scope, memory.entry.timestamp, (), 0, len(history) - 1)
    return StoredMemory(memory.scope, entry, memory.vector, memory.deleted, history, metadata=metadata.get(memory_id))


def _from_shared_row(row: Mapping[str, Any], where: str) -> StoredMemory:
    try:
        history = revisions(row["history"]["items"])
        scope = str(row["scope"])
        entry = MemoryEntry(str(row["id"]), str(row["text"]), scope, str(row["updated_at"]), (), 0, len(history) - 1)
        vector = np.asarray(row["vector"], dtype=np.float32)
        return StoredMemory(scope, entry, vector, bool(row["deleted"]), history, int(row["revision"]), row["metadata"]["value"])
    except (KeyError, TypeError, ValueError) as error:
        raise MemoryBankError(f"{where}: row {row.get('id')!r}: malformed field {error}") from error
