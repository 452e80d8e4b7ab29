"""Memories in Milvus (a Milvus Lite `.db` directory or a server URI): one collection holds every
scope, the scope its partition key.

Milvus' documented way to hold many tenants is one collection with a partition key, not a collection
per tenant: a new scope is then one row insert (about a millisecond) instead of a new collection (about
0.6 s), and a search filtered on the key reads only that key's partition. Training banks
(a scope per conversation) and the service (`memr1.service`, a scope per user) keep
the same records in the same layout; the store is the only copy the service reads, so several `memr1
serve` replicas on one Milvus server see each other's writes at once (Strong consistency).

Rows are versioned: a memory's row key is `<scope hash>/<id>/<revision>`, and a write inserts the next
revision, then deletes the earlier ones. Not an upsert: the 2.3 servers (the PyPI `milvus` package) put
upserted rows in the wrong partition of a partition-key collection, where a filter on the key never
finds them (measured: found after insert, lost after upsert). A process killed between the insert and
the delete leaves an earlier revision beside the new one: reads keep the newest, and the memory's next
write removes it. Milvus Lite appends every write to its log and hands it to the OS before answering,
so a killed process loses no acknowledged write.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# gRPC's C core prints to stderr when Milvus Lite's in-process server throttles pymilvus' keepalive
# pings during long idle stretches (an evaluation generating answers): "GOAWAY ... too_many_pings".
# The client reconnects by itself; real failures still reach Python as exceptions.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

from pymilvus import DataType, MilvusClient, MilvusException  # noqa: E402  (after GRPC_VERBOSITY)

from memr1.memory.errors import BankLockedError, MemoryBankError
from memr1.memory.expr import field_equals, string_literal
from memr1.memory.records import (
    MAX_SPEAKER_BYTES,
    MAX_TEXT_BYTES,
    MAX_TIMESTAMP_BYTES,
    StoredMemory,
    newest,
    newest_of_found,
    revision_item,
    revisions,
    scored,
)
from memr1.quiet import DropMessages, messages_dropped
from memr1.types import MemoryEntry

log = logging.getLogger(__name__)

FIELDS = (
    "row", "id", "revision", "scope", "speaker", "vector", "text", "timestamp", "provenance", "created_step",
    "updated_step", "deleted", "history", "metadata",
)
MAX_ID_BYTES = 128
MAX_ROW_BYTES = 160  # 16 hex of the scope's hash, the id, the revision
READ_BATCH = 2_000
DELETE_BATCH = 100  # earlier revisions removed per delete request
# Milvus Lite searches rows not yet sealed into a segment by brute force, and slowly (measured with
# 30k such rows: 1.1 s a search; 18 ms once flushed); a flush costs ~30-50 ms. So a Lite store flushes
# after this many writes. A server seals segments itself.
LITE_FLUSH_EVERY = 64
_COLLECTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
# Milvus Lite 3.x keeps an flock on this file inside the .db directory while a process has it open.
_LITE_LOCK_FILE = "LOCK"
# Milvus Lite 3.x's per-segment index files (`<segment>.<field>.<type>.idx`, scalar ones `.sidx`):
# derived from the segment's data, rebuilt by a load that finds none.
_LITE_INDEX_FILES = ("collections/{collection}/partitions/*/indexes/*.idx", "collections/{collection}/partitions/*/indexes/*.sidx")
# JSON fields hold their value under a key: Milvus 2.3 servers accept only objects at the top level.
JSON_ITEMS = "items"
JSON_VALUE = "value"

# A Milvus Lite server runs inside this process per open .db path; it stops when its last store closes,
# which releases the file lock for other processes.
_lite_users: dict[str, int] = {}

_ITERATOR_LOG = logging.getLogger("pymilvus.client.iterator.query_iterator")
_RPC_ERROR_LOG = logging.getLogger("pymilvus.decorators")
_LITE_SERVICER_LOG = logging.getLogger("milvus_lite.adapter.grpc.servicer")  # Milvus Lite's in-process server


class _LiteLockedFilter(logging.Filter):
    """Drops the traceback Milvus Lite logs when another process holds a `.db`'s lock: `connect` turns
    that failure into a `BankLockedError`, which the caller waits on (the ranks of one run building the
    same banks) or reports in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and type(record.exc_info[1]).__name__ == "DataDirLockedError")


