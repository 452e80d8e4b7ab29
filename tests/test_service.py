"""The memory service for real: `memr1 serve` as a subprocess on a loopback port (a tiny model as the
Answer Agent, the real MiniLM embedder, Milvus Lite), driven by an HTTP client. The Memory Manager is a
model behind an OpenAI-compatible endpoint: a rule-following stand-in served on loopback, so that the
ADD / UPDATE path is exercised through the same HTTP protocol a strong teacher model would use.

Time budget: about 60 s on 2 CPU cores (two servers of ~10 s start-up, 8 writer threads for 10 s).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from processes import start_listening

from memr1.llm.loading import load_tokenizer
from memr1.llm.openai_client import OpenAICompatibleClient
from memr1.llm.testing import save_tiny_checkpoint

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model", load_tokenizer("embedded:smollm2-135m-instruct"))


def start_server(tmp: Path, backbone: Path | str, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "memr1.cli", "serve", "--path", str(tmp / "memories"), "--model", str(backbone), *args]
    return start_listening(command, tmp / "server.log", "/health", env=env)


@pytest.fixture(scope="module")
def service(tmp_path_factory, backbone, manager_url) -> Iterator[str]:
    process, url = start_server(tmp_path_factory.mktemp("service"), backbone, "--manager", manager_url, "--answer", "base", "--k", "5")
    yield url
    process.terminate()
    process.wait(timeout=30)


def add(client: httpx.Client, text: str, user: str = "andrew", **extra: object) -> dict:
    response = client.post("/memories", json={"messages": [{"role": "user", "content": text}], "user_id": user, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def test_buddy_and_scout_merge_into_one_memory_through_post_memories(service):
    with httpx.Client(base_url=service, timeout=60) as client:
        (first,) = add(client, "Andrew adopted a dog named Buddy", metadata={"source": "chat"})["results"]
        assert first["event"] == "ADD"
        (second,) = add(client, "Andrew adopted another dog, Scout")["results"]
        assert second == {
            "id": first["id"], "memory": "Andrew adopted two dogs, Buddy and Scout", "event": "UPDATE",
            "previous_memory": "Andrew adopted a dog named Buddy", "fact": "Andrew adopted another dog, Scout",
        }
        (only,) = client.get("/memories", params={"user_id": "andrew"}).json()["results"]
        assert only["memory"] == "Andrew adopted two dogs, Buddy and Scout" and only["metadata"] == {"source": "chat"}
        assert only["user_id"] == "andrew" and only["created_at"] <= only["updated_at"]
        history = client.get(f"/memories/{first['id']}/history").json()
        assert [(row["event"], row["old_memory"], row["new_memory"]) for row in history] == [
            ("ADD", None, "Andrew adopted a dog named Buddy"),
            ("UPDATE", "Andrew adopted a dog named Buddy", "Andrew adopted two dogs, Buddy and Scout"),
        ]
        hits = client.post("/search", json={"query": "What pets does Andrew have?", "user_id": "andrew", "top_k": 3}).json()["results"]
        assert [hit["id"] for hit in hits] == [first["id"]]
        assert set(hits[0]) >= {"id", "memory", "score", "created_at", "updated_at", "user_id", "metadata"}
        assert -1.0 <= hits[0]["score"] <= 1.0


def test_health_names_the_model_behind_each_role(service, backbone, manager_url):
    url, _, model = manager_url.removeprefix("openai:").partition("#")
    models = {"extractor": None, "manager": f"{model}@{url}", "answerer": str(backbone)}
    assert httpx.get(f"{service}/health", timeout=30).json() == {"status": "ok", "models": models}


def test_answer_returns_the_memories_it_was_shown(service):
    with httpx.Client(base_url=service, timeout=120) as client:
        add(client, "Maria volunteers at the animal shelter on Saturdays", user="maria")
        result = client.post("/answer", json={"question": "Where does Maria volunteer?", "user_id": "maria"}).json()
        assert isinstance(result["answer"], str)
        assert [m["memory"] for m in result["memories"]] == ["Maria volunteers at the animal shelter on Saturdays"]


def test_a_wrong_delete_is_restored_with_its_history(service):
    with httpx.Client(base_url=service, timeout=60) as client:
        (memory,) = add(client, "Evan bought a red car", user="evan")["results"]
        assert client.delete(f"/memories/{memory['id']}").json() == {"message": "Memory deleted successfully!"}
        assert client.get(f"/memories/{memory['id']}").status_code == 404
        assert client.get("/memories", params={"user_id": "evan"}).json()["results"] == []
        assert client.post("/search", json={"query": "car", "user_id": "evan"}).json()["results"] == []
        assert client.post(f"/memories/{memory['id']}/restore").json()["memory"] == "Evan bought a red car"
        assert [row["event"] for row in client.get(f"/memories/{memory['id']}/history").json()] == ["ADD", "DELETE", "RESTORE"]
        assert client.put(f"/memories/{memory['id']}", json={"text": "Evan bought a blue car"}).status_code == 200
        assert client.get(f"/memories/{memory['id']}").json()["memory"] == "Evan bought a blue car"


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "field"),
    [
        ("post", "/memories", {"messages": [], "user_id": "a"}, 422, "messages"),
        ("post", "/memories", {"messages": [{"role": "user", "content": ""}], "user_id": "a"}, 422, "content"),
        ("post", "/memories", {"messages": [{"role": "user", "content": "hi"}]}, 400, "user_id"),
        ("post", "/memories", {"messages": [{"role": "user", "content": "hi"}], "user_id": "a", "colour": 1}, 422, "colour"),
        ("post", "/search", {"query": "", "user_id": "a"}, 422, "query"),
        ("post", "/search", {"query": "x", "user_id": "a", "top_k": 0}, 422, "top_k"),
        ("get", "/memories/scope_000000000000000000000000.m1", None, 404, "scope_000000000000000000000000"),
        ("get", "/memories/not-an-id", None, 404, "not-an-id"),
        ("delete", "/memories/not-an-id", None, 404, "not-an-id"),
        ("put", "/memories/not-an-id", {"text": "x"}, 404, "not-an-id"),
        ("post", "/answer", {"question": "Who?"}, 400, "user_id"),
    ],
)
def test_bad_input_is_a_4xx_that_names_the_field(service, method, path, body, status, field):
    response = httpx.request(method, f"{service}{path}", json=body, timeout=30)
    assert response.status_code == status, response.text
    assert field in response.text


def test_an_oversized_payload_is_refused(service):
    huge = {"messages": [{"role": "user", "content": "x" * (2 << 20)}], "user_id": "a"}
    response = httpx.post(f"{service}/memories", json=huge, timeout=30)
    assert response.status_code == 413 and "limit" in response.text


def test_a_chunked_oversized_body_is_refused_as_it_arrives(service):
    """No Content-Length: the 2 MiB arrive in 64 KiB chunks and are counted as they come."""
    body = json.dumps({"messages": [{"role": "user", "content": "y" * (2 << 20)}], "user_id": "chunked"}).encode()

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 1 << 16):
            yield body[start : start + (1 << 16)]

    response = httpx.post(f"{service}/memories", content=chunks(), headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 413 and "the limit is 1048576" in response.text
    assert httpx.get(f"{service}/memories", params={"user_id": "chunked"}, timeout=30).json()["results"] == []


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        # The scope (user_id=...) is the bank's 1,024-byte speaker field: refused, not a 200 with an error inside.
        ({"messages": [{"role": "user", "content": "I like tea"}], "user_id": "u" * 1100}, 400, "user_id"),
        # Under the 1 MiB body limit, over a memory's 65,535-byte text field.
        ({"messages": [{"role": "user", "content": "z" * 70_000}], "user_id": "refused-long"}, 400, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "I like tea"}], "user_id": "refused-nan", "metadata": {"w": [1, float("nan")]}}, 422, "metadata.w[1]"),
    ],
)
def test_a_refused_write_is_a_4xx_and_stores_nothing(service, body, status, field):
    with httpx.Client(base_url=service, timeout=60) as client:
        # json.dumps writes NaN as JavaScript does; httpx's json= would refuse to send it.
        response = client.post("/memories", content=json.dumps(body), headers={"content-type": "application/json"})
        assert response.status_code == status, response.text
        assert field in response.text
        if len(body["user_id"]) < 1000:
            assert client.get("/memories", params={"user_id": body["user_id"]}).json()["results"] == []


def test_a_non_finite_threshold_is_refused(service):
    body = json.dumps({"query": "tea", "user_id": "a", "threshold": float("nan")})
    response = httpx.post(f"{service}/search", content=body, headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 422 and "threshold" in response.text


def test_the_chat_completions_route_speaks_openai(service):
    reply = OpenAICompatibleClient(f"{service}/v1", "memr1").chat([{"role": "user", "content": "Say hi"}], max_tokens=4)
    assert isinstance(reply, str)


def test_the_openai_client_lists_models_chats_and_streams(service):
    client = openai.OpenAI(base_url=f"{service}/v1", api_key="unused", max_retries=0)
    served = [model.id for model in client.models.list().data]
    assert len(served) == 1
    parts = [{"type": "text", "text": "Say hi"}, {"type": "text", "text": "to Ann"}]  # the current OpenAI shape
    reply = client.chat.completions.create(model="any", messages=[{"role": "user", "content": parts}], max_completion_tokens=3, temperature=0)
    assert reply.model == served[0] and reply.choices[0].finish_reason == "length"  # the tiny model is cut at 3 tokens
    assert reply.usage.completion_tokens == 3 and reply.usage.total_tokens == reply.usage.prompt_tokens + 3 > 3
    stream = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": parts}], max_tokens=3, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == reply.choices[0].message.content
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.total_tokens == reply.usage.total_tokens
    # Token by token: a longer reply comes in several content chunks that add up to the plain reply,
    # and with a stop string, none of it past the cut.
    question = [{"role": "user", "content": "Tell me about Ann"}]
    whole = client.chat.completions.create(model="any", messages=question, max_tokens=12, temperature=0).choices[0].message.content
    pieces = [c.choices[0].delta.content for c in client.chat.completions.create(
        model="any", messages=question, max_tokens=12, temperature=0, stream=True) if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 2 and "".join(pieces) == whole
    assert len(whole) >= 8, whole  # the tiny model's greedy reply, long enough to cut inside
    stop = whole[4:6]
    cut = client.chat.completions.create(model="any", messages=question, max_tokens=12, temperature=0, stop=[stop]).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="any", messages=question, max_tokens=12, temperature=0, stop=[stop], stream=True) if c.choices)
    assert streamed == cut == whole[: whole.index(stop)]
    # Sampling is honoured: the same seed gives the same sample.
    sampled = [
        client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=1.0, seed=7).choices[0].message.content
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"n": 2}, "n"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, "messages[0].content[0].type"),
    ],
)
def test_what_the_server_cannot_honour_is_refused_by_name(service, extra, field):
    client = openai.OpenAI(base_url=f"{service}/v1", api_key="unused", max_retries=0)
    request = {"model": "any", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2} | extra
    with pytest.raises(openai.BadRequestError, match=re.escape(field)):
        client.chat.completions.create(**request)


def test_embeddings_are_the_banks_own(service, embedder):
    client = openai.OpenAI(base_url=f"{service}/v1", api_key="unused", max_retries=0)
    texts = ["Andrew adopted a dog named Buddy", "Maria volunteers at a shelter"]
    reply = client.embeddings.create(model="any", input=texts, dimensions=384)
    assert [item.index for item in reply.data] == [0, 1] and reply.usage.prompt_tokens == embedder.count_tokens(texts)
    for item, expected in zip(reply.data, embedder.encode(texts)):
        assert len(item.embedding) == 384 and max(abs(a - float(b)) for a, b in zip(item.embedding, expected)) < 1e-6
    as_floats = client.embeddings.create(model="any", input=texts, encoding_format="float")  # the client's default is base64
    assert [item.embedding for item in as_floats.data] == [item.embedding for item in reply.data]
    with pytest.raises(openai.BadRequestError, match="dimensions: this embedder's vectors have 384, not 1536"):
        client.embeddings.create(model="any", input="hi", dimensions=1536)


def test_json_schema_replies_fit_their_schema(service):
    client = openai.OpenAI(base_url=f"{service}/v1", api_key="unused", max_retries=0)
    schema = {"type": "object", "properties": {"city": {"enum": ["Lisbon", "Porto"]}, "year": {"type": "integer", "minimum": 2000, "maximum": 2030}},
              "required": ["city", "year"], "additionalProperties": False}
    for temperature in (0.0, 1.0):  # the tiny random model: without the grammar never JSON
        reply = client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "Where and when?"}], max_tokens=40, temperature=temperature, seed=1,
            response_format={"type": "json_schema", "json_schema": {"name": "move", "schema": schema}},
        )
        value = json.loads(reply.choices[0].message.content)
        assert value["city"] in ("Lisbon", "Porto") and 2000 <= value["year"] <= 2030 and reply.choices[0].finish_reason == "stop"


def test_the_embedded_model_replies_in_json_when_asked(tmp_path):
    # Whatever the model's free text on this CPU and precision (greedy bf16 replies differ between
    # AVX2, AVX512-BF16 and AMX), the grammar closes the value within max_tokens: this asserts the
    # reply's form, never its words.
    process, url = start_server(tmp_path, "embedded:smollm2-135m-instruct", "--answer", "base")
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for max_tokens in (12, 64):
            reply = client.chat.completions.create(
                model="any", messages=[{"role": "user", "content": "Reply in JSON: what city did Ann move to? Ann moved to Lisbon in May."}],
                max_tokens=max_tokens, temperature=0, response_format={"type": "json_object"},
            )
            assert reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens <= max_tokens
            assert isinstance(json.loads(reply.choices[0].message.content), dict), reply.choices[0].message.content
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_eight_writers_and_readers_lose_and_duplicate_nothing(service):
    stop = time.monotonic() + 10
    written: list[list[str]] = [[] for _ in range(8)]
    seen_counts: list[list[int]] = [[], []]
    errors: list[str] = []

    def writer(index: int) -> None:
        with httpx.Client(base_url=service, timeout=60) as client:
            n = 0
            while time.monotonic() < stop:
                text = f"writer {index} note {n}"
                response = client.post("/memories", json={"messages": [{"role": "user", "content": text}], "user_id": "crowd", "infer": False})
                if response.status_code != 200:
                    errors.append(response.text)
                    return
                written[index].append(text)
                n += 1

    def reader(index: int) -> None:
        with httpx.Client(base_url=service, timeout=60) as client:
            while time.monotonic() < stop:
                results = client.get("/memories", params={"user_id": "crowd", "top_k": 10_000}).json()["results"]
                texts = [r["memory"] for r in results]
                if len(texts) != len(set(texts)):
                    errors.append("a reader saw a duplicated memory")
                seen_counts[index].append(len(texts))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)] + [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors[:3]
    expected = sorted(text for texts in written for text in texts)
    assert len(expected) >= 8
    final = httpx.get(f"{service}/memories", params={"user_id": "crowd", "top_k": 10_000}, timeout=60).json()["results"]
    assert sorted(r["memory"] for r in final) == expected  # none lost, none duplicated
    assert len({r["id"] for r in final}) == len(final)
    for counts in seen_counts:  # only ADDs happen: each reader sees the bank grow, never shrink or jump past the end
        assert counts and counts == sorted(counts) and counts[-1] <= len(expected)


def test_an_api_key_is_required_when_set(tmp_path, backbone):
    process, url = start_server(tmp_path, backbone, "--answer", "none", "--api-key-env", "MEMR1_TEST_KEY", env={"MEMR1_TEST_KEY": "s3cret"})
    try:
        body = {"messages": [{"role": "user", "content": "hi there"}], "user_id": "a"}
        assert httpx.post(f"{url}/memories", json=body, timeout=30).status_code == 401
        assert httpx.post(f"{url}/memories", json=body, headers={"Authorization": "Bearer wrong"}, timeout=30).status_code == 401
        assert httpx.post(f"{url}/memories", json=body, headers={"Authorization": "Bearer s3cret"}, timeout=30).status_code == 200
        health = httpx.get(f"{url}/health", timeout=30)  # health stays open for probes
        assert health.json() == {"status": "ok", "models": {"extractor": None, "manager": None, "answerer": None}}
    finally:
        process.terminate()
        process.wait(timeout=30)
