"""One bank's Milvus collection: the store of record (a Milvus Lite `.db` directory or a server URI).

Each row is one memory, deleted ones included (deletes are soft). Rows are written before the
in-process index changes, so whatever a bank has acknowledged is stored: Milvus Lite appends every
write to its log and hands it to the OS before answering, so a killed process loses none of them.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# gRPC's C core prints to stderr when Milvus Lite's in-process server throttles pymilvus' keepalive
# pings during long idle stretches (an evaluation generating answers): "GOAWAY ... too_many_pings".
# The client reconnects by itself; real failures still reach Python as exceptions.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

from pymilvus import DataType, MilvusClient, MilvusException  # noqa: E402  (after GRPC_VERBOSITY)

from memr1.memory.errors import BankLockedError, MemoryBankError
from memr1.memory.expr import field_equals
from memr1.memory.records import (
    MAX_SPEAKER_BYTES,
    MAX_TEXT_BYTES,
    MAX_TIMESTAMP_BYTES,
    Revision,
    StoredMemory,
)
from memr1.quiet import DropMessages, messages_dropped
from memr1.types import MemoryEntry

log = logging.getLogger(__name__)

FIELDS = (
    "id", "vector", "text", "speaker", "timestamp", "provenance", "created_step", "updated_step", "deleted", "history"
)
MAX_ID_BYTES = 128
READ_BATCH = 2_000
_COLLECTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
# Milvus Lite 3.x keeps an flock on this file inside the .db directory while a process has it open.
_LITE_LOCK_FILE = "LOCK"
# Milvus Lite 3.x's per-segment index files (`<segment>.<field>.<type>.idx`, scalar ones `.sidx`):
# derived from the segment's data, rebuilt by a load that finds none.
_LITE_INDEX_FILES = ("collections/{collection}/partitions/*/indexes/*.idx", "collections/{collection}/partitions/*/indexes/*.sidx")
# JSON fields hold their list under this key: Milvus 2.3 servers accept only objects at the top level.
JSON_ITEMS = "items"

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
    """Reads and writes the rows of one collection (a `memr1.memory.records.RecordStore`)."""

    def __init__(self, client: MilvusClient, uri: str, collection: str) -> None:
        self.client = client
        self.uri = uri
        self.collection = collection

    @classmethod
    def open(cls, uri: str, collection: str, dim: int, token: str = "") -> MilvusStore:
        """Connect to `uri` (resolved by `resolve_uri`), create the collection if missing, check its
        schema and load it (Milvus Lite reopens collections unloaded)."""
        if not _COLLECTION_NAME.fullmatch(collection):
            raise ValueError(
                f"bank name {collection!r}: Milvus collection names are 1-255 letters, digits and "
                "underscores, not starting with a digit (e.g. 'conv_26' for conversation 'conv-26')"
            )
        client = open_collection(uri, token, collection, dim, FIELDS, "a memory bank", _bank_schema)
        return cls(client, uri, collection)

    def insert(self, memories: Sequence[StoredMemory]) -> None:
        self.client.insert(self.collection, [to_row(memory) for memory in memories])

    def upsert(self, memories: Sequence[StoredMemory]) -> None:
        self.client.upsert(self.collection, [to_row(memory) for memory in memories])

    def flush(self) -> None:
        """Seal buffered writes into segments. Milvus Lite searches unflushed rows far more slowly
        (measured: ~600 ms at 10k rows, ~40 ms once flushed), so bulk loads end with this."""
        self.client.flush(self.collection)

    def rows(self) -> Iterator[StoredMemory]:
        """Every stored memory, deleted ones included, in no particular order."""
        for batch in quiet_query_iterator(self.client, self.collection, "", list(FIELDS)):
            yield from (from_row(row, f"{self.uri}: collection {self.collection!r}") for row in batch)

    def search(self, vectors: np.ndarray, speaker: str | None, k: int) -> list[list[tuple[str, float]]]:
        """Milvus' own exact search over live rows: vectors (q, dim) float32 -> q lists of (id, score)."""
        expr = "deleted == false"
        if speaker is not None:
            expr += " and " + field_equals("speaker", speaker)
        results = self.client.search(
            self.collection,
            data=vectors.tolist(),
            anns_field="vector",
            filter=expr,
            limit=k,
            output_fields=["id"],
            search_params={"metric_type": "IP"},
        )
        return [[(hit["id"], float(hit["distance"])) for hit in hits] for hits in results]

    def close(self) -> None:
        self.client.close()
        release(self.uri)


def _bank_schema(client: MilvusClient, dim: int) -> Any:
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=MAX_ID_BYTES)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
    schema.add_field("speaker", DataType.VARCHAR, max_length=MAX_SPEAKER_BYTES)
    schema.add_field("timestamp", DataType.VARCHAR, max_length=MAX_TIMESTAMP_BYTES)
    schema.add_field("provenance", DataType.JSON)
    schema.add_field("created_step", DataType.INT64)
    schema.add_field("updated_step", DataType.INT64)
    schema.add_field("deleted", DataType.BOOL)
    schema.add_field("history", DataType.JSON)
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


def to_row(memory: StoredMemory) -> dict:
    entry = memory.entry
    return {
        "id": entry.id,
        "vector": memory.vector.tolist(),
        "text": entry.text,
        "speaker": entry.speaker,
        "timestamp": entry.timestamp,
        "provenance": {JSON_ITEMS: list(entry.provenance)},
        "created_step": entry.created_step,
        "updated_step": entry.updated_step,
        "deleted": memory.deleted,
        "history": {
            JSON_ITEMS: [
                {"action": rev.action, "step": rev.step, "text": rev.text, "timestamp": rev.timestamp,
                 "provenance": list(rev.provenance)}
                for rev in memory.history
            ]
        },
    }


def json_items(value: object) -> list:
    """The list inside a JSON field: `{"items": [...]}`, or a bare list as banks written before the
    wrapper (Milvus 2.3 servers refuse a JSON field whose top level is an array) hold it."""
    if isinstance(value, dict):
        return value[JSON_ITEMS]
    if isinstance(value, list):
        return value
    raise TypeError(f"expected a JSON list or {{{JSON_ITEMS!r}: [...]}}, got {type(value).__name__}")


def from_row(row: dict, where: str) -> StoredMemory:
    """A stored memory from a Milvus row; `MemoryBankError` naming the row and field if malformed."""
    row_id = row.get("id")
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
        history = tuple(
            Revision(r["action"], int(r["step"]), str(r["text"]), str(r["timestamp"]), tuple(map(str, r["provenance"])))
            for r in json_items(row["history"])
        )
        vector = np.asarray(row["vector"], dtype=np.float32)
        is_deleted = bool(row["deleted"])
    except (KeyError, TypeError, ValueError) as error:
        raise MemoryBankError(f"{where}: row {row_id!r}: malformed field {error}") from error
    return StoredMemory(entry, vector, deleted=is_deleted, history=history)
