"""What earlier versions of memr1 wrote, written here with the clients directly (the library no longer
writes these layouts, only moves them in): a training bank in a Milvus or Qdrant collection of its own,
and the service's shared Milvus collection of its own schema."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from memr1.embed import Embedder
from memr1.memory.records import StoredMemory, added, deleted, revision_item, updated
from memr1.types import MemoryOp, OpKind


def bank_history(scope: str, embedder: Embedder) -> list[StoredMemory]:
    """A dog adopted then a second one (an UPDATE), a car sold then deleted: four writes, dated."""
    def vector(text: str) -> np.ndarray:
        return embedder.encode([text])[0]

    dog = added(MemoryOp(OpKind.ADD, f"{scope} adopted a dog", speaker=scope, timestamp="2024-01-01T00:00:00.000+00:00"), scope, "m1", 1, vector(f"{scope} adopted a dog"))
    car = added(MemoryOp(OpKind.ADD, f"{scope} sold a car", speaker=scope, timestamp="2024-01-02T00:00:00.000+00:00"), scope, "m2", 2, vector(f"{scope} sold a car"))
    dogs = updated(dog, MemoryOp(OpKind.UPDATE, f"{scope} adopted two dogs", target_id="m1", timestamp="2024-01-03T00:00:00.000+00:00"), 3, vector(f"{scope} adopted two dogs"))
    return [dogs, deleted(car, 4)]


def _bank_row(memory: StoredMemory) -> dict:
    entry = memory.entry
    return {
        "id": entry.id, "vector": memory.vector.tolist(), "text": entry.text, "speaker": entry.speaker,
        "timestamp": entry.timestamp, "provenance": {"items": list(entry.provenance)},
        "created_step": entry.created_step, "updated_step": entry.updated_step, "deleted": memory.deleted,
        "history": {"items": [revision_item(revision) for revision in memory.history]},
    }


def write_milvus_bank_collection(uri: str, name: str, memories: Sequence[StoredMemory], dim: int) -> None:
    """A bank as memr1 kept it before scopes: its own collection, the memory id the primary key."""
    fields = [("id", "VARCHAR", {"is_primary": True, "max_length": 128}), ("vector", "FLOAT_VECTOR", {"dim": dim}),
              *[(name, "VARCHAR", {"max_length": 1024}) for name in ("text", "speaker", "timestamp")],
              ("provenance", "JSON", {}), ("created_step", "INT64", {}), ("updated_step", "INT64", {}),
              ("deleted", "BOOL", {}), ("history", "JSON", {})]
    _create_and_fill(uri, name, fields, [_bank_row(memory) for memory in memories])


def write_qdrant_bank_collection(path: str, name: str, memories: Sequence[StoredMemory], dim: int) -> None:
    from qdrant_client import QdrantClient, models

    client = QdrantClient(path=path)
    client.create_collection(name, vectors_config=models.VectorParams(size=dim, distance=models.Distance.DOT))
    points = []
    for memory in memories:
        payload = _bank_row(memory)
        vector = payload.pop("vector")
        payload["provenance"] = payload["provenance"]["items"]
        payload["history"] = payload["history"]["items"]
        points.append(models.PointStruct(id=str(uuid.uuid5(uuid.NAMESPACE_URL, memory.id)), vector=vector, payload=payload))
    client.upsert(name, points=points, wait=True)
    client.close()


def write_shared_service_collection(uri: str, memories: Sequence[StoredMemory], dim: int) -> None:
    """The service's shared collection before it held the banks' records (`memr1_memories`)."""
    fields = [("row", "VARCHAR", {"is_primary": True, "max_length": 96}), ("id", "VARCHAR", {"max_length": 64}),
              ("revision", "INT64", {}), ("scope", "VARCHAR", {"max_length": 1024, "is_partition_key": True}),
              ("vector", "FLOAT_VECTOR", {"dim": dim}),
              *[(name, "VARCHAR", {"max_length": 1024}) for name in ("text", "created_at", "updated_at")],
              ("deleted", "BOOL", {}), ("history", "JSON", {}), ("metadata", "JSON", {})]
    _create_and_fill(uri, "memr1_memories", fields, [
        {
            "row": f"{memory.id}/{memory.revision}", "id": memory.id, "revision": memory.revision, "scope": memory.scope,
            "vector": memory.vector.tolist(), "text": memory.entry.text, "created_at": memory.created_at,
            "updated_at": memory.entry.timestamp, "deleted": memory.deleted,
            "history": {"items": [{k: v for k, v in revision_item(r).items() if k != "provenance"} for r in memory.history]},
            "metadata": {"value": memory.metadata},
        }
        for memory in memories
    ])


def _create_and_fill(uri: str, name: str, fields: list[tuple[str, str, dict[str, Any]]], rows: list[dict]) -> None:
    """Create `name` with `fields` (name, DataType name, options) and exact inner-product search, as
    memr1 made it, insert `rows`, then let go of the file: stop this process's Milvus Lite server of
    `uri`, so that memr1 opens it afresh."""
    from pymilvus import DataType, MilvusClient

    client = MilvusClient(uri=uri)
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    for field, kind, options in fields:
        schema.add_field(field, DataType[kind], **options)
    index = client.prepare_index_params()
    index.add_index("vector", index_type="FLAT", metric_type="IP")
    client.create_collection(name, schema=schema, index_params=index, consistency_level="Strong")
    client.insert(name, rows)
    client.flush(name)
    client.close()
    if uri.endswith(".db"):
        from milvus_lite.server_manager import server_manager_instance

        server_manager_instance.release_server(uri)
