"""Helpers of the tests that run real processes: free loopback ports, a tiny-model train.py run as a
subprocess, armed with a fault point (memr1/faults.py) where a test kills or stops it."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from memr1.faults import FAULT_ENV

ROOT = Path(__file__).resolve().parents[1]

# A run of a few seconds a step on 2 cores: no-distill Answer Agent over ADD-all banks, GRPO G=2 with
# an entropy bonus, validation every 2 steps. The tiny model's answers never match a gold answer, so
# `train_command(judge=...)` rewards them through a `ParityJudge` instead: then the groups have reward
# spread and the policy gradient (advantages, their resume) moves the weights too.
TINY_RUN = (
    "answer.distill=false", "answer.k_per_speaker=1", "answer.max_new_tokens=4",
    "algo.actor_lr=1e-3", "algo.micro_batch_size=2",
    "data_loader.states_per_step=2", "data_loader.max_steps=6", "data_loader.val_check_interval=2",
    "data_loader.limit_val_batches=1", "data_loader.val_batch_size=2", "checkpoint.every_n_train_steps=1",
    "logging.wandb=false", "logging.samples_every_n_steps=1",
    # probes at steps 1, 2, 4 and 6 (as many probe states as the default's 4 at steps 1 and 6): one at a
    # validation step, where a stop during the probe is tested (test_faults.py)
    "data_loader.probe_states=2", "data_loader.probe_every_n_steps=2",
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_listening(command: list[str], log: Path, probe: str, cwd: Path = ROOT, env: dict[str, str] | None = None,
                    timeout_s: float = 300, method: str = "GET") -> tuple[subprocess.Popen, str]:
    """`command --port PORT` (a free loopback port) started with its output in `log`, returned with its
    URL once `method probe` (a path) gets any HTTP answer; the log's tail if it exits or never answers.
    (An MCP endpoint is probed by POST: its GET opens an event stream that answers nothing.)"""
    import httpx  # the tests that start servers have it; the others need not import it

    port = free_port()
    with log.open("w") as out:
        process = subprocess.Popen([*command, "--port", str(port)], cwd=cwd, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
                                   stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            httpx.request(method, f"{url}{probe}", json={} if method == "POST" else None, timeout=1)
            return process, url
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise TimeoutError(log.read_text()[-3000:])


# Each algorithm's own settings (train.py refuses a setting the chosen algorithm would ignore).
ALGO_RUN = {
    "grpo": ("algo.group_size=2", "algo.entropy_coef=0.1"),
    "ppo": ("algo=ppo", "algo.critic_lr=1e-3", "algo.entropy_coef=0.1"),
    "sft": ("algo=sft",),  # the dataset teacher's targets: no sampling, the same batches however many processes
}


def train_command(
    backbone: Path, run_dir: Path, banks_dir: Path, *extra: str, judge: str | None = None, algo: str = "grpo"
) -> list[str]:
    """A tiny train.py run of `algo`; `judge`: the URL of a judge endpoint (`ParityJudge`) that rewards its answers."""
    rewarded = ("model.reward=judge", "judge=openai_compatible", f"judge.url={judge}", "judge.model=parity") if judge else ()
    return [
        sys.executable, str(ROOT / "train.py"), f"backbone.name_or_path={backbone}", f"run_dir={run_dir}",
        f"banks.dir={banks_dir}", *TINY_RUN, *ALGO_RUN[algo], *rewarded, *extra,
    ]


def reply_with_chat(handler: http.server.BaseHTTPRequestHandler, content: str) -> None:
    """Answer an OpenAI chat-completions request with one choice whose message is `content`."""
    reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(reply)))
    handler.end_headers()
    handler.wfile.write(reply)


class ParityJudge(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible judge on loopback: CORRECT when the generated answer has an even number of
    characters. Deterministic and about half the time: a tiny model's samples then differ in reward."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answer = re.search(r"^Generated answer: (.*)$", body["messages"][-1]["content"], re.MULTILINE)
        label = "CORRECT" if answer is not None and len(answer.group(1)) % 2 == 0 else "WRONG"
        reply_with_chat(self, json.dumps({"label": label}))

    def log_message(self, *args: object) -> None:
        pass


class RuleManager(http.server.BaseHTTPRequestHandler):
    """Chat completions for Manager prompts: UPDATE memory 0 when the new fact is about Scout and
    memory 0 is about Buddy (merging them as the paper's example does), else ADD the fact."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        fact = re.search(r"New fact: (.*)", prompt).group(1)
        first = re.search(r"^0: (.*)$", prompt, re.MULTILINE)
        if "Scout" in fact and first and "Buddy" in first.group(1):
            entry = {"id": "0", "text": "Andrew adopted two dogs, Buddy and Scout", "event": "UPDATE", "old_memory": first.group(1)}
        else:
            entry = {"id": "new", "text": fact, "event": "ADD"}
        reply_with_chat(self, json.dumps({"memory": [entry]}))

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve_on_loopback(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on a free loopback port for the block: its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@contextlib.contextmanager
def parity_judge() -> Iterator[str]:
    """A `ParityJudge` served on a free loopback port for the block: its /v1 URL."""
    with serve_on_loopback(ParityJudge) as url:
        yield f"{url}/v1"


def environment(fault: str | None = None) -> dict[str, str]:
    """The subprocess environment; `fault` arms a fault point (memr1/faults.py: `POINT:HIT[:ACTION]`)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline"}
    env.pop(FAULT_ENV, None)
    if fault is not None:
        env[FAULT_ENV] = fault
    return env


def run(command: list[str], log: Path, timeout: float = 300, fault: str | None = None) -> int:
    """Run `command` to its end (its output appended to `log`); its exit status (-9: SIGKILLed)."""
    with log.open("a") as out:
        return subprocess.run(command, cwd=ROOT, env=environment(fault), stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode


def wait_for_line(process: subprocess.Popen, log: Path, text: str, timeout: float = 300) -> None:
    """Until `log` holds `text` (a fault point's WAIT line); fails with the log's tail if `process` ends first."""
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert process.poll() is None, f"exited {process.returncode} before {text!r}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in {timeout} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.02)