# Milvus Lite's in-process gRPC server logs a traceback when pymilvus probes a method it lacks
# (AllocTimestamp): the client falls back, so the ERROR line would only alarm users.
logging.getLogger("grpc._server").addFilter(DropMessages("Method not implemented"))
logging.getLogger("milvus_lite.server_manager").addFilter(_LiteLockedFilter())


def is_lite_uri(uri: str) -> bool:
    return uri.endswith(".db")


def resolve_uri(uri: str | Path) -> str:
    """A `.db` path made absolute (one key per file), or a server URI unchanged."""
    uri = str(uri)
    if is_lite_uri(uri):
        return os.path.abspath(uri)
    if re.match(r"(https?|tcp)://|unix:", uri) is None:
        raise ValueError(
            f"Milvus URI {uri!r}: expected a local Milvus Lite path ending in .db or a server URI "
            "(http://host:port, https://..., tcp://..., unix:...)"
        )
    return uri


class MilvusStore:
    """The memories of every scope in one Milvus collection (a `memr1.memory.records.RecordStore`).

    Thread-safe as pymilvus' client is; callers serialise the read -> decide -> write of one scope."""

    def __init__(self, client: MilvusClient, uri: str, collection: str) -> None:
        self.client, self.uri, self.collection = client, uri, collection
        self._writes_since_flush = 0
        self._flush_lock = threading.Lock()

    @classmethod
    def open(cls, uri: str, dim: int, token: str, collection: str) -> MilvusStore:
        """Connect to `uri` (resolved by `resolve_uri`), create the collection if missing, check its
        schema and load it (Milvus Lite reopens collections unloaded)."""
        if not _COLLECTION_NAME.fullmatch(collection):
            raise ValueError(f"collection {collection!r}: Milvus collection names are 1-255 letters, digits and underscores")
        client = open_collection(uri, token, collection, dim, FIELDS, "a memr1 memory store", _schema)
        return cls(client, uri, collection)

    # -- writes ---------------------------------------------------------------------------------------
    def write(self, memories: Sequence[StoredMemory]) -> None:
        if not memories:
            return
        self.client.insert(self.collection, [to_row(memory) for memory in memories])
        earlier = [
            f"({field_equals('scope', m.scope)} and {field_equals('id', m.id)} and revision < {m.revision})"
            for m in memories if m.revision > 0
        ]
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

    def forget(self, scope: str, memory_ids: Sequence[str]) -> None:
        for start in range(0, len(memory_ids), DELETE_BATCH):
            ids = ", ".join(string_literal(memory_id) for memory_id in memory_ids[start : start + DELETE_BATCH])
            self.client.delete(self.collection, filter=f"{field_equals('scope', scope)} and id in [{ids}]")

    def clear(self) -> None:
        self.client.delete(self.collection, filter="revision >= 0")
        self.client.flush(self.collection)

    def flush(self) -> None:
        self.client.flush(self.collection)

    # -- reads ----------------------------------------------------------------------------------------
    def rows(self, scope: str, with_vectors: bool = True) -> Iterator[StoredMemory]:
        yield from newest(self._rows(field_equals("scope", scope), with_vectors))

    def get(self, memory_id: str, scope: str | None = None) -> StoredMemory | None:
        expression = field_equals("id", memory_id)
        if scope is not None:
            expression = f"{field_equals('scope', scope)} and {expression}"
        rows = self.client.query(self.collection, filter=expression, output_fields=list(FIELDS))
        found = [from_row(row, self._where()) for row in rows]
        scopes = {memory.scope for memory in found}
        if len(scopes) > 1:
            raise MemoryBankError(f"{self._where()}: id {memory_id!r} names memories of {len(scopes)} scopes: give the scope")
        memories = newest(found)
        return memories[0] if memories else None

    def search(self, vectors: np.ndarray, scope: str, speaker: str | None, k: int) -> list[list[StoredMemory]]:
        expression = f"{field_equals('scope', scope)} and deleted == false"
        if speaker is not None:
            expression += " and " + field_equals("speaker", speaker)
        results = self.client.search(
            self.collection,
            data=np.asarray(vectors, dtype=np.float32).tolist(),
            anns_field="vector",
            filter=expression,
            limit=k,
            output_fields=[name for name in FIELDS if name != "vector"],
            search_params={"metric_type": "IP"},
        )
        where = self._where()
        return [
            newest_of_found([scored(from_row(hit["entity"], where, with_vector=False), float(hit["distance"])) for hit in hits])
            for hits in results
        ]

    def count(self) -> int:
        return int(self.client.query(self.collection, filter="", output_fields=["count(*)"])[0]["count(*)"])

    def _rows(self, expression: str, with_vectors: bool) -> Iterator[StoredMemory]:
        fields = [name for name in FIELDS if with_vectors or name != "vector"]
        where = self._where()
        for batch in quiet_query_iterator(self.client, self.collection, expression, fields):
            yield from (from_row(row, where, with_vector=with_vectors) for row in batch)

    # -- the layout before scopes --------------------------------------------------------------------
    def legacy_rows(self, name: str, scope: str) -> list[StoredMemory] | None:
        """The memories of `name`, a collection of the layout before scopes (a collection per bank),
        given `scope`; None if there is no such collection."""
        if name == self.collection or not self.client.has_collection(name):
            return None
        legacy_fields = [field for field in FIELDS if field not in ("row", "revision", "scope", "metadata")]
        described = {field["name"] for field in self.client.describe_collection(name)["fields"]}
        if not set(legacy_fields) <= described:
            raise MemoryBankError(f"{self.uri}: collection {name!r} is not a memory bank of an earlier memr1: it cannot be moved into {self.collection!r}")
        load_collection(self.client, self.uri, name)
        where = f"{self.uri}: collection {name!r}"
        return [
            from_row(row, where, scope=scope)
            for batch in quiet_query_iterator(self.client, name, "", legacy_fields)
            for row in batch
        ]

    def drop_legacy(self, name: str) -> None:
        self.client.drop_collection(name)

    # -- lifecycle ------------------------------------------------------------------------------------
    def close(self) -> None:
        if is_lite_uri(self.uri) and self._writes_since_flush:
            self.client.flush(self.collection)
        self.client.close()
        release(self.uri)

    def _where(self) -> str:
        return f"{self.uri}: collection {self.collection!r}"


