"""The service's store (memr1/service/store.py): one Milvus Lite collection for every scope, ids that are
time-ordered UUIDs, and the per-scope layout of earlier versions moved in with its ids, history and
metadata. Real Milvus Lite, the real MiniLM embedder; no model."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
import uuid
from pathlib import Path

from memr1.memory import MemoryBank
from memr1.service.memory import Memory
from memr1.service.migrate import LEGACY_DATABASE, legacy_collection
from memr1.service.store import COLLECTION, is_memory_id, uuid7
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
        assert memory.store.client.list_collections() == [COLLECTION]
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
        assert reopened.store.count() == 0 and reopened.store.client.list_collections() == [COLLECTION]
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
        with MemoryBank.open(path / "memories.db", collection, embedder) as bank:
            first = bank.apply(MemoryOp(OpKind.ADD, f"{scope} adopted a dog", speaker=scope, timestamp="2024-01-01T00:00:00.000+00:00"))
            second = bank.apply(MemoryOp(OpKind.ADD, f"{scope} sold a car", speaker=scope, timestamp="2024-01-02T00:00:00.000+00:00"))
            bank.apply(MemoryOp(OpKind.UPDATE, f"{scope} adopted two dogs", target_id=first.id, timestamp="2024-01-03T00:00:00.000+00:00"))
            bank.apply(MemoryOp(OpKind.DELETE, target_id=second.id, timestamp="2024-01-04T00:00:00.000+00:00"))
        ids[scope] = (f"{collection}.{first.id}", f"{collection}.{second.id}")
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
        assert memory.store.client.list_collections() == [COLLECTION]  # the old collections are gone
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
