"""`memr1.Memory` in process, with the call shapes of Mem0 2.x beside 1.x's: `search(query, filters=)`
without a top-level id, `update(memory_id, text=, metadata=)`, `add(..., timestamp=)`. Real Milvus Lite
and the real MiniLM embedder; no model (every fact is ADDed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memr1.service.memory import Memory
from memr1.service.scopes import MemoryNotFound


@pytest.fixture()
def memory(tmp_path: Path, embedder) -> Memory:
    with Memory(tmp_path / "memories", embedder=embedder) as opened:
        yield opened


def test_mem0_2x_call_shapes(memory):
    # 2023-11-14T22:13:20 UTC: Mem0 2.x dates a memory by Unix seconds.
    (added,) = memory.add([{"role": "user", "content": "Andrew adopted a dog named Buddy"}], user_id="andrew",
                          metadata={"source": "chat"}, timestamp=1_700_000_000)["results"]
    item = memory.get(added["id"])
    assert item["created_at"] == item["updated_at"] == "2023-11-14T22:13:20.000+00:00"
    # search and get_all by filters alone, as 2.x calls them.
    (hit,) = memory.search("pets", filters={"user_id": "andrew"})["results"]
    assert hit["id"] == added["id"] and memory.get_all(filters={"user_id": "andrew"})["results"][0]["id"] == added["id"]
    assert memory.search("pets", filters={"user_id": "maria"}) == {"results": []}
    # update by text= and metadata= (2.x), by data (1.x), and metadata alone.
    memory.update(added["id"], text="Andrew adopted Buddy and Scout", metadata={"source": "edit"})
    item = memory.get(added["id"])
    assert (item["memory"], item["metadata"]) == ("Andrew adopted Buddy and Scout", {"source": "edit"})
    memory.update(added["id"], "Andrew has two dogs")
    memory.update(added["id"], metadata={"verified": True})
    item = memory.get(added["id"])
    assert (item["memory"], item["metadata"]) == ("Andrew has two dogs", {"verified": True})
    assert [row["new_memory"] for row in memory.history(added["id"])] == [
        "Andrew adopted a dog named Buddy", "Andrew adopted Buddy and Scout", "Andrew has two dogs",
    ]


def test_bad_2x_arguments_are_refused_before_anything_is_written(memory):
    (added,) = memory.add("Maria volunteers at the shelter", user_id="maria")["results"]
    for kwargs, message in [
        ({}, "give text \\(or data\\) and / or metadata"),
        ({"data": "a", "text": "b"}, "data and text are the same argument"),
        ({"text": "  "}, "text: expected a non-empty string"),
        ({"text": "fine", "metadata": ["not", "a", "mapping"]}, "metadata: expected a mapping"),
    ]:
        with pytest.raises(ValueError, match=message):
            memory.update(added["id"], **kwargs)
    assert [row["event"] for row in memory.history(added["id"])] == ["ADD"]  # nothing written
    with pytest.raises(MemoryNotFound):
        memory.update(f"{added['id']}0", metadata={"x": 1})
    for bad in (-1, float("nan"), float("inf"), 1e20, True):
        with pytest.raises(ValueError, match="timestamp"):
            memory.add("Maria runs", user_id="maria", timestamp=bad)
    assert len(memory.get_all(user_id="maria")["results"]) == 1


class RewritingManager:
    """A Manager that ADDs every fact under a rewrite of its own, as the lift's 135M SFT Manager did
    for 48% of its ADDs (docs/cpu_lift.md)."""

    name = "rewriting-manager"

    def complete(self, prompts, max_new_tokens):
        return ['{"memory": [{"id": "new", "text": "Andrew has a pet", "event": "ADD"}]}' for _ in prompts]


@pytest.mark.parametrize(("add_text", "stored"), [("fact", "Andrew adopted a dog named Buddy"), ("model", "Andrew has a pet")])
def test_what_the_managers_add_stores(tmp_path, embedder, add_text, stored):
    with Memory(tmp_path / "memories", embedder=embedder, manager=RewritingManager(), add_text=add_text) as memory:
        (added,) = memory.add("Andrew adopted a dog named Buddy", user_id="andrew")["results"]
        assert (added["event"], added["memory"]) == ("ADD", stored)
        assert [item["memory"] for item in memory.get_all(user_id="andrew")["results"]] == [stored]
