"""Memory banks on real Milvus Lite (in tmp_path) with the real MiniLM embedder; the store contract
(every test on the `store_uri` fixture) also on Qdrant's embedded mode, the second backend.

About 45 s of CPU on 2 cores (more wall time when the machine is shared): 10-15 s loading MiniLM
once per session, as much again for the SIGKILL test's child process (it imports sentence-transformers).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from memr1.embed import Embedder
from memr1.memory import (
    BankLockedError,
    InvalidOpError,
    MemoryBank,
    MemoryBankError,
    MemoryView,
    StaleForkError,
    UnknownMemoryError,
)
from memr1.memory.expr import field_equals, string_literal
from memr1.memory.index import Hit, VectorIndex, merge_hits, top_k
from memr1.memory.store import lite_index_files
from memr1.memory.stores import BANK_COLLECTION
from memr1.types import MemoryEntry, MemoryOp, OpKind

REPO = Path(__file__).resolve().parents[1]


def add(text: str, speaker: str, provenance: tuple[str, ...] = (), timestamp: str = "") -> MemoryOp:
    return MemoryOp(OpKind.ADD, text, speaker=speaker, provenance=provenance, timestamp=timestamp)


@pytest.fixture(params=["milvus-lite", "qdrant"])
def store_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where banks are stored: a Milvus Lite file, or a directory of Qdrant's embedded mode."""
    if request.param == "qdrant":
        return f"qdrant:{tmp_path / 'banks.qdrant'}"
    return str(tmp_path / "banks.db")


@pytest.fixture
def bank(store_uri: str, embedder: Embedder) -> Iterator[MemoryBank]:
    with MemoryBank.open(store_uri, "conv_26", embedder) as opened:
        yield opened


def snapshot(view: MemoryView) -> list[tuple]:
    """Everything observable about live memories: entries in creation order."""
    return [
        (e.id, e.text, e.speaker, e.timestamp, e.provenance, e.created_step, e.updated_step) for e in view.entries()
    ]


# --- the index's maths -----------------------------------------------------------------------------


def test_top_k_breaks_ties_by_step_and_skips_excluded_rows() -> None:
    scores = np.array([0.5, 0.9, 0.5, -np.inf, 0.7, 0.5], dtype=np.float32)
    steps = np.array([6, 2, 3, 1, 5, 4], dtype=np.int64)
    assert top_k(scores, steps, 3).tolist() == [1, 4, 2]  # the three 0.5s tie at the cut: step 3 wins
    assert top_k(scores, steps, 10).tolist() == [1, 4, 2, 5, 0]  # row 3 is excluded (-inf)
    assert top_k(scores, steps, 0).tolist() == []


def test_merge_hits_orders_by_score_then_step() -> None:
    bank_hits = [Hit(0.8, 3, "m3"), Hit(0.5, 1, "m1")]
    fork_hits = [Hit(0.8, 2, "f1.m2"), Hit(0.6, 9, "f1.m9")]
    assert merge_hits([bank_hits, fork_hits], 3) == [Hit(0.8, 2, "f1.m2"), Hit(0.8, 3, "m3"), Hit(0.6, 9, "f1.m9")]


def test_vector_index_put_replace_remove_and_exclude() -> None:
    index = VectorIndex(dim=2)
    index.put("a", "Sam", 1, np.array([1.0, 0.0]))
    index.put("b", "Sam", 2, np.array([0.0, 1.0]))
    index.put("c", "Tia", 3, np.array([0.6, 0.8]))
    query = np.array([[1.0, 0.0]])

    def ranked(speaker: str | None, exclude: tuple[str, ...] = ()) -> list[tuple[str, float]]:
        return [(hit.id, round(hit.score, 6)) for hit in index.search(query, speaker, 3, exclude)[0]]

    assert ranked(None) == [("a", 1.0), ("c", 0.6), ("b", 0.0)]
    assert ranked("Sam") == [("a", 1.0), ("b", 0.0)]
    index.remove("a")  # "b" moves into row 0
    index.put("b", "Sam", 2, np.array([0.8, 0.6]))  # replaced in place
    assert ranked(None) == [("b", 0.8), ("c", 0.6)]
    assert ranked(None, exclude=("b",)) == [("c", 0.6)]
    index.put("c", "Sam", 3, np.array([0.6, 0.8]))  # moved to another speaker's partition
    assert ranked("Tia") == [] and ranked("Sam") == [("b", 0.8), ("c", 0.6)] and len(index) == 2


