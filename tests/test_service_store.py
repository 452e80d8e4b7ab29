"""The service on the store the banks use (memr1/memory/stores.py): one collection for every scope, ids
that are time-ordered UUIDs, the same behaviour on Milvus Lite, Qdrant and ":memory:", and the layouts
of earlier versions (a collection per scope or per bank; the service's own schema) moved in with their
ids, history and metadata. Real Milvus Lite and Qdrant, the real MiniLM embedder; no model."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
import time
import uuid
from pathlib import Path

import pytest
from earlier_layouts import bank_history, write_milvus_bank_collection, write_qdrant_bank_collection, write_shared_service_collection

from memr1.memory import MemoryBank
from memr1.memory.records import with_metadata
from memr1.memory.stores import BANK_COLLECTION
from memr1.service.memory import Memory
from memr1.service.migrate import LEGACY_DATABASE, SHARED_COLLECTION_BEFORE, legacy_collection
from memr1.service.scopes import SERVICE_COLLECTION, is_memory_id, uuid7
from memr1.types import MemoryOp, OpKind


def test_ids_are_version_7_uuids_in_creation_order():
    first = [uuid7() for _ in range(500)]
    time.sleep(0.002)  # the next millisecond
    second = [uuid7() for _ in range(500)]
    assert len(set(first + second)) == 1000
    assert all(uuid.UUID(i).version == 7 and uuid.UUID(i).variant == uuid.RFC_4122 and is_memory_id(i) for i in first + second)
    assert max(first) < min(second)  # the leading 48 bits are the Unix milliseconds
    millis = int(uuid.UUID(second[0]).hex[:12], 16)
    assert abs(millis - time.time() * 1000) < 5_000
    assert not is_memory_id("not-an-id") and not is_memory_id(str(uuid.uuid4())) and is_memory_id("scope_" + "0" * 24 + ".m3")


def test_every_scope_is_a_partition_of_one_collection(tmp_path: Path, embedder):
    hostile = ['a" or scope != "x', "b\\", "c\nd", "ünï"]
    with Memory(tmp_path, embedder=embedder) as memory:
        for n in range(60):
            memory.add(f"user {n} likes tea number {n}", user_id=f"u{n}", infer=False)
        for user in hostile:
            memory.add(f"{user} owns a kite", user_id=user, infer=False)
        assert memory.store.client.list_collections() == [SERVICE_COLLECTION]
        assert memory.store.count() == 64
        for n in (0, 17, 59):
            hits = memory.search("tea", user_id=f"u{n}", top_k=10)["results"]
            assert [(h["memory"], h["user_id"]) for h in hits] == [(f"user {n} likes tea number {n}", f"u{n}")]
        for user in hostile:  # a scope that looks like filter syntax selects exactly its own row
            assert [h["memory"] for h in memory.search("kite", user_id=user, top_k=100)["results"]] == [f"{user.strip()} owns a kite"]
        assert memory.get_all(user_id="nobody")["results"] == [] and memory.search("tea", user_id="nobody")["results"] == []


def test_listings_are_oldest_first_and_survive_a_reopen(tmp_path: Path, embedder):
    with Memory(tmp_path, embedder=embedder) as memory:
        ids = [memory.add(f"note {n}", user_id="ann", infer=False)["results"][0]["id"] for n in range(5)]
        memory.delete(ids[1])
    with Memory(tmp_path, embedder=embedder) as reopened:
        assert [item["id"] for item in reopened.get_all(user_id="ann")["results"]] == [ids[0], *ids[2:]]
        assert [row["event"] for row in reopened.history(ids[1])] == ["ADD", "DELETE"]
        reopened.delete_all(user_id="ann")  # soft: each memory keeps its vector and history
        assert reopened.get_all(user_id="ann")["results"] == [] and reopened.search("note", user_id="ann")["results"] == []
        assert [row["event"] for row in reopened.history(ids[0])] == ["ADD", "DELETE"]
        reopened.restore(ids[0])
        assert [hit["id"] for hit in reopened.search("note 0", user_id="ann", top_k=5)["results"]] == [ids[0]]
        reopened.reset()  # every row goes; the collection (which other replicas may hold open) stays
        assert reopened.get_all(user_id="ann")["results"] == [] and reopened.get(ids[0]) is None
        assert reopened.store.count() == 0 and reopened.store.client.list_collections() == [SERVICE_COLLECTION]
        (again,) = reopened.add("note after the reset", user_id="ann", infer=False)["results"]
        assert [item["id"] for item in reopened.get_all(user_id="ann")["results"]] == [again["id"]]


def write_legacy_layout(path: Path, embedder) -> dict[str, str]:
    """What `memr1.Memory` wrote before the shared collection: a bank per scope, scopes and metadata
    in service.sqlite. Returns a few of its ids."""
    path.mkdir(parents=True, exist_ok=True)
    database = sqlite3.connect(path / LEGACY_DATABASE)
    database.execute("CREATE TABLE scopes (collection TEXT PRIMARY KEY, scope TEXT NOT NULL)")
    database.execute("CREATE TABLE metadata (id TEXT PRIMARY KEY, metadata TEXT NOT NULL)")
    ids = {}
    for scope in ("user_id=andrew", "user_id=maria&run_id=7"):
        collection = legacy_collection(scope)
        database.execute("INSERT INTO scopes VALUES (?, ?)", (collection, scope))
        write_milvus_bank_collection(str(path / "memories.db"), collection, bank_history(scope, embedder), embedder.dim)
        ids[scope] = (f"{collection}.m1", f"{collection}.m2")
    database.execute("INSERT INTO metadata VALUES (?, ?)", (ids["user_id=andrew"][0], json.dumps({"source": "chat"})))
    database.commit()
    database.close()
    return ids


def test_the_per_scope_layout_is_moved_in_with_its_ids(tmp_path: Path, embedder):
    path = tmp_path / "memories"
    ids = write_legacy_layout(path, embedder)
    backup = tmp_path / "service.sqlite.copy"
    shutil.copy(path / LEGACY_DATABASE, backup)
    with Memory(path, embedder=embedder) as memory:
        assert memory.store.client.list_collections() == [SERVICE_COLLECTION]  # the old collections are gone
        dogs, car = ids["user_id=andrew"]
        item = memory.get(dogs)
        assert (item["memory"], item["metadata"], item["user_id"]) == ("user_id=andrew adopted two dogs", {"source": "chat"}, "andrew")
        assert (item["created_at"], item["updated_at"]) == ("2024-01-01T00:00:00.000+00:00", "2024-01-03T00:00:00.000+00:00")
        assert [(row["event"], row["new_memory"]) for row in memory.history(dogs)] == [
            ("ADD", "user_id=andrew adopted a dog"), ("UPDATE", "user_id=andrew adopted two dogs"),
        ]
        assert memory.get(car) is None and memory.restore(car)["memory"] == "user_id=andrew sold a car"
        maria = memory.search("dogs", user_id="maria", run_id="7")["results"]
        assert [hit["id"] for hit in maria] == [ids["user_id=maria&run_id=7"][0]] and maria[0]["run_id"] == "7"
        count = memory.store.count()
    assert not (path / LEGACY_DATABASE).exists() and (path / f"{LEGACY_DATABASE}.migrated").exists()
    # As if a migration had stopped before its rename: opening again moves nothing twice.
    shutil.copy(backup, path / LEGACY_DATABASE)
    with Memory(path, embedder=embedder) as again:
        assert again.store.count() == count
        assert memory_texts(again, "andrew") == ["user_id=andrew adopted two dogs", "user_id=andrew sold a car"]
    # As if it had stopped after writing the rows, before dropping the old collections: the rows it
    # wrote are replaced, not doubled (the restore above is undone: the old layout had the car deleted).
    write_legacy_layout(path, embedder)
    with Memory(path, embedder=embedder) as third:
        assert third.store.count() == count
        assert memory_texts(third, "andrew") == ["user_id=andrew adopted two dogs"]


def memory_texts(memory: Memory, user: str) -> list[str]:
    return [item["memory"] for item in memory.get_all(user_id=user)["results"]]


@pytest.mark.parametrize("where", ["milvus-lite", "qdrant", ":memory:"])
def test_the_service_behaves_alike_on_every_store(tmp_path: Path, embedder, where: str):
    uri = {"milvus-lite": str(tmp_path / "m.db"), "qdrant": f"qdrant:{tmp_path / 'q'}", ":memory:": ":memory:"}[where]
    with Memory(tmp_path / "memories", uri=uri, embedder=embedder) as memory:
        (dog,) = memory.add("Andrew adopted a dog named Buddy", user_id="andrew", infer=False, metadata={"source": "chat"})["results"]
        (hike,) = memory.add("Andrew hikes on weekends", user_id="andrew", infer=False, timestamp=1_700_000_000)["results"]
        memory.add("Maria adopted a cat", user_id="maria", infer=False)
        assert [hit["memory"] for hit in memory.search("pets", user_id="andrew", top_k=5)["results"]][0] == "Andrew adopted a dog named Buddy"
        memory.update(dog["id"], text="Andrew adopted two dogs, Buddy and Scout", metadata={"source": "edit"})
        memory.delete(hike["id"])
        item = memory.get(dog["id"])
        assert (item["memory"], item["metadata"], item["user_id"]) == ("Andrew adopted two dogs, Buddy and Scout", {"source": "edit"}, "andrew")
        assert [i["id"] for i in memory.get_all(user_id="andrew")["results"]] == [dog["id"]]
        assert [row["event"] for row in memory.history(hike["id"])] == ["ADD", "DELETE"]
        assert memory.history(hike["id"])[0]["created_at"] == "2023-11-14T22:13:20.000+00:00"
        assert memory.restore(hike["id"])["memory"] == "Andrew hikes on weekends"
        assert [hit["memory"] for hit in memory.search("weekend hiking", user_id="andrew", top_k=1)["results"]] == ["Andrew hikes on weekends"]
        assert memory.store.count() == 3 and memory.get("not-an-id") is None
        memory.reset()
        assert memory.store.count() == 0 and memory.get_all(user_id="maria")["results"] == []


@pytest.mark.parametrize("where", ["milvus-lite", "qdrant"])
def test_a_bank_kept_in_its_own_collection_is_moved_in(tmp_path: Path, embedder, where: str):
    memories = bank_history("conv_26", embedder)
    if where == "qdrant":
        uri = f"qdrant:{tmp_path / 'banks'}"
        write_qdrant_bank_collection(str(tmp_path / "banks"), "conv_26", memories, embedder.dim)
    else:
        uri = str(tmp_path / "banks.db")
        write_milvus_bank_collection(uri, "conv_26", memories, embedder.dim)
    with MemoryBank.open(uri, "conv_26", embedder) as bank:
        assert [(e.id, e.text, e.timestamp) for e in bank.entries()] == [("m1", "conv_26 adopted two dogs", "2024-01-03T00:00:00.000+00:00")]
        assert [r.action for r in bank.history("m2")] == ["ADD", "DELETE"] and bank.step == 4
        assert bank.apply(MemoryOp(OpKind.ADD, "conv_26 moved to Denver", speaker="conv_26")).id == "m5"
    with MemoryBank.open(uri, "conv_26", embedder) as reopened:  # moved once: the old collection is gone
        assert [e.id for e in reopened.entries()] == ["m1", "m5"]
    if where == "milvus-lite":
        from pymilvus import MilvusClient

        client = MilvusClient(uri=uri)
        assert client.list_collections() == [BANK_COLLECTION]
        client.close()


def test_the_service_collection_of_its_own_schema_is_moved_in(tmp_path: Path, embedder):
    path = tmp_path / "memories"
    path.mkdir()
    scope = "user_id=andrew"
    ids = [uuid7(), uuid7()]
    dogs, car = (dataclasses.replace(m, entry=dataclasses.replace(m.entry, id=i)) for m, i in zip(bank_history(scope, embedder), ids))
    write_shared_service_collection(str(path / "memories.db"), [with_metadata(dogs, {"source": "chat"}), car], embedder.dim)
    with Memory(path, embedder=embedder) as memory:
        assert memory.store.client.list_collections() == [SERVICE_COLLECTION]
        item = memory.get(ids[0])
        assert (item["memory"], item["metadata"], item["created_at"], item["updated_at"]) == (
            "user_id=andrew adopted two dogs", {"source": "chat"}, "2024-01-01T00:00:00.000+00:00", "2024-01-03T00:00:00.000+00:00",
        )
        assert memory.get(ids[1]) is None and [row["event"] for row in memory.history(ids[1])] == ["ADD", "DELETE"]
        memory.update(ids[0], text="user_id=andrew adopted three dogs")  # the moved memory's next revision
        assert [row["event"] for row in memory.history(ids[0])] == ["ADD", "UPDATE", "UPDATE"]
        assert memory.store.count() == 2 and not memory.store.client.has_collection(SHARED_COLLECTION_BEFORE)
