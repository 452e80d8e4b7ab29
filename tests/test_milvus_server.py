"""Memory banks on a real Milvus standalone server (`milvus-server` 2.3.5 from the PyPI package
`milvus`, started on a loopback port for this module) through pymilvus 3.x: the bank scenarios that
the rest of the suite runs on Milvus Lite, over `http://127.0.0.1:PORT`.

What works with pymilvus 3.x against a 2.3 server: collections with the store's schema (the scope a
partition key), insert and delete (a memory's next revision, then its earlier ones: the server's upsert
loses rows of a partition-key collection), flush, FLAT search with a speaker filter (escaped string
literals), query iterators, reopen
(collections come back loaded), several processes on one server. What did not, and is handled: a
JSON field whose top level is an array (the server answers "cannot unmarshal array into ... map"),
so the banks keep their JSON lists under {"items": [...]}; the server gives no session timestamp to
query iterators (pymilvus warns, the bank silences it, reads see every acknowledged write).

Time budget: about 70 s on 2 CPU cores (~10-20 s of server start-up, two `memr1 serve` replicas ~20 s).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from processes import free_port

from memr1.embed import Embedder
from memr1.memory import MemoryBank, UnknownMemoryError
from memr1.memory.local_server import local_milvus_server
from memr1.types import MemoryOp, OpKind
from test_memory_bank import HOSTILE_SPEAKERS

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server_uri(tmp_path_factory) -> Iterator[str]:
    with local_milvus_server(tmp_path_factory.mktemp("milvus-server")) as uri:
        yield uri


def add(text: str, speaker: str) -> MemoryOp:
    return MemoryOp(OpKind.ADD, text, speaker=speaker)


def test_add_update_delete_restore_and_reopen(server_uri: str, embedder: Embedder) -> None:
    with MemoryBank.open(server_uri, "server_lifecycle", embedder) as bank:
        buddy = bank.apply(add("Andrew adopted a dog named Buddy", "Andrew"))
        bank.apply(add("Andrew works in finance", "Andrew"))
        merged = bank.apply(MemoryOp(OpKind.UPDATE, "Andrew adopted two dogs, Buddy and Scout", target_id=buddy.id))
        finance = bank.search("job", speaker="Andrew", k=1)[0]
        bank.apply(MemoryOp(OpKind.DELETE, target_id=finance.id))
        with pytest.raises(UnknownMemoryError):
            bank.apply(MemoryOp(OpKind.UPDATE, "x", target_id=finance.id))
        bank.restore(finance.id)
        bank.apply(MemoryOp(OpKind.DELETE, target_id=finance.id))
        expected = [(e.id, e.text, e.updated_step) for e in bank.entries()]
        step = bank.step
    with MemoryBank.open(server_uri, "server_lifecycle", embedder) as reopened:
        assert [(e.id, e.text, e.updated_step) for e in reopened.entries()] == expected == [(merged.id, merged.text, 3)]
        assert [r.action for r in reopened.history(finance.id)] == ["ADD", "DELETE", "RESTORE", "DELETE"]
        assert reopened.step == step
        query = embedder.encode(["dogs"])[0]
        assert [e.id for e in reopened.search_in_store(query, k=5)] == [merged.id]  # the server's own search


def test_hostile_speaker_names_select_exactly_their_rows_on_the_server(server_uri: str, embedder: Embedder) -> None:
    with MemoryBank.open(server_uri, "server_filters", embedder) as bank:
        entries = bank.add_many([add(f"{speaker} memory {n}", speaker) for speaker in HOSTILE_SPEAKERS for n in range(2)])
        query = embedder.encode(["memory"])[0]
        for speaker in HOSTILE_SPEAKERS:
            expected = {entry.id for entry in entries if entry.speaker == speaker}
            assert {e.id for e in bank.search_in_store(query, speaker=speaker, k=50)} == expected


def test_a_fork_never_writes_to_the_server(server_uri: str, embedder: Embedder) -> None:
    with MemoryBank.open(server_uri, "server_fork", embedder) as bank:
        bank.add_many([add("Audrey has four dogs", "Audrey"), add("Audrey took a pottery class", "Audrey")])
        fork = bank.fork()
        fork.apply(add("Audrey moved to Denver", "Audrey"))
        fork.apply(MemoryOp(OpKind.DELETE, target_id="m1"))
        assert [e.text for e in fork.entries()] == ["Audrey took a pottery class", "Audrey moved to Denver"]
        assert [e.text for e in bank.entries()] == ["Audrey has four dogs", "Audrey took a pottery class"]
    with MemoryBank.open(server_uri, "server_fork", embedder) as reopened:
        assert [e.text for e in reopened.entries()] == ["Audrey has four dogs", "Audrey took a pottery class"]


WRITER = """
import sys
from memr1.embed import Embedder
from memr1.memory import MemoryBank
from memr1.types import MemoryOp, OpKind

