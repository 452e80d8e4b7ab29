"""`memr1.Memory` in process, with the call shapes of Mem0 2.x beside 1.x's: `search(query, filters=)`
without a top-level id, `update(memory_id, text=, metadata=)`, `add(..., timestamp=)`. Real Milvus Lite
and the real MiniLM embedder; no model (every fact is ADDed)."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

import pytest

from memr1.service.async_memory import AsyncMemory
from memr1.service.memory import Memory
from memr1.service.scopes import MemoryNotFound, dialogue_time, from_unix, unix_of_dialogue_time


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


class CorrectingManager:
    """A Manager whose replies are fixed by the new fact's words: the shapes a trained Manager's
    replies take, and one that does not parse."""

    name = "correcting-manager"

    def complete(self, prompts, max_new_tokens):
        replies = []
        for prompt in prompts:
            fact = prompt[-1]["content"].rsplit("New fact: ", 1)[1]
            if "3 kids" in fact:
                replies.append('{"memory": [{"id": "0", "text": "Andrew has 3 kids", "event": "UPDATE", "old_memory": "x"}]}')
            elif "no longer" in fact:
                replies.append('{"memory": [{"id": "0", "event": "DELETE"}]}')
            elif "again" in fact:
                replies.append('{"memory": [{"id": "0", "event": "NONE"}]}')
            elif "gone" in fact:
                replies.append('{"memory": [{"id": "4", "text": "x", "event": "UPDATE"}]}')  # no memory 4 shown
            elif "garbled" in fact:
                replies.append('{"memory": [{"id": "0", "text": "Andrew has')  # cut off mid-object
            else:
                replies.append('{"memory": [{"id": "new", "text": "-", "event": "ADD"}]}')
        return replies


def test_each_write_says_what_the_manager_decided_and_no_fact_is_dropped(tmp_path, embedder):
    with Memory(tmp_path / "memories", embedder=embedder, manager=CorrectingManager()) as memory:
        (kids,) = memory.add("Andrew has 2 kids", user_id="andrew")["results"]
        assert (kids["event"], kids["memory"], kids["fact"]) == ("ADD", "Andrew has 2 kids", "Andrew has 2 kids")
        (update,) = memory.add("We had our third baby, so now Andrew has 3 kids", user_id="andrew")["results"]
        assert (update["event"], update["id"], update["memory"], update["previous_memory"]) == ("UPDATE", kids["id"], "Andrew has 3 kids", "Andrew has 2 kids")
        (same,) = memory.add("Andrew told us again about his kids", user_id="andrew")["results"]
        assert (same["event"], same["id"], same["memory"]) == ("NONE", kids["id"], "Andrew has 3 kids")
        assert [item["memory"] for item in memory.get_all(user_id="andrew")["results"]] == ["Andrew has 3 kids"]
        assert [(row["event"], row["old_memory"], row["new_memory"]) for row in memory.history(kids["id"])] == [
            ("ADD", None, "Andrew has 2 kids"), ("UPDATE", "Andrew has 2 kids", "Andrew has 3 kids"),
        ]
        (band,) = memory.add("My favorite band is Radiohead", user_id="maria")["results"]
        (deleted,) = memory.add("Maria no longer likes Radiohead", user_id="maria")["results"]
        assert (deleted["event"], deleted["id"], deleted["memory"]) == ("DELETE", band["id"], "My favorite band is Radiohead")
        assert memory.get_all(user_id="maria")["results"] == [] and memory.history(band["id"])[-1]["event"] == "DELETE"
        # A reply cut off, and an operation on a memory never shown (no id 4): neither parses, the fact is kept.
        for text, why in (("Andrew's garbled news", "did not parse \\(truncated_json\\)"), ("The old car is gone", "did not parse \\(unknown_id\\)")):
            (kept,) = memory.add(text, user_id="andrew")["results"]
            assert (kept["event"], kept["memory"]) == ("ADD", text)
            assert re.search(why, kept["reason"]), kept["reason"]
        assert len(memory.get_all(user_id="andrew")["results"]) == 3


def test_an_id_that_would_name_another_scope_is_refused(memory):
    memory.add("Andrew adopted a dog", user_id="andrew", agent_id="x", infer=False)
    with pytest.raises(ValueError, match="user_id: '&' is not allowed"):
        memory.search("dog", user_id="andrew&agent_id=x")
    with pytest.raises(ValueError, match="user_id: '&' is not allowed"):
        memory.add("Andrew adopted a cat", user_id="andrew&agent_id=x")
    assert len(memory.get_all(user_id="andrew", agent_id="x")["results"]) == 1


class GatedManager:
    """A Manager that, for the fact "held", waits until the test lets it go: while it waits, the event
    loop must go on serving other callers, or nobody would let it go."""

    name = "gated-manager"

    def __init__(self) -> None:
        self.entered, self.released = threading.Event(), threading.Event()

    def complete(self, prompts, max_new_tokens):
        if any(prompt[-1]["content"].endswith("New fact: held") for prompt in prompts):
            self.entered.set()
            assert self.released.wait(30), "the event loop was blocked: nobody released the Manager"
        return ['{"memory": [{"id": "new", "text": "-", "event": "ADD"}]}' for _ in prompts]


def test_async_memory_serves_other_callers_while_one_waits_on_its_model(tmp_path, embedder):
    manager = GatedManager()

    async def main() -> None:
        async with AsyncMemory(tmp_path / "memories", embedder=embedder, manager=manager) as memory:
            held = asyncio.create_task(memory.add("held", user_id="ann"))
            while not manager.entered.is_set():
                await asyncio.sleep(0.01)
            # Meanwhile, eight other callers write and read through the same model and store.
            written = await asyncio.gather(*(memory.add(f"note {n}", user_id=f"user{n}") for n in range(8)))
            assert [r["results"][0]["event"] for r in written] == ["ADD"] * 8
            assert (await memory.search("note", user_id="user3"))["results"][0]["memory"] == "note 3"
            assert not held.done()
            manager.released.set()
            (added,) = (await held)["results"]
            assert (await memory.get(added["id"]))["memory"] == "held"
            assert [row["event"] for row in await memory.history(added["id"])] == ["ADD"]

    asyncio.run(main())


def test_async_memory_takes_a_path_or_a_memory_never_both(tmp_path, embedder):
    with Memory(tmp_path / "memories", embedder=embedder) as shared:
        with pytest.raises(ValueError, match="not both"):
            AsyncMemory(tmp_path / "other", memory=shared)
        with pytest.raises(ValueError, match="are Memory's"):
            AsyncMemory(memory=shared, k=5)
        assert AsyncMemory(memory=shared).memory is shared


def test_session_times_read_and_shown_as_locomo_writes_them():
    # 8 May 2023 13:56 UTC is 1683554160 Unix seconds (19,485 days of 86,400 s, plus 13 h 56 min).
    assert unix_of_dialogue_time("1:56 pm on 8 May, 2023") == 19_485 * 86_400 + 13 * 3_600 + 56 * 60
    assert dialogue_time(from_unix(1_683_554_160)) == "1:56 pm on 8 May, 2023"
    assert dialogue_time("2023-05-08T00:05:00.000+00:00") == "12:05 am on 8 May, 2023"
    assert dialogue_time("2023-05-08T12:00:00+00:00") == "12:00 pm on 8 May, 2023"
    assert dialogue_time("yesterday") == "yesterday"
    with pytest.raises(ValueError, match="session time like '1:56 pm on 8 May, 2023', got '8 May'"):
        unix_of_dialogue_time("8 May")


class RecordingAnswerer:
    """An Answer Agent's model that keeps the prompts it is given and answers one word."""

    name = "recording-answerer"

    def __init__(self) -> None:
        self.prompts: list = []

    def complete(self, prompts, max_new_tokens):
        self.prompts.extend(prompts)
        return ["**Answer:** Buddy" for _ in prompts]


def test_the_answer_agent_reads_memory_dates_as_it_was_trained_to(tmp_path, embedder):
    answerer = RecordingAnswerer()
    with Memory(tmp_path / "memories", embedder=embedder, answerer=answerer, distill=False) as memory:
        memory.add("Andrew adopted a dog named Buddy", user_id="andrew", infer=False,
                   timestamp=unix_of_dialogue_time("1:56 pm on 8 May, 2023"))
        assert memory.answer("What is the dog's name?", user_id="andrew")["answer"] == "Buddy"
    (prompt,) = answerer.prompts
    assert "[1:56 pm on 8 May, 2023] Andrew adopted a dog named Buddy" in prompt[-1]["content"]
