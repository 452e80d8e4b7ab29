"""One bank's Qdrant collection: a second store of record beside Milvus (`pip install 'memr1[qdrant]'`).

Opened by URI: `qdrant:PATH` keeps the banks in a local directory (Qdrant's embedded mode: no server,
pure Python, one process per directory) and `qdrant+http://host:6333` (or `qdrant+https://`) talks to a
Qdrant server that several processes share. Each point is one memory, deleted ones included (deletes
are soft, as in Milvus); its payload holds the memory's fields and its Qdrant id is derived from the
memory id (Qdrant takes only UUIDs and integers). Writes wait for Qdrant's acknowledgement before the
bank's index changes. Search is exact (the embedded mode scans; a server is asked to scan) over inner
products of unit vectors, as Milvus' FLAT / IP index.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_client import QdrantClient, models

from memr1.memory.errors import BankLockedError, MemoryBankError
from memr1.memory.records import Revision, StoredMemory
from memr1.types import MemoryEntry

SCHEME = "qdrant"
READ_BATCH = 2_000
# Memory ids become Qdrant point ids through this namespace (uuid5: the same id, the same point).
_POINT_IDS = uuid.UUID("6f3c8d0e-5b7a-4f7e-9a61-2c1f0b9d4e21")

# One embedded client per directory in this process: Qdrant's embedded mode locks the directory, so
# every bank stored there shares it until the last one closes.
_local_clients: dict[str, tuple[QdrantClient, int]] = {}


def resolve_uri(uri: str) -> str:
    """`qdrant:PATH` with the path made absolute (one key per directory), or a server URI unchanged."""
    if uri.startswith(f"{SCHEME}+http://") or uri.startswith(f"{SCHEME}+https://"):
        return uri
    if uri.startswith(f"{SCHEME}:") and len(uri) > len(SCHEME) + 1:
        return f"{SCHEME}:{Path(uri[len(SCHEME) + 1:]).resolve()}"
    raise ValueError(f"Qdrant URI {uri!r}: expected qdrant:PATH (a local directory) or qdrant+http(s)://host:port")


def point_id(memory_id: str) -> str:
    return str(uuid.uuid5(_POINT_IDS, memory_id))


class QdrantStore:
    """Reads and writes the points of one collection (a `memr1.memory.records.RecordStore`)."""

    def __init__(self, client: QdrantClient, uri: str, collection: str) -> None:
        self.client = client
        self.uri = uri
        self.collection = collection

    @classmethod
    def open(cls, uri: str, collection: str, dim: int, token: str = "") -> QdrantStore:
        """Connect to `uri` (resolved by `resolve_uri`), create the collection if missing and check its
        vectors' size; `BankLockedError` when another process holds a local directory."""
        client = _connect(uri, token)
        where = f"{uri}: collection {collection!r}"
        try:
            if not client.collection_exists(collection):
                client.create_collection(collection, vectors_config=models.VectorParams(size=dim, distance=models.Distance.DOT))
                if _is_server(uri):  # the embedded mode scans every point and has no payload index
                    for field, schema in (("speaker", models.PayloadSchemaType.KEYWORD), ("deleted", models.PayloadSchemaType.BOOL)):
                        client.create_payload_index(collection, field, field_schema=schema)
            vectors = client.get_collection(collection).config.params.vectors
            stored_dim = vectors.size if isinstance(vectors, models.VectorParams) else None
            if stored_dim != dim:
                raise MemoryBankError(f"{where}: vectors have size {stored_dim}, the embedder gives {dim}")
        except BaseException:
            _release(uri, client)
            raise
        return cls(client, uri, collection)

    def insert(self, memories: Sequence[StoredMemory]) -> None:
        self.upsert(memories)  # a new memory's id is new: its point cannot exist

    def upsert(self, memories: Sequence[StoredMemory]) -> None:
        if memories:
            self.client.upsert(self.collection, points=[_to_point(memory) for memory in memories], wait=True)

    def flush(self) -> None:
        """Nothing to seal: an acknowledged write is searchable at once."""

    def rows(self) -> Iterator[StoredMemory]:
        """Every stored memory, deleted ones included, in no particular order."""
        offset: Any = None
        while True:
            points, offset = self.client.scroll(
                self.collection, limit=READ_BATCH, offset=offset, with_payload=True, with_vectors=True
            )
            yield from (_from_point(point, f"{self.uri}: collection {self.collection!r}") for point in points)
            if offset is None:
                return

    def search(self, vectors: np.ndarray, speaker: str | None, k: int) -> list[list[tuple[str, float]]]:
        """Qdrant's own exact search over live points: vectors (q, dim) float32 -> q lists of (id, score)."""
        conditions = [models.FieldCondition(key="deleted", match=models.MatchValue(value=False))]
        if speaker is not None:
            conditions.append(models.FieldCondition(key="speaker", match=models.MatchValue(value=speaker)))
        # A server searches its HNSW graph unless told to scan (the embedded mode always scans).
        exact = models.SearchParams(exact=True) if _is_server(self.uri) else None
        requests = [
            models.QueryRequest(query=vector.tolist(), filter=models.Filter(must=conditions), limit=k, with_payload=["id"], params=exact)
            for vector in vectors
        ]
        responses = self.client.query_batch_points(self.collection, requests=requests)
        return [[(str(point.payload["id"]), float(point.score)) for point in response.points] for response in responses]

    def close(self) -> None:
        _release(self.uri, self.client)