with MemoryBank.open(sys.argv[1], sys.argv[2], Embedder()) as bank:
    for n in range(20):
        bank.apply(MemoryOp(OpKind.ADD, f"{sys.argv[2]} fact {n}", speaker="Evan"))
print("DONE", flush=True)
"""


def test_two_processes_share_one_server(server_uri: str, embedder: Embedder) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    # Two writer processes at once, each on its own bank, while this process holds a third open.
    with MemoryBank.open(server_uri, "server_mine", embedder) as mine:
        mine.apply(add("Evan drives a Prius", "Evan"))
        writers = [
            subprocess.Popen([sys.executable, "-c", WRITER, server_uri, name], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name in ("server_a", "server_b")
        ]
        for writer in writers:
            out, err = writer.communicate(timeout=300)
            assert writer.returncode == 0 and "DONE" in out, err[-2000:]
        assert [e.text for e in mine.entries()] == ["Evan drives a Prius"]
    for name in ("server_a", "server_b"):
        with MemoryBank.open(server_uri, name, embedder) as bank:
            assert sorted(e.text for e in bank.entries()) == sorted(f"{name} fact {n}" for n in range(20))


def test_the_memory_service_on_the_server(server_uri: str, embedder: Embedder, tmp_path: Path) -> None:
    from memr1 import Memory

    with Memory(tmp_path, uri=server_uri, embedder=embedder) as memory:
        (added,) = memory.add("Maria volunteers at the animal shelter", user_id="maria")["results"]
        assert memory.search("Where does Maria volunteer?", user_id="maria")["results"][0]["id"] == added["id"]
        memory.delete(added["id"])
        assert memory.get(added["id"]) is None
        memory.restore(added["id"])
        assert memory.get(added["id"])["memory"] == "Maria volunteers at the animal shelter"
        memory.reset()
        assert memory.get_all(user_id="maria")["results"] == []


def start_replica(server_uri: str, path: Path) -> tuple[subprocess.Popen, str]:
    """`memr1 serve` on the shared server (no models: every message is stored as it is)."""
    port = free_port()
    log = (path.parent / f"{path.name}.log").open("w")
    command = [sys.executable, "-m", "memr1.cli", "serve", "--path", str(path), "--uri", server_uri, "--port", str(port), "--answer", "none"]
    process = subprocess.Popen(command, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        assert process.poll() is None, (path.parent / f"{path.name}.log").read_text()[-3000:]
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            if time.monotonic() > deadline:
                process.kill()
                raise
            time.sleep(0.2)


def test_two_service_replicas_on_one_server_write_the_same_users(server_uri: str, tmp_path: Path) -> None:
    """Two `memr1 serve` processes, three writer threads each, the same three users, for 6 seconds:
    every acknowledged memory is stored once under the id it was acknowledged with, no id is shared,
    and both replicas list the same memories."""
    replicas = [start_replica(server_uri, tmp_path / name) for name in ("replica-a", "replica-b")]
    users = ("ann", "bob", "cy")
    acknowledged: list[tuple[str, str, str]] = []  # (user, id, text)
    failures: list[str] = []
    stop = time.monotonic() + 6

    def writer(url: str, name: str) -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            n = 0
            while time.monotonic() < stop:
                user, text = users[n % len(users)], f"{name} note {n}"
                response = client.post("/memories", json={"messages": [{"role": "user", "content": text}], "user_id": user, "infer": False})
                if response.status_code != 200:
                    failures.append(response.text)
                    return
                (result,) = response.json()["results"]
                acknowledged.append((user, result["id"], result["memory"]))
                n += 1

    try:
        threads = [threading.Thread(target=writer, args=(url, f"{url[-5:]}-{t}")) for _, url in replicas for t in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not failures, failures[:3]
        assert len(acknowledged) >= 20
        assert len({memory_id for _, memory_id, _ in acknowledged}) == len(acknowledged)  # no id shared
        for user in users:
            listings = [
                httpx.get(f"{url}/memories", params={"user_id": user, "top_k": 10_000}, timeout=60).json()["results"] for _, url in replicas
            ]
            assert listings[0] == listings[1]  # both replicas read the same rows, in the same order
            expected = sorted((memory_id, text) for who, memory_id, text in acknowledged if who == user)
            assert sorted((row["id"], row["memory"]) for row in listings[0]) == expected  # each once
        # A write through one replica is read through the other at once.
        (moved,) = httpx.post(f"{replicas[0][1]}/memories", json={"messages": [{"role": "user", "content": "Ann moved to Porto"}], "user_id": "ann"}, timeout=60).json()["results"]
        assert httpx.get(f"{replicas[1][1]}/memories/{moved['id']}", timeout=60).json()["memory"] == "Ann moved to Porto"
        assert httpx.delete(f"{replicas[1][1]}/memories/{moved['id']}", timeout=60).status_code == 200
        assert httpx.get(f"{replicas[0][1]}/memories/{moved['id']}", timeout=60).status_code == 404
    finally:
        for process, _ in replicas:
            process.terminate()
            process.wait(timeout=30)
