"""`memr1 mcp` and `/mcp` on `memr1 serve`, through real processes and sockets: the official SDK's
client over streamable HTTP and over stdio, a plain JSON-RPC client that posts `tools/call` with no
session and no `initialize`, and hostile arguments refused as MCP errors with nothing stored. The
Manager is a rule endpoint on loopback (it UPDATEs Buddy's memory when Scout comes), so that what the
Manager decided shows in the results; the backbone is a tiny random model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from processes import start_listening

from memr1.llm.loading import load_tokenizer
from memr1.llm.testing import save_tiny_checkpoint

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
TOOLS = {"add_memories", "search_memory", "list_memories", "delete_memories", "delete_all_memories", "answer", "history", "restore"}
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "API_KEY": "sesame"}


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model", load_tokenizer("embedded:smollm2-135m-instruct"))


def start(tmp: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """`memr1 ARGS` on a free port, once `/mcp` answers (a 401 too: it is up)."""
    return start_listening([sys.executable, "-m", "memr1.cli", *args], tmp / "server.log", "/mcp", env=ENV, method="POST")


@pytest.fixture(scope="module")
def served(tmp_path_factory, backbone, manager_url) -> Iterator[str]:
    """`memr1 serve` (REST and /mcp), no API key."""
    tmp = tmp_path_factory.mktemp("serve")
    process, url = start(tmp, "serve", "--path", str(tmp / "memories"), "--model", str(backbone), "--manager", manager_url, "--k", "5")
    yield url
    process.terminate()
    process.wait(timeout=30)


def content(result) -> dict:
    assert not result.is_error, result.content[0].text
    return json.loads(result.content[0].text)


async def walk_two_users(client: Client, alice: dict, bob: dict) -> None:
    """Through one client: tools listed; alice and bob add, search, answer, delete and restore, and
    neither ever sees the other's memories; the Manager's UPDATE is in the result and the history."""
    assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS
    (buddy,) = content(await client.call_tool("add_memories", {"text": "Andrew adopted a dog named Buddy", **alice}))["results"]
    assert buddy["event"] == "ADD"
    (merged,) = content(await client.call_tool("add_memories", {"text": "Andrew adopted another dog, Scout", **alice}))["results"]
    assert (merged["event"], merged["id"], merged["previous_memory"]) == ("UPDATE", buddy["id"], "Andrew adopted a dog named Buddy")
    (tea,) = content(await client.call_tool("add_memories", {"text": "Bob drinks green tea", **bob}))["results"]
    hits = content(await client.call_tool("search_memory", {"query": "dogs", "limit": 5, **alice}))["results"]
    assert [hit["memory"] for hit in hits] == ["Andrew adopted two dogs, Buddy and Scout"]
    assert [hit["memory"] for hit in content(await client.call_tool("list_memories", bob))["results"]] == ["Bob drinks green tea"]
    answer = content(await client.call_tool("answer", {"question": "What dogs does Andrew have?", **alice}))
    assert [item["id"] for item in answer["memories"]] == [buddy["id"]]  # bob's tea is never shown
    # bob cannot reach alice's memory by its id: not delete, not read its history, not restore it.
    for tool, arguments in (("delete_memories", {"memory_ids": [buddy["id"]]}), ("history", {"memory_id": buddy["id"]}), ("restore", {"memory_id": buddy["id"]})):
        refused = await client.call_tool(tool, {**arguments, **bob})
        assert refused.is_error and "no such" in refused.content[0].text, refused.content[0].text
    content(await client.call_tool("delete_memories", {"memory_ids": [buddy["id"]], **alice}))
    assert content(await client.call_tool("list_memories", alice))["results"] == []
    assert content(await client.call_tool("restore", {"memory_id": buddy["id"], **alice}))["memory"] == "Andrew adopted two dogs, Buddy and Scout"
    events = [row["event"] for row in content(await client.call_tool("history", {"memory_id": buddy["id"], **alice}))["history"]]
    assert events == ["ADD", "UPDATE", "DELETE", "RESTORE"]
    content(await client.call_tool("delete_all_memories", bob))
    assert content(await client.call_tool("list_memories", bob))["results"] == [] and tea["id"]


def test_the_sdk_client_over_http_on_memr1_serve(served):
    async def main() -> None:
        async with Client(f"{served}/mcp") as client:
            await walk_two_users(client, {"user_id": "alice-http"}, {"user_id": "bob-http"})

    anyio.run(main)


def test_the_sdk_client_over_stdio_with_the_connections_user(tmp_path, backbone, manager_url):
    def server(user: str) -> StdioServerParameters:
        return StdioServerParameters(
            command=sys.executable, cwd=str(ROOT), env=ENV,
            args=["-m", "memr1.cli", "mcp", "--path", str(tmp_path / "memories"), "--model", str(backbone), "--manager", manager_url, "--k", "5", "--user-id", user],
        )

    async def main() -> None:
        async with Client(server("alice")) as client:
            # alice is the connection's user; bob is named in the calls (an agent serving several people).
            await walk_two_users(client, {}, {"user_id": "bob"})
        async with Client(server("bob")) as client:  # a new process on the same memories: alice's are there, not bob's
            assert content(await client.call_tool("list_memories", {}))["results"] == []
            (kept,) = content(await client.call_tool("list_memories", {"user_id": "alice"}))["results"]
            assert kept["memory"] == "Andrew adopted two dogs, Buddy and Scout"

    anyio.run(main)


def rpc(url: str, name: str, arguments: dict, **headers: str) -> dict:
    """One `tools/call` as a plain JSON-RPC client posts it: no initialize, no session."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    response = httpx.post(url, content=json.dumps(body), headers={"content-type": "application/json", **headers}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["result"]


