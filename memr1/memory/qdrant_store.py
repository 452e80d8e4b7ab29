"""Memories in Qdrant: a second store beside Milvus (`pip install 'memr1[qdrant]'`), the same contract.

Opened by URI: `qdrant:PATH` keeps the memories in a local directory (Qdrant's embedded mode: no
server, pure Python, one process per directory) and `qdrant+http://host:6333` (or `qdrant+https://`)
talks to a Qdrant server that several processes share. One collection holds every scope, the scope a
payload field (on a server, a keyword index marked as the tenant: Qdrant's documented multitenancy).
Each point is one memory, deleted ones included (deletes are soft, as in Milvus); its payload holds
the memory's fields and its Qdrant id is derived from its scope and id (Qdrant takes only UUIDs and
integers), so a new revision replaces the point in one upsert. Writes wait for Qdrant's
acknowledgement. Search is exact (the embedded mode scans; a server is asked to scan) over inner
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
from memr1.memory.records import StoredMemory, revision_item, revisions, scored
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


def point_id(scope: str, memory_id: str) -> str:
    return str(uuid.uuid5(_POINT_IDS, f"{scope}\x1f{memory_id}"))


class QdrantStore:
    """The memories of every scope in one Qdrant collection (a `memr1.memory.records.RecordStore`)."""

    def __init__(self, client: QdrantClient, uri: str, collection: str) -> None:
        self.client = client
        self.uri = uri
        self.collection = collection

    @classmethod
    def open(cls, uri: str, dim: int, token: str, collection: str) -> QdrantStore:
        """Connect to `uri` (resolved by `resolve_uri`), create the collection if missing and check its
        vectors' size; `BankLockedError` when another process holds a local directory."""
        client = _connect(uri, token)
        where = f"{uri}: collection {collection!r}"
        try:
            if not client.collection_exists(collection):
                client.create_collection(collection, vectors_config=models.VectorParams(size=dim, distance=models.Distance.DOT))
                if _is_server(uri):  # the embedded mode scans every point and has no payload index
                    scope_index = models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, is_tenant=True)
                    client.create_payload_index(collection, "scope", field_schema=scope_index)
                    for field, schema in (("id", models.PayloadSchemaType.KEYWORD), ("speaker", models.PayloadSchemaType.KEYWORD),
                                          ("deleted", models.PayloadSchemaType.BOOL)):
                        client.create_payload_index(collection, field, field_schema=schema)
            _check_size(client, collection, dim, where)
        except BaseException:
            _release(uri, client)
            raise
        return cls(client, uri, collection)

    def write(self, memories: Sequence[StoredMemory]) -> None:
        if memories:
            self.client.upsert(self.collection, points=[_to_point(memory) for memory in memories], wait=True)

    def rows(self, scope: str, with_vectors: bool = True) -> Iterator[StoredMemory]:
        return self._scroll(self.collection, _matching(scope=scope), with_vectors)

    def get(self, memory_id: str, scope: str | None = None) -> StoredMemory | None:
        if scope is not None:
            points = self.client.retrieve(self.collection, [point_id(scope, memory_id)], with_payload=True, with_vectors=True)
            return _from_point(points[0], self._where()) if points else None
        found = list(self._scroll(self.collection, _matching(id=memory_id), with_vectors=True))
        if len({memory.scope for memory in found}) > 1:
            raise MemoryBankError(f"{self._where()}: id {memory_id!r} names memories of {len(found)} scopes: give the scope")
        return found[0] if found else None

    def search(self, vectors: np.ndarray, scope: str, speaker: str | None, k: int) -> list[list[StoredMemory]]:
        wanted = _matching(scope=scope, deleted=False, **({} if speaker is None else {"speaker": speaker}))
        # A server searches its HNSW graph unless told to scan (the embedded mode always scans).
        exact = models.SearchParams(exact=True) if _is_server(self.uri) else None
        requests = [
            models.QueryRequest(query=vector.tolist(), filter=wanted, limit=k, with_payload=True, params=exact)
            for vector in np.asarray(vectors, dtype=np.float32)
        ]
        responses = self.client.query_batch_points(self.collection, requests=requests)
        where = self._where()
        return [[scored(_from_point(point, where), float(point.score)) for point in response.points] for response in responses]

    def forget(self, scope: str, memory_ids: Sequence[str]) -> None:
        if memory_ids:
            ids = [point_id(scope, memory_id) for memory_id in memory_ids]
            self.client.delete(self.collection, points_selector=models.PointIdsList(points=ids), wait=True)

    def clear(self) -> None:
        self.client.delete(self.collection, points_selector=models.FilterSelector(filter=models.Filter()), wait=True)

    def count(self) -> int:
        return self.client.count(self.collection, exact=True).count

    def flush(self) -> None:
        """Nothing to seal: an acknowledged write is searchable at once."""

    def legacy_rows(self, name: str, scope: str) -> list[StoredMemory] | None:
        if name == self.collection or not self.client.collection_exists(name):
            return None
        return list(self._scroll(name, None, with_vectors=True, scope=scope))

    def drop_legacy(self, name: str) -> None:
        self.client.delete_collection(name)

    def close(self) -> None:
        _release(self.uri, self.client)

    def _scroll(self, collection: str, wanted: models.Filter | None, with_vectors: bool, scope: str | None = None) -> Iterator[StoredMemory]:
        where = f"{self.uri}: collection {collection!r}"
        offset: Any = None
        while True:
            points, offset = self.client.scroll(
                collection, scroll_filter=wanted, limit=READ_BATCH, offset=offset, with_payload=True, with_vectors=with_vectors
            )
            yield from (_from_point(point, where, scope) for point in points)
            if offset is None:
                return

    def _where(self) -> str:
        return f"{self.uri}: collection {self.collection!r}"