def _is_server(uri: str) -> bool:
    return uri.startswith(f"{SCHEME}+")


def _connect(uri: str, token: str) -> QdrantClient:
    if _is_server(uri):
        return QdrantClient(url=uri[len(SCHEME) + 1:], api_key=token or None)
    path = uri[len(SCHEME) + 1:]
    if path in _local_clients:
        client, users = _local_clients[path]
        _local_clients[path] = (client, users + 1)
        return client
    if not Path(path).parent.is_dir():
        raise FileNotFoundError(f"Qdrant path {path}: directory {Path(path).parent} does not exist")
    try:
        client = QdrantClient(path=path)
    except RuntimeError as error:  # the embedded mode's lock: "already accessed by another instance"
        if "already accessed" in str(error):
            raise BankLockedError(path, hint="give this process a different qdrant: directory") from error
        raise
    _local_clients[path] = (client, 1)
    return client


def _release(uri: str, client: QdrantClient) -> None:
    """A store closed its client: the last one on a local directory closes it (and its lock)."""
    if _is_server(uri):
        client.close()
        return
    path = uri[len(SCHEME) + 1:]
    shared, users = _local_clients[path]
    if users > 1:
        _local_clients[path] = (shared, users - 1)
        return
    del _local_clients[path]
    shared.close()


def _to_point(memory: StoredMemory) -> models.PointStruct:
    entry = memory.entry
    payload = {
        "id": entry.id,
        "text": entry.text,
        "speaker": entry.speaker,
        "timestamp": entry.timestamp,
        "provenance": list(entry.provenance),
        "created_step": entry.created_step,
        "updated_step": entry.updated_step,
        "deleted": memory.deleted,
        "history": [
            {"action": rev.action, "step": rev.step, "text": rev.text, "timestamp": rev.timestamp, "provenance": list(rev.provenance)}
            for rev in memory.history
        ],
    }
    return models.PointStruct(id=point_id(entry.id), vector=memory.vector.tolist(), payload=payload)


def _from_point(point: models.Record, where: str) -> StoredMemory:
    """A stored memory from a point; `MemoryBankError` naming the point and field if malformed."""
    payload = point.payload or {}
    try:
        entry = MemoryEntry(
            id=str(payload["id"]),
            text=str(payload["text"]),
            speaker=str(payload["speaker"]),
            timestamp=str(payload["timestamp"]),
            provenance=tuple(str(source) for source in payload["provenance"]),
            created_step=int(payload["created_step"]),
            updated_step=int(payload["updated_step"]),
        )
        history = tuple(
            Revision(r["action"], int(r["step"]), str(r["text"]), str(r["timestamp"]), tuple(map(str, r["provenance"])))
            for r in payload["history"]
        )
        vector = np.asarray(point.vector, dtype=np.float32)
        deleted = bool(payload["deleted"])
    except (KeyError, TypeError, ValueError) as error:
        raise MemoryBankError(f"{where}: point {point.id!r}: malformed field {error}") from error
    return StoredMemory(entry, vector, deleted=deleted, history=history)
