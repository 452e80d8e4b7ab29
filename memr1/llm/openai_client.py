"""A client of OpenAI-compatible chat-completions endpoints (vLLM, llama.cpp, `memr1 serve`, hosted
APIs): the judge, teachers and the memory service's remote models all call through it."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any


class EndpointError(ConnectionError):
    """The endpoint could not be reached, or kept failing, after the retries."""


class OpenAICompatibleClient:
    """`POST {url}/chat/completions`, with `retries` retries (exponential backoff) on connection
    errors, timeouts and 5xx answers; a 4xx or a malformed reply fails at once."""

    def __init__(
        self, url: str, model: str, api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 60, retries: int = 2
    ) -> None:
        self.endpoint = url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = os.environ.get(api_key_env, "")
        self.timeout_s = timeout_s
        self.retries = retries

    def chat(self, messages: Sequence[Mapping[str, str]], max_tokens: int | None = None, temperature: float = 0.0) -> str:
        """The first choice's message content for `messages`."""
        choice, _ = self.completion(messages, max_tokens=max_tokens, temperature=temperature)
        return choice["message"]["content"] or ""

    def completion(
        self,
        messages: Sequence[Mapping[str, str]],
        max_tokens: int | None = None,
        temperature: float = 0.0,
        top_p: float | None = None,
        stop: Sequence[str] = (),
        seed: int | None = None,
        response_format: Mapping[str, Any] | None = None,
    ) -> tuple[dict, dict | None]:
        """The first choice (`message`, `finish_reason`) and the `usage` (None when the endpoint
        reports none) for `messages`; `response_format` as OpenAI's (json_object, json_schema)."""
        body: dict = {"model": self.model, "messages": [dict(m) for m in messages], "temperature": temperature}
        optional = {"max_tokens": max_tokens, "top_p": top_p, "stop": list(stop) or None, "seed": seed,
                    "response_format": dict(response_format) if response_format else None}
        body.update({key: value for key, value in optional.items() if value is not None})
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.endpoint, data=json.dumps(body).encode(), headers=headers, method="POST")
        for attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    payload = json.loads(response.read())
                break
            except urllib.error.HTTPError as error:
                if error.code < 500 or attempt == self.retries:
                    raise EndpointError(f"endpoint {self.endpoint}: HTTP {error.code} {error.reason}") from error
            except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
                if attempt == self.retries:
                    raise EndpointError(
                        f"endpoint {self.endpoint} unreachable after {self.retries + 1} tries: {error}"
                    ) from error
            time.sleep(0.5 * 2**attempt)
        try:
            choice = payload["choices"][0]
            if not isinstance(choice["message"], dict):
                raise TypeError
        except (KeyError, IndexError, TypeError):
            raise ValueError(f"endpoint {self.endpoint}: unexpected reply {str(payload)[:200]}") from None
        usage = payload.get("usage")
        return choice, usage if isinstance(usage, dict) else None