def _schema(client: MilvusClient, dim: int) -> Any:
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("row", DataType.VARCHAR, is_primary=True, max_length=MAX_ROW_BYTES)
    schema.add_field("id", DataType.VARCHAR, max_length=MAX_ID_BYTES)
    schema.add_field("revision", DataType.INT64)
    schema.add_field("scope", DataType.VARCHAR, max_length=MAX_SPEAKER_BYTES, is_partition_key=True)
    schema.add_field("speaker", DataType.VARCHAR, max_length=MAX_SPEAKER_BYTES)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
    schema.add_field("timestamp", DataType.VARCHAR, max_length=MAX_TIMESTAMP_BYTES)
    schema.add_field("provenance", DataType.JSON)
    schema.add_field("created_step", DataType.INT64)
    schema.add_field("updated_step", DataType.INT64)
    schema.add_field("deleted", DataType.BOOL)
    schema.add_field("history", DataType.JSON)
    schema.add_field("metadata", DataType.JSON)
    return schema


def open_collection(
    uri: str, token: str, collection: str, dim: int, fields: Sequence[str], kind: str, schema: Callable[[MilvusClient, int], Any]
) -> MilvusClient:
    """A client of `uri` with `collection` loaded: created with `schema(client, dim)` and an exact (FLAT,
    inner product) vector index if missing (another process creating it first is fine), else checked
    to have `fields` and vectors of `dim` (`MemoryBankError` naming `kind` otherwise). The connection
    is released if anything fails. Strong consistency: a read sees every write acknowledged before it."""
    client = connect(uri, token)
    where = f"{uri}: collection {collection!r}"
    try:
        if not client.has_collection(collection):
            index_params = client.prepare_index_params()
            # FLAT: exact search. HNSW / IVF lose recall under a filter (a speaker's, a scope's).
            index_params.add_index("vector", index_type="FLAT", metric_type="IP")
            try:
                client.create_collection(collection, schema=schema(client, dim), index_params=index_params, consistency_level="Strong")
            except MilvusException:
                if not client.has_collection(collection):
                    raise
        described = {field["name"]: field for field in client.describe_collection(collection)["fields"]}
        missing = [name for name in fields if name not in described]
        if missing:
            raise MemoryBankError(f"{where}: not {kind}, fields missing: {', '.join(missing)}")
        stored_dim = int(described["vector"]["params"]["dim"])
        if stored_dim != dim:
            raise MemoryBankError(f"{where}: vectors have dim {stored_dim}, the embedder gives {dim}")
        load_collection(client, uri, collection)
    except BaseException:
        client.close()
        release(uri)
        raise
    return client