# --- operations ------------------------------------------------------------------------------------


def test_update_merges_buddy_and_scout_into_one_memory(bank: MemoryBank, embedder: Embedder) -> None:
    buddy = bank.apply(add("Andrew adopted a dog named Buddy", "Andrew", ("D1:3",), "1:56 pm on 8 May, 2023"))
    bank.apply(add("Andrew enjoys hiking in the mountains", "Andrew", ("D1:5",)))
    bank.apply(add("Audrey has two cats", "Audrey", ("D1:7",)))
    merged = bank.apply(
        MemoryOp(OpKind.UPDATE, "Andrew adopted two dogs, Buddy and Scout", target_id=buddy.id, provenance=("D4:2",))
    )

    assert merged == MemoryEntry(
        id="m1",
        text="Andrew adopted two dogs, Buddy and Scout",
        speaker="Andrew",
        timestamp="1:56 pm on 8 May, 2023",  # the UPDATE had no timestamp: the old one stays
        provenance=("D1:3", "D4:2"),
        created_step=1,
        updated_step=4,
    )
    assert len(bank) == 3 and bank.step == 4
    results = bank.search("What are Andrew's dogs called?", speaker="Andrew")
    assert [entry.id for entry in results] == ["m1", "m2"]
    assert sum("Buddy" in entry.text for entry in results) == 1  # one merged entry, not two
    query, text = embedder.encode(["What are Andrew's dogs called?", merged.text])
    assert results[0].score == pytest.approx(float(query @ text), abs=1e-6)
    assert [r.action for r in bank.history("m1")] == ["ADD", "UPDATE"]
    assert bank.history("m1")[0].text == "Andrew adopted a dog named Buddy"


def test_unknown_or_deleted_targets_are_rejected_and_change_nothing(bank: MemoryBank) -> None:
    bank.apply(add("Jolene studies engineering", "Jolene"))
    gone = bank.apply(add("Jolene owns a snake", "Jolene"))
    bank.apply(MemoryOp(OpKind.DELETE, target_id=gone.id))
    before, step, history = snapshot(bank), bank.step, bank.history("m1")

    bad_ops = {
        MemoryOp(OpKind.UPDATE, "new text", target_id="m99"): UnknownMemoryError,
        MemoryOp(OpKind.DELETE, target_id="m99"): UnknownMemoryError,
        MemoryOp(OpKind.UPDATE, "new text", target_id=gone.id): UnknownMemoryError,
        MemoryOp(OpKind.DELETE, target_id=gone.id): UnknownMemoryError,
        MemoryOp(OpKind.UPDATE, "new text", target_id=None): InvalidOpError,
        MemoryOp(OpKind.UPDATE, "   ", target_id="m1"): InvalidOpError,
        MemoryOp(OpKind.UPDATE, "new text", target_id="m1", speaker="Deborah"): InvalidOpError,
        MemoryOp(OpKind.ADD, "no speaker"): InvalidOpError,
        MemoryOp(OpKind.ADD, "x" * 70_000, speaker="Jolene"): InvalidOpError,
    }
    for op, error in bad_ops.items():
        with pytest.raises(error, match="conv_26"):
            bank.apply(op)
    with pytest.raises(UnknownMemoryError, match="'m2': deleted"):
        bank.apply(MemoryOp(OpKind.UPDATE, "new text", target_id="m2"))

    assert bank.apply(MemoryOp(OpKind.NOOP, "whatever", target_id="m99")) is None
    assert (snapshot(bank), bank.step, bank.history("m1")) == (before, step, history)
    assert len(bank) == 1


