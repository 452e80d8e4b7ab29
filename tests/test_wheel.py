"""The package serves on its own: the wheel built from this checkout, installed in a fresh venv in
another directory with no checkout beside it, runs `memr1.Memory()`, `memr1 serve` and `memr1 mcp`
with the shipped agents (their adapters travel in the wheel).

The fresh venv gets memr1 from the wheel and nothing else from this checkout; its third-party
dependencies are this venv's, reached by a path entry (a `.pth` line), so that the test installs no
torch. That path entry is a plain directory on `sys.path`: the editable install's own hook in it (a
`.pth` of its own) is not run there, and the test asserts that `memr1` is imported from the wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from processes import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
MANAGER, ANSWERER = "trained:manager-sft", "trained:answer-agent-no-distill-grpo"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the fresh venv's bin directory, a working directory far from the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Built from a copy of what the wheel is made of: setuptools writes build/ beside its sources.
    source = tmp / "source"
    for name in ("pyproject.toml", "README.md"):
        source.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "memr1", source / "memr1", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(source)],
                   check=True, cwd=tmp, capture_output=True)
    (wheel,) = (tmp / "dist").glob("memr1-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True)
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return venv / "bin", elsewhere


def env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}


def test_memr1_memory_from_the_wheel_with_the_shipped_agents(installed):
    bin_dir, elsewhere = installed
    script = f"""
import json, memr1
from memr1.service.models import text_model
models = {{}}
memory = memr1.Memory("memories", manager=text_model("embedded:smollm2-135m-instruct", adapter="{MANAGER}", models=models),
                      answerer=text_model("embedded:smollm2-135m-instruct", adapter="{ANSWERER}", models=models), distill=False)
added = memory.add("Ann moved to Lisbon in May", user_id="ann")["results"]
answer = memory.answer("Where did Ann move?", user_id="ann")
print(json.dumps({{"file": memr1.__file__, "added": added, "answer": answer["answer"], "shown": len(answer["memories"])}}))
"""
    done = subprocess.run([str(bin_dir / "python"), "-c", script], cwd=elsewhere, env=env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(result["file"]).is_relative_to(bin_dir.parent), result["file"]  # the wheel's memr1, not the checkout's
    (added,) = result["added"]
    assert added["event"] in ("ADD", "NONE", "UPDATE", "DELETE") and added["fact"] == "Ann moved to Lisbon in May"
    assert isinstance(result["answer"], str) and result["shown"] >= (added["event"] == "ADD")


def test_memr1_serve_and_memr1_mcp_from_the_wheel(installed):
    bin_dir, elsewhere = installed
    port = free_port()
    log = (elsewhere / "serve.log").open("w")
    serve = subprocess.Popen([str(bin_dir / "memr1"), "serve", "--port", str(port), "--manager", MANAGER, "--answer", ANSWERER, "--no-distill"],
                             cwd=elsewhere, env=env(), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert serve.poll() is None and time.monotonic() < deadline, (elsewhere / "serve.log").read_text()[-3000:]
            try:
                health = httpx.get(f"{url}/health", timeout=1).json()
                break
            except httpx.TransportError:
                time.sleep(0.5)
        assert health["models"]["manager"].endswith(MANAGER) and health["models"]["answerer"].endswith(ANSWERER)
        added = httpx.post(f"{url}/memories", json={"messages": [{"role": "user", "content": "Bo plays the cello"}], "user_id": "bo"}, timeout=120)
        assert added.status_code == 200 and added.json()["results"][0]["fact"] == "Bo plays the cello"
        assert isinstance(httpx.post(f"{url}/answer", json={"question": "What does Bo play?", "user_id": "bo"}, timeout=120).json()["answer"], str)
        listed = httpx.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=30).json()
        assert "add_memories" in {tool["name"] for tool in listed["result"]["tools"]}
    finally:
        serve.terminate()
        serve.wait(timeout=60)

    async def over_stdio() -> None:
        server = StdioServerParameters(command=str(bin_dir / "memr1"), args=["mcp", "--user-id", "bo"], cwd=str(elsewhere), env=env())
        async with Client(server) as client:
            (hit,) = json.loads((await client.call_tool("search_memory", {"query": "cello"})).content[0].text)["results"]
            assert hit["memory"] == "Bo plays the cello"  # the memory `memr1 serve` wrote in ./memories

    anyio.run(over_stdio)


def test_memr1_train_and_evaluate_compose_their_configs_from_the_wheel(installed):
    """The Hydra apps and every config group ship inside the package: the paper's command shape, away
    from any checkout (`--cfg job` composes and prints the config without running the job)."""
    bin_dir, elsewhere = installed
    trained = subprocess.run([str(bin_dir / "memr1"), "train", "--cfg", "job", "model=manager", "algo=ppo", "trainer.devices=4"],
                             cwd=elsewhere, env=env(), capture_output=True, text=True, timeout=120)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "name: ppo" in trained.stdout and "devices: 4" in trained.stdout
    evaluated = subprocess.run([str(bin_dir / "memr1"), "evaluate", "--cfg", "job", "banks=oracle"],
                               cwd=elsewhere, env=env(), capture_output=True, text=True, timeout=120)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "policy: oracle" in evaluated.stdout
    refused = subprocess.run([str(bin_dir / "memr1"), "evaluate", "banks=prompted"], cwd=elsewhere, env=env(), capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "Could not find 'banks/prompted'" in refused.stderr