def load_collection(client: MilvusClient, uri: str, collection: str) -> None:
    """Load `collection`; on a Milvus Lite path whose load fails, rebuild its index files from the data
    and load again. Milvus Lite writes an index file in place from a background thread after each
    flush, so a process killed then (say, right after a bank write) leaves one empty or short, and every
    later load fails on it ("No data left in file"); the data and manifest it indexes are written
    atomically, so deleting the index files loses nothing."""
    try:
        # pymilvus and Milvus Lite's server each log a failed load as an ERROR with its traceback; here it
        # is either repaired, with the warning below that says why, or raised to the caller, message and all.
        with messages_dropped(_RPC_ERROR_LOG, "[load_collection]"), messages_dropped(_LITE_SERVICER_LOG, "LoadCollection failed"):
            client.load_collection(collection)
    except MilvusException as error:
        index_files = lite_index_files(uri, collection) if is_lite_uri(uri) else []
        if not index_files:
            raise
        log.warning(
            "%s: collection %r did not load (%s); rebuilding its %d index file(s) from the data (a process "
            "killed while Milvus Lite was writing one leaves it torn): %s",
            uri, collection, error.message, len(index_files), ", ".join(str(path) for path in index_files),
        )
        for path in index_files:
            path.unlink()
        client.load_collection(collection)


def lite_index_files(uri: str, collection: str) -> list[Path]:
    """The index files of `collection` in the Milvus Lite directory `uri` (none for another layout)."""
    return sorted(path for pattern in _LITE_INDEX_FILES for path in Path(uri).glob(pattern.format(collection=collection)))


def quiet_query_iterator(client: MilvusClient, collection: str, expression: str, fields: list[str]) -> Iterator[list[dict]]:
    """The rows matching `expression`, `READ_BATCH` at a time, without pymilvus' session-timestamp warning."""
    # pymilvus warns that the server gave no session timestamp: Milvus Lite and 2.3 servers never give
    # one and their reads see every acknowledged write anyway; it would repeat on every open.
    with messages_dropped(_ITERATOR_LOG, "failed to get mvccTs"):
        iterator = client.query_iterator(collection, batch_size=READ_BATCH, filter=expression, output_fields=fields)
    try:
        while batch := iterator.next():
            yield batch
    finally:
        iterator.close()