def test_soft_delete_then_restore(bank: MemoryBank) -> None:
    kept = bank.apply(add("Tim collects Harry Potter books", "Tim", ("D2:1",)))
    bank.apply(add("Tim plays basketball", "Tim"))
    before = [(e.id, e.text, e.score) for e in bank.search("What does Tim collect?", speaker="Tim")]

    bank.apply(MemoryOp(OpKind.DELETE, target_id=kept.id))
    assert [entry.id for entry in bank.search("What does Tim collect?", speaker="Tim")] == ["m2"]
    assert [entry.id for entry in bank.entries()] == ["m2"] and len(bank) == 1

    restored = bank.restore(kept.id)
    assert (restored.text, restored.provenance, restored.created_step, restored.updated_step) == (
        "Tim collects Harry Potter books",
        ("D2:1",),
        1,
        4,
    )
    assert [(e.id, e.text, e.score) for e in bank.search("What does Tim collect?", speaker="Tim")] == before
    assert [(r.action, r.step) for r in bank.history(kept.id)] == [("ADD", 1), ("DELETE", 3), ("RESTORE", 4)]
    with pytest.raises(InvalidOpError, match="not deleted"):
        bank.restore(kept.id)
    with pytest.raises(UnknownMemoryError):
        bank.restore("m42")


def test_add_many_checks_every_op_before_writing(bank: MemoryBank, embedder: Embedder) -> None:
    entries = bank.add_many([add("Nate plays video games", "Nate"), add("Nate has a turtle", "Nate")])
    assert [(e.id, e.created_step) for e in entries] == [("m1", 1), ("m2", 2)] and bank.step == 2

    with pytest.raises(InvalidOpError, match=r"ops\[1\] is DELETE"):
        bank.add_many([add("fine", "Nate"), MemoryOp(OpKind.DELETE, target_id="m1")])
    with pytest.raises(InvalidOpError, match=r"ops\[0\].*speaker is missing"):
        bank.add_many([MemoryOp(OpKind.ADD, "no speaker")])
    with pytest.raises(ValueError, match="row 0 has norm 2"):
        bank.add_many([add("fine", "Nate")], vectors=2 * embedder.encode(["fine"]))
    assert len(bank) == 2 and bank.step == 2


def test_search_many_equals_search_and_index_equals_milvus(bank: MemoryBank, embedder: Embedder) -> None:
    texts = [
        "Caroline attended an LGBTQ support group",
        "Caroline is researching adoption agencies",
        "Caroline moved from Sweden four years ago",
        "Melanie painted a lake sunrise",
        "Melanie ran a charity race for mental health",
        "Melanie has three children",
    ]
    bank.add_many([add(text, text.split()[0]) for text in texts])
    bank.apply(MemoryOp(OpKind.DELETE, target_id="m2"))
    queries = ["When did Caroline go to the support group?", "What did Melanie paint?"]

    for speaker in ("Caroline", "Melanie", None):
        many = bank.search_many(queries, speaker=speaker, k=4)
        assert many == [bank.search(query, speaker=speaker, k=4) for query in queries]
        for query, results in zip(embedder.encode(queries), many):
            in_milvus = bank.search_in_store(query, speaker=speaker, k=4)
            assert [e.id for e in results] == [e.id for e in in_milvus]
            np.testing.assert_allclose([e.score for e in results], [e.score for e in in_milvus], atol=1e-6)
    assert "m2" not in {e.id for results in bank.search_many(queries, k=10) for e in results}


# --- filters ---------------------------------------------------------------------------------------