def _matching(**values: object) -> models.Filter:
    return models.Filter(must=[models.FieldCondition(key=key, match=models.MatchValue(value=value)) for key, value in values.items()])


def _check_size(client: QdrantClient, collection: str, dim: int, where: str) -> None:
    vectors = client.get_collection(collection).config.params.vectors
    stored_dim = vectors.size if isinstance(vectors, models.VectorParams) else None
    if stored_dim != dim:
        raise MemoryBankError(f"{where}: vectors have size {stored_dim}, the embedder gives {dim}")


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
        "scope": memory.scope,
        "revision": memory.revision,
        "text": entry.text,
        "speaker": entry.speaker,
        "timestamp": entry.timestamp,
        "provenance": list(entry.provenance),
        "created_step": entry.created_step,
        "updated_step": entry.updated_step,
        "deleted": memory.deleted,
        "history": [revision_item(revision) for revision in memory.history],
        "metadata": None if memory.metadata is None else dict(memory.metadata),
    }
    return models.PointStruct(id=point_id(memory.scope, entry.id), vector=np.asarray(memory.vector, dtype=np.float32).tolist(), payload=payload)


def _from_point(point: models.Record | models.ScoredPoint, where: str, scope: str | None = None) -> StoredMemory:
    """A stored memory from a point; `MemoryBankError` naming the point and field if malformed.
    `scope` given: a point of the layout before scopes (a collection per bank), which has no scope,
    revision or metadata."""
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
        vector = np.asarray(point.vector if point.vector is not None else [], dtype=np.float32)
        return StoredMemory(
            scope=str(payload["scope"]) if scope is None else scope,
            entry=entry,
            vector=vector,
            deleted=bool(payload["deleted"]),
            history=revisions(payload["history"]),
            revision=int(payload["revision"]) if scope is None else 0,
            metadata=payload["metadata"] if scope is None else None,
        )
    except (KeyError, TypeError, ValueError) as error:
        raise MemoryBankError(f"{where}: point {point.id!r}: malformed field {error}") from error