def connect(uri: str, token: str = "") -> MilvusClient:
    """A client of `uri` (resolved by `resolve_uri`); for a Milvus Lite path, its in-process server is
    shared by this process's stores until the last calls `release`. `BankLockedError` when another
    process holds the file."""
    if not is_lite_uri(uri):
        return MilvusClient(uri=uri, token=token)
    if not Path(uri).parent.is_dir():
        raise FileNotFoundError(f"Milvus Lite path {uri}: directory {Path(uri).parent} does not exist")
    try:
        client = MilvusClient(uri=uri)
    except MilvusException as error:
        if _lite_lock_held(uri):
            raise BankLockedError(uri) from error
        raise
    _lite_users[uri] = _lite_users.get(uri, 0) + 1
    return client


def _lite_lock_held(path: str) -> bool:
    """Whether another process holds the Milvus Lite lock of `path` (probed only after a failed open:
    had this process owned the file, pymilvus would have reused its server)."""
    import fcntl

    lock_file = Path(path) / _LITE_LOCK_FILE
    if not lock_file.exists():
        return False
    with open(lock_file, "rb") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def release(uri: str) -> None:
    """A store of `uri` closed its client: the last one on a Milvus Lite path stops its server."""
    if not is_lite_uri(uri):
        return
    _lite_users[uri] -= 1
    if _lite_users[uri] == 0:
        del _lite_users[uri]
        from milvus_lite.server_manager import server_manager_instance

        server_manager_instance.release_server(uri)


def row_key(memory: StoredMemory) -> str:
    return f"{hashlib.blake2b(memory.scope.encode(), digest_size=8).hexdigest()}/{memory.id}/{memory.revision}"


def to_row(memory: StoredMemory) -> dict:
    entry = memory.entry
    return {
        "row": row_key(memory),
        "id": entry.id,
        "revision": memory.revision,
        "scope": memory.scope,
        "speaker": entry.speaker,
        "vector": np.asarray(memory.vector, dtype=np.float32).tolist(),
        "text": entry.text,
        "timestamp": entry.timestamp,
        "provenance": {JSON_ITEMS: list(entry.provenance)},
        "created_step": entry.created_step,
        "updated_step": entry.updated_step,
        "deleted": memory.deleted,
        "history": {JSON_ITEMS: [revision_item(revision) for revision in memory.history]},
        "metadata": {JSON_VALUE: None if memory.metadata is None else dict(memory.metadata)},
    }


def json_items(value: object) -> list:
    """The list inside a JSON field: `{"items": [...]}`, or a bare list as banks written before the
    wrapper (Milvus 2.3 servers refuse a JSON field whose top level is an array) hold it."""
    if isinstance(value, dict):
        return value[JSON_ITEMS]
    if isinstance(value, list):
        return value
    raise TypeError(f"expected a JSON list or {{{JSON_ITEMS!r}: [...]}}, got {type(value).__name__}")


def from_row(row: Mapping[str, Any], where: str, with_vector: bool = True, scope: str | None = None) -> StoredMemory:
    """A stored memory from a Milvus row; `MemoryBankError` naming the row and field if malformed.
    `scope` given: a row of the layout before scopes (a collection per bank), which has no scope,
    revision or metadata."""
    try:
        entry = MemoryEntry(
            id=str(row["id"]),
            text=str(row["text"]),
            speaker=str(row["speaker"]),
            timestamp=str(row["timestamp"]),
            provenance=tuple(str(source) for source in json_items(row["provenance"])),
            created_step=int(row["created_step"]),
            updated_step=int(row["updated_step"]),
        )
        vector = np.asarray(row["vector"], dtype=np.float32) if with_vector else np.empty(0, dtype=np.float32)
        return StoredMemory(
            scope=str(row["scope"]) if scope is None else scope,
            entry=entry,
            vector=vector,
            deleted=bool(row["deleted"]),
            history=revisions(json_items(row["history"])),
            revision=int(row["revision"]) if scope is None else 0,
            metadata=row["metadata"][JSON_VALUE] if scope is None else None,
        )
    except (KeyError, TypeError, ValueError) as error:
        raise MemoryBankError(f"{where}: row {row.get('id')!r}: malformed field {error}") from error