HOSTILE_SPEAKERS = ['Bob" or speaker != "x', "O'Brien", "back\\slash", 'a in ["b"]', "Bob", "x", "tab\there"]


def test_string_literal_escapes() -> None:
    assert string_literal('Bob" or speaker != "x') == '"Bob\\" or speaker != \\"x"'
    assert string_literal("back\\slash") == '"back\\\\slash"'
    assert string_literal("O'Brien") == '"O\'Brien"'
    assert string_literal("two\nlines\r\tend") == '"two\\nlines\\r\\tend"'
    assert field_equals("speaker", 'a in ["b"]') == 'speaker == "a in [\\"b\\"]"'
    with pytest.raises(ValueError, match="not an identifier"):
        field_equals("speaker or 1", "x")


def test_hostile_speaker_names_select_exactly_their_rows(bank: MemoryBank, embedder: Embedder) -> None:
    ops = [add(f"{speaker} memory {n}", speaker) for speaker in HOSTILE_SPEAKERS for n in range(2)]
    entries = bank.add_many(ops)
    query = embedder.encode(["memory"])[0]
    for speaker in HOSTILE_SPEAKERS:
        expected = {entry.id for entry in entries if entry.speaker == speaker}
        assert {e.id for e in bank.search_in_store(query, speaker=speaker, k=50)} == expected  # Milvus filter
        assert {e.id for e in bank.search_by_vector(query, speaker=speaker, k=50)} == expected  # the index


# --- forks -----------------------------------------------------------------------------------------

SPEAKERS = ("Andrew", "Audrey", "Evan")
POOL = [
    "Andrew adopted a dog named Buddy",
    "Andrew adopted two dogs, Buddy and Scout",
    "Andrew works in finance",
    "Audrey has four dogs",
    "Audrey took a pottery class",
    "Audrey's dogs love the park",
    "Evan drives a Prius",
    "Evan went skiing in Banff",
    "Evan married his partner last summer",
]
QUERIES = ["What are Andrew's dogs called?", "What hobbies does Audrey have?", "Where did Evan travel?"]


def build_base(bank: MemoryBank) -> None:
    """Nine memories (duplicated texts give equal scores, so ties must be broken the same way), an
    update and a delete: the fork starts from a bank with history."""
    bank.add_many([add(text, speaker) for speaker in SPEAKERS for text in POOL[:3]])
    bank.apply(MemoryOp(OpKind.UPDATE, POOL[4], target_id="m2", provenance=("D3:1",)))
    bank.apply(MemoryOp(OpKind.DELETE, target_id="m5"))


def all_results(view: MemoryView, id_of: dict[str, str]) -> list:
    """Search results of every query and speaker filter, with fork ids translated to the copy's ids."""
    return [
        [(id_of.get(e.id, e.id), e.text, e.speaker, e.provenance, e.created_step, e.updated_step, e.score)
         for e in hits]
        for speaker in (*SPEAKERS, None)
        for hits in view.search_many(QUERIES, speaker=speaker, k=4)
    ]


