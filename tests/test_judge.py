"""The LLM judge: reading verdicts, and the OpenAI-compatible client against a local HTTP endpoint."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from memr1.metrics.judge import OpenAICompatibleJudge, Verdict, read_verdict


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ('{"label": "CORRECT"}', Verdict(True, True)),
        ('```json\n{"label": "WRONG"}\n```', Verdict(False, True)),
        ("label: correct", Verdict(True, True)),
        ("The answer is CORRECT.", Verdict(True, True)),
        ("I cannot tell.", Verdict(False, False)),
        ("", Verdict(False, False)),
    ],
)
def test_read_verdict(reply, expected):
    assert read_verdict(reply) == expected


class _ChatEndpoint(BaseHTTPRequestHandler):
    """Answers CORRECT when the generated answer contains the gold answer, as a generous judge would."""

    requests: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        prompt = body["messages"][0]["content"]
        gold = prompt.split("Gold answer: ")[1].split("\n")[0]
        answer = prompt.split("Generated answer: ")[1].split("\n")[0]
        label = "CORRECT" if gold.lower() in answer.lower() else "WRONG"
        payload = json.dumps({"choices": [{"message": {"content": json.dumps({"label": label})}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


def test_openai_compatible_judge_posts_chat_completions(monkeypatch):
    server = HTTPServer(("127.0.0.1", 0), _ChatEndpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("JUDGE_KEY", "secret")
    try:
        judge = OpenAICompatibleJudge(f"http://127.0.0.1:{server.server_port}/v1", "judge-model", "JUDGE_KEY", timeout_s=10)
        verdicts = judge(["Where?", "When?"], ["Paris", "2022"], ["in Paris, France", "last year"])
    finally:
        server.shutdown()
    assert verdicts == [Verdict(True, True), Verdict(False, True)]
    first = _ChatEndpoint.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["auth"] == "Bearer secret"
    assert first["body"]["model"] == "judge-model" and first["body"]["temperature"] == 0


def test_an_unreachable_endpoint_names_itself():
    judge = OpenAICompatibleJudge("http://127.0.0.1:9/v1", "m", timeout_s=2)
    with pytest.raises(ConnectionError, match="127.0.0.1:9/v1/chat/completions"):
        judge(["q"], ["a"], ["a"])


class _BrokenEndpoint(BaseHTTPRequestHandler):
    """Answers every request with `reply` and `status`, counting the requests."""

    status, reply, calls = 200, b"{}", 0

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).calls += 1
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.reply)))
        self.end_headers()
        self.wfile.write(self.reply)

    def log_message(self, *args) -> None:
        pass


@pytest.mark.parametrize(
    ("status", "reply", "error", "message", "calls"),
    [
        (200, b'{"unexpected": true}', ValueError, "unexpected reply", 1),  # no choices: named, not a KeyError
        (400, b'{"error": {"message": "bad model"}}', ConnectionError, "HTTP 400", 1),  # a 4xx fails at once
    ],
)
def test_a_reply_the_client_cannot_use_names_the_endpoint(status, reply, error, message, calls):
    _BrokenEndpoint.status, _BrokenEndpoint.reply, _BrokenEndpoint.calls = status, reply, 0
    server = HTTPServer(("127.0.0.1", 0), _BrokenEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        judge = OpenAICompatibleJudge(f"http://127.0.0.1:{server.server_port}/v1", "m", timeout_s=5)
        with pytest.raises(error, match=message) as raised:
            judge(["q"], ["a"], ["a"])
    finally:
        server.shutdown()
    assert f"127.0.0.1:{server.server_port}/v1/chat/completions" in str(raised.value) and _BrokenEndpoint.calls == calls
