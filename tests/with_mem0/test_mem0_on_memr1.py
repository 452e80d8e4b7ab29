"""Mem0's own `Memory` (mem0ai 2.2.1) running on memr1: `memr1 serve` (the embedded SmolLM2-135M) is its
LLM through Mem0's `openai` provider, whose JSON replies the service enforces by constrained decoding,
and its embedder through the same provider (`/v1/embeddings`: the offline MiniLM the banks use); Qdrant
stores on local disk. Runs in its own venv (`make test-mem0`: mem0ai is not a memr1 dependency); the
server runs from the project's .venv. Skipped wherever mem0 does not import.

Mem0 is driven as its users call it: `add` a short conversation for a user, `get_all` and `search` by
`filters`. What the 135M model extracts is its own business; that Mem0 stores it, and finds it again,
is what this checks.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ["MEM0_TELEMETRY"] = "False"  # no network here; read when mem0 is imported
pytest.importorskip("mem0")

import httpx  # noqa: E402
from mem0 import Memory  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MEMR1_PYTHON = os.environ.get("MEMR1_PYTHON", str(ROOT / ".venv" / "bin" / "python"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def memr1_url(tmp_path_factory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("memr1")
    port = free_port()
    log = (tmp / "server.log").open("w")
    command = [MEMR1_PYTHON, "-m", "memr1.cli", "serve", "--path", str(tmp / "memories"), "--port", str(port), "--answer", "base"]
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        assert process.poll() is None, (tmp / "server.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "memr1 serve did not come up"
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.5)
    yield f"{url}/v1"
    process.terminate()
    process.wait(timeout=30)


def test_mem0_stores_and_finds_memories_with_memr1_as_its_llm_and_embedder(memr1_url, tmp_path):
    openai_at_memr1 = {"openai_base_url": memr1_url, "api_key": "unused"}
    memory = Memory.from_config({
        "llm": {"provider": "openai", "config": {"model": "memr1", "temperature": 0.0, "max_tokens": 256, **openai_at_memr1}},
        "embedder": {"provider": "openai", "config": {"model": "minilm", "embedding_dims": 384, **openai_at_memr1}},
        "vector_store": {"provider": "qdrant", "config": {"path": str(tmp_path / "qdrant"), "on_disk": True,
                                                          "embedding_model_dims": 384, "collection_name": "mem0_on_memr1"}},
        "history_db_path": str(tmp_path / "history.db"),
    })
    added = memory.add([{"role": "user", "content": "I adopted a dog named Buddy last week."}], user_id="andrew")["results"]
    assert added and all(result["event"] == "ADD" and result["memory"] for result in added), added
    stored = memory.get_all(filters={"user_id": "andrew"})["results"]
    assert sorted(item["id"] for item in stored) == sorted(result["id"] for result in added)
    assert memory.get_all(filters={"user_id": "maria"})["results"] == []
    # Each stored memory is found by its own text, first, through memr1's embeddings.
    for item in stored:
        hits = memory.search(item["memory"], filters={"user_id": "andrew"}, threshold=0.0)["results"]
        assert hits and hits[0]["id"] == item["id"], hits