def random_op(rng: random.Random, live: list[tuple[str, str]]) -> MemoryOp:
    """ADD / UPDATE / DELETE over a few speakers; `live` is (id, speaker) of live memories."""
    kind = rng.choices([OpKind.ADD, OpKind.UPDATE, OpKind.DELETE], weights=[4, 3, 2])[0]
    if kind is OpKind.ADD or not live:
        return add(rng.choice(POOL), rng.choice(SPEAKERS), (f"D9:{rng.randrange(50)}",))
    target, _ = rng.choice(live)
    if kind is OpKind.UPDATE:
        return MemoryOp(OpKind.UPDATE, rng.choice(POOL), target_id=target, provenance=(f"D9:{rng.randrange(50)}",))
    return MemoryOp(OpKind.DELETE, target_id=target)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fork_searches_exactly_like_a_copy_of_the_bank(store_uri: str, embedder: Embedder, seed: int) -> None:
    with (
        MemoryBank.open(store_uri, "base", embedder) as base,
        MemoryBank.open(store_uri, "copy", embedder) as copy,
    ):
        build_base(base)
        build_base(copy)
        probe = embedder.encode(QUERIES[:1])[0]
        base_before, base_results = snapshot(base), all_results(base, {})
        # (ids by score: the store states no order among equal scores, and other banks share its collection)
        base_in_milvus = sorted((round(e.score, 5), e.id) for e in base.search_in_store(probe, k=100))
        assert all_results(copy, {}) == base_results

        rng = random.Random(seed)
        view: MemoryView = base.fork()
        id_of: dict[str, str] = {}  # fork id -> copy id (fork-created memories have their own ids)
        fork_id_of: dict[str, str] = {}
        for position in range(30):
            if position == 15:
                view = view.fork()  # a fork of a fork continues the same timeline
            op = random_op(rng, [(e.id, e.speaker) for e in copy.entries()])
            copy_entry = copy.apply(op)
            fork_entry = view.apply(dataclasses.replace(op, target_id=fork_id_of.get(op.target_id, op.target_id)))
            assert fork_entry is not None and copy_entry is not None
            id_of[fork_entry.id], fork_id_of[copy_entry.id] = copy_entry.id, fork_entry.id
            assert all_results(view, id_of) == all_results(copy, {})
            assert len(view) == len(copy)
        assert [(id_of.get(row[0], row[0]), *row[1:]) for row in snapshot(view)] == snapshot(copy)

        # The bank, its index and its Milvus rows are untouched by everything the forks did.
        assert snapshot(base) == base_before and all_results(base, {}) == base_results
        assert sorted((round(e.score, 5), e.id) for e in base.search_in_store(probe, k=100)) == base_in_milvus

        later = base.apply(add("Andrew bought a boat", "Andrew"))
        assert later.id not in id_of
        with pytest.raises(StaleForkError, match="fork again"):
            view.search(QUERIES[0])


def test_fork_rejects_what_the_bank_rejects(bank: MemoryBank) -> None:
    bank.apply(add("Gina opened a clothing store", "Gina"))
    fork = bank.fork()
    fork.apply(MemoryOp(OpKind.DELETE, target_id="m1"))
    with pytest.raises(UnknownMemoryError, match="deleted"):
        fork.apply(MemoryOp(OpKind.UPDATE, "Gina closed her store", target_id="m1"))
    with pytest.raises(UnknownMemoryError, match="no such memory"):
        fork.apply(MemoryOp(OpKind.DELETE, target_id="f0.m7"))
    assert fork.entries() == [] and [e.id for e in bank.entries()] == ["m1"]


# --- persistence, processes and locks --------------------------------------------------------------


def test_state_survives_close_and_reopen(store_uri: str, embedder: Embedder) -> None:
    path = store_uri
    with MemoryBank.open(path, "conv_30", embedder) as bank:
        build_base(bank)
        bank.restore("m5")
        bank.apply(MemoryOp(OpKind.DELETE, target_id="m7"))
        entries, results, history, step = snapshot(bank), all_results(bank, {}), bank.history("m5"), bank.step
    with pytest.raises(MemoryBankError, match="closed"):
        bank.search(QUERIES[0])

    with MemoryBank.open(path, "conv_30", embedder) as reopened:
        assert (snapshot(reopened), all_results(reopened, {}), reopened.history("m5"), reopened.step) == (
            entries,
            results,
            history,
            step,
        )
        assert [r.action for r in reopened.history("m7")] == ["ADD", "DELETE"]
        assert reopened.apply(add("Evan bought a new car", "Evan")).id == f"m{step + 1}"
        with pytest.raises(MemoryBankError, match="already open"):
            MemoryBank.open(path, "conv_30", embedder)