def test_a_plain_json_rpc_client_without_a_session(served):
    listed = httpx.post(f"{served}/mcp", json={"jsonrpc": "2.0", "id": 7, "method": "tools/list"}, timeout=30).json()
    assert listed["id"] == 7 and {tool["name"] for tool in listed["result"]["tools"]} == TOOLS
    (added,) = rpc(f"{served}/mcp", "add_memories", {"text": "Maria volunteers at the shelter", "user_id": "maria-rpc"})["structuredContent"]["results"]
    (hit,) = rpc(f"{served}/mcp", "search_memory", {"query": "volunteer", "user_id": "maria-rpc"})["structuredContent"]["results"]
    assert hit["id"] == added["id"]
    # The user from the URL, as OpenMemory's connections carry it.
    (same,) = rpc(f"{served}/mcp?user_id=maria-rpc", "list_memories", {})["structuredContent"]["results"]
    assert same["id"] == added["id"]
    assert rpc(f"{served}/mcp", "list_memories", {"user_id": "someone-else"})["structuredContent"]["results"] == []
    # Answer, delete, restore and history as the same plain client; the other user reaches none of it.
    assert rpc(f"{served}/mcp", "answer", {"question": "Where does Maria volunteer?", "user_id": "maria-rpc"})["structuredContent"]["memories"][0]["id"] == added["id"]
    refused = rpc(f"{served}/mcp", "delete_memories", {"memory_ids": [added["id"]], "user_id": "someone-else"})
    assert refused["isError"] and "no such live memory" in refused["content"][0]["text"]
    assert rpc(f"{served}/mcp", "delete_memories", {"memory_ids": [added["id"]], "user_id": "maria-rpc"})["structuredContent"]["deleted"] == [added["id"]]
    assert rpc(f"{served}/mcp", "search_memory", {"query": "volunteer", "user_id": "maria-rpc"})["structuredContent"]["results"] == []
    assert rpc(f"{served}/mcp", "restore", {"memory_id": added["id"], "user_id": "maria-rpc"})["structuredContent"]["id"] == added["id"]
    history = rpc(f"{served}/mcp", "history", {"memory_id": added["id"], "user_id": "maria-rpc"})["structuredContent"]["history"]
    assert [row["event"] for row in history] == ["ADD", "DELETE", "RESTORE"]


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("add_memories", {"text": "x" * 70_000, "user_id": "eve"}, "over a memory's limit"),
        ("add_memories", {"text": "", "user_id": "eve"}, "at least 1 character"),
        ("add_memories", {"text": "Eve likes tea"}, "user_id: required"),
        ("add_memories", {"text": "Eve likes tea", "user_id": "eve&agent_id=x"}, "'&' is not allowed"),
        ("add_memories", {"text": "Eve likes tea", "user_id": "e" * 300}, "at most 256 characters"),
        ("add_memories", {"text": "Eve likes tea", "user_id": 7}, "valid string"),
        ("search_memory", {"query": "tea", "user_id": "eve", "limit": float("nan")}, "finite number"),
        ("search_memory", {"query": "tea", "user_id": "eve", "limit": 10**9}, "less than or equal to 1000"),
        ("delete_memories", {"memory_ids": ["not-an-id"], "user_id": "eve"}, "no such live memory"),
        ("delete_memories", {"memory_ids": [], "user_id": "eve"}, "at least 1 item"),
        ("history", {"memory_id": "' or 1=1 --", "user_id": "eve"}, "no such memory"),
        ("restore", {"memory_id": "x", "user_id": "eve", "extra": 1}, None),
        ("no_such_tool", {"user_id": "eve"}, "no_such_tool"),
    ],
)
def test_hostile_arguments_are_mcp_errors_and_store_nothing(served, name, arguments, message):
    result = rpc(f"{served}/mcp", name, arguments)
    if message is None:  # an extra argument is ignored, as the SDK does; the bad id is still refused
        message = "no such memory"
    assert result["isError"] is True and message in result["content"][0]["text"], result
    assert rpc(f"{served}/mcp", "list_memories", {"user_id": "eve"})["structuredContent"]["results"] == []


def test_a_body_over_the_limit_is_refused_before_it_is_read(served):
    huge = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "add_memories", "arguments": {"text": "y" * (2 << 20), "user_id": "eve"}}}
    assert httpx.post(f"{served}/mcp", json=huge, timeout=30).status_code == 413


def test_memr1_mcp_over_http_alone_behind_the_api_key(tmp_path, backbone):
    process, url = start(tmp_path, "mcp", "--transport", "http", "--path", str(tmp_path / "memories"), "--model", str(backbone), "--api-key-env", "API_KEY")
    try:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        assert httpx.post(f"{url}/mcp", json=body, timeout=30).status_code == 401
        assert httpx.post(f"{url}/mcp", json=body, headers={"authorization": "Bearer wrong"}, timeout=30).status_code == 401
        (added,) = rpc(f"{url}/mcp", "add_memories", {"text": "Ann moved to Lisbon", "user_id": "ann"}, authorization="Bearer sesame")["structuredContent"]["results"]
        assert added["event"] == "ADD"

        async def main() -> None:
            keyed = httpx2.AsyncClient(headers={"authorization": "Bearer sesame"})  # the SDK's HTTP client
            async with Client(streamable_http_client(f"{url}/mcp", http_client=keyed)) as client:
                (hit,) = content(await client.call_tool("search_memory", {"query": "Lisbon", "user_id": "ann"}))["results"]
                assert hit["id"] == added["id"]

        anyio.run(main)
    finally:
        process.terminate()
        process.wait(timeout=30)