@pytest.mark.parametrize("torn_bytes", [0, 100])
def test_a_torn_milvus_lite_index_file_is_rebuilt_from_the_data(
    tmp_path: Path, embedder: Embedder, torn_bytes: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Milvus Lite writes a segment's index file in place, from a background thread, after a flush: a
    process killed then (the fault tests' SIGKILL right after a bank write) leaves it empty or short,
    and the next open failed to load the collection ("No data left in file")."""
    path = tmp_path / "banks.db"
    with MemoryBank.open(path, "conv_30", embedder) as bank:
        build_base(bank)
        entries, results = snapshot(bank), all_results(bank, {})
    index_files = lite_index_files(str(path), BANK_COLLECTION)
    assert index_files, "no Milvus Lite index file found: has its directory layout changed?"
    for index_file in index_files:
        whole = index_file.read_bytes()
        index_file.write_bytes(whole[:torn_bytes])
    with MemoryBank.open(path, "conv_30", embedder) as reopened:
        assert (snapshot(reopened), all_results(reopened, {})) == (entries, results)
    assert f"collection {BANK_COLLECTION!r} did not load" in caplog.text and str(index_files[0]) in caplog.text
    # The repair's warning is the one record: not pymilvus' ERROR and traceback for the first load.
    assert [record.name for record in caplog.records if record.levelno >= logging.ERROR] == []
    assert all(index_file.stat().st_size > torn_bytes for index_file in lite_index_files(str(path), BANK_COLLECTION))


def test_a_bank_in_memory_behaves_like_a_stored_bank_and_keeps_nothing(store_uri: str, embedder: Embedder) -> None:
    with MemoryBank.open(store_uri, "conv_30", embedder) as in_milvus, MemoryBank.open(":memory:", "conv_30", embedder) as in_memory:
        for bank in (in_milvus, in_memory):
            build_base(bank)
            bank.restore("m5")
            bank.apply(MemoryOp(OpKind.DELETE, target_id="m7"))
        assert snapshot(in_memory) == snapshot(in_milvus)
        assert all_results(in_memory, {}) == all_results(in_milvus, {})
        assert in_memory.history("m5") == in_milvus.history("m5")
        for query in embedder.encode(QUERIES):  # the in-memory store's own search is exact too
            # (texts and scores: equal scores come in no stated order from Milvus)
            found = [sorted((round(e.score, 5), e.text) for e in bank.search_in_store(query, k=6)) for bank in (in_memory, in_milvus)]
            assert found[0] == found[1] and len(found[0]) == 6
        # Two in-memory banks of one name are two banks: nothing is shared, nothing outlives close.
        with MemoryBank.open(":memory:", "conv_30", embedder) as another:
            assert len(another) == 0 and another.step == 0


@pytest.mark.slow  # a subprocess
def test_a_bank_in_memory_never_imports_milvus() -> None:
    script = (
        "import sys\n"
        "from memr1.embed import Embedder\n"
        "from memr1.memory import MemoryBank\n"
        "from memr1.types import MemoryOp, OpKind\n"
        "with MemoryBank.open(':memory:', 'conv_26', Embedder()) as bank:\n"
        "    bank.apply(MemoryOp(OpKind.ADD, 'Caroline moved from Sweden', speaker='Caroline'))\n"
        "    assert [e.text for e in bank.search('Where is Caroline from?')] == ['Caroline moved from Sweden']\n"
        "print(sorted(name for name in sys.modules if 'milvus' in name))\n"
    )
    finished = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert finished.stdout.strip().splitlines()[-1] == "[]"


WRITER = """
import sys
from memr1.embed import Embedder
from memr1.memory import MemoryBank
from memr1.types import MemoryOp, OpKind

bank = MemoryBank.open(sys.argv[1], "conv_41", Embedder())
n = 0
while True:
    entry = bank.apply(MemoryOp(OpKind.ADD, f"fact {n}", speaker="John" if n % 2 else "Maria"))
    print("ACK ADD", entry.id, entry.text, flush=True)
    if n % 3 == 2:
        entry = bank.apply(MemoryOp(OpKind.UPDATE, f"fact {n} revised", target_id=entry.id))
        print("ACK UPDATE", entry.id, entry.text, flush=True)
    n += 1
"""


@pytest.mark.slow  # a subprocess
def test_every_acknowledged_write_survives_sigkill(store_uri: str, embedder: Embedder) -> None:
    path = store_uri
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
    )
    acknowledged: dict[str, str] = {}
    try:
        while len(acknowledged) < 24:
            line = child.stdout.readline()
            assert line, f"writer died: {child.stderr.read()}"
            if not line.startswith("ACK "):  # a library may print to stdout too (on a first run)
                continue
            _, _, memory_id, text = line.rstrip("\n").split(" ", 3)
            acknowledged[memory_id] = text
        child.send_signal(signal.SIGKILL)  # mid-loop: it is embedding or writing the next op
    finally:
        child.kill()
        child.wait(timeout=30)
        child.stdout.close()
        child.stderr.close()

    with MemoryBank.open(path, "conv_41", embedder) as bank:
        stored = {entry.id: entry.text for entry in bank.entries()}
        for memory_id, text in acknowledged.items():
            # the last ADD may also have had its unacknowledged UPDATE land
            assert stored[memory_id] in (text, f"{text} revised"), memory_id
        assert len(stored) - len(acknowledged) in (0, 1)  # at most the one op in flight
        new = bank.apply(add("Maria volunteers at a shelter", "Maria"))
        assert new.id not in acknowledged and len(bank) == len(stored) + 1


HOLDER = """
import sys
from pymilvus import MilvusClient
client = MilvusClient(sys.argv[1])
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.slow  # a subprocess
def test_a_db_owned_by_another_process_gives_a_clear_error(tmp_path: Path, embedder: Embedder, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "owned.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "ready\n"
        with pytest.raises(BankLockedError) as caught:
            MemoryBank.open(path, "conv_26", embedder)
        message = str(caught.value)
        assert str(path) in message and "another process" in message and "http://host:port" in message
        # One clear error, not Milvus Lite's own traceback of the same lock logged beside it.
        assert not [record for record in caplog.records if record.exc_info], caplog.text
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()
    with MemoryBank.open(path, "conv_26", embedder) as bank:  # the lock went with its owner
        assert len(bank) == 0


READER = """
import sys
from memr1.embed import Embedder
from memr1.memory import MemoryBank

with MemoryBank.open(sys.argv[1], "conv_26", Embedder()) as bank:
    print("READ", len(bank), bank.search("Buddy the dog", k=1)[0].text, flush=True)
"""


@pytest.mark.slow  # a subprocess
def test_a_released_bank_serves_reads_and_frees_its_file_for_another_process(tmp_path: Path, embedder: Embedder) -> None:
    path = tmp_path / "shared.db"
    bank = MemoryBank.open(path, "conv_26", embedder)
    try:
        bank.add_many([add("Andrew adopted a dog named Buddy", "Andrew"), add("Andrew hikes on weekends", "Andrew")])
        bank.release_store()
        assert bank.read_only
        # Another process opens the same Milvus Lite file while this one still searches its bank.
        reader = subprocess.run(
            [sys.executable, "-c", READER, str(path)],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
        )
        assert "READ 2 Andrew adopted a dog named Buddy" in reader.stdout, reader.stderr[-2000:]
        assert bank.search("weekend hiking", k=1)[0].text == "Andrew hikes on weekends"
        assert [e.text for e in bank.fork().search("Buddy", k=1)] == ["Andrew adopted a dog named Buddy"]
        with pytest.raises(MemoryBankError, match="read-only"):
            bank.apply(add("Andrew moved to Denver", "Andrew"))
        assert len(bank) == 2  # the refused write changed nothing
    finally:
        bank.close()
