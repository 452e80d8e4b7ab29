"""Chat completions from OpenAI-compatible endpoints (vLLM, llama.cpp, `memr1 serve`, hosted APIs)
through the official `openai` client: the judge, teachers and the memory service's remote models all
call through `OpenAICompatibleClient`, which adds what they share: the endpoint named in every error,
and a reply read as the first choice and its usage."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import openai


class EndpointError(ConnectionError):
    """The endpoint could not be reached, kept failing after the retries, or refused the request."""


class OpenAICompatibleClient:
    """`POST {url}/chat/completions` by `openai.OpenAI`: `retries` retries with its exponential backoff
    on connection errors, timeouts, 408 / 409 / 429 and 5xx answers; any other 4xx fails at once, and
    a reply without a first choice's message is a ValueError naming the endpoint."""

    def __init__(
        self, url: str, model: str, api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 60, retries: int = 2
    ) -> None:
        self.endpoint = url.rstrip("/") + "/chat/completions"
        self.model = model
        self.retries = retries
        # The client requires a key; an endpoint without one (vLLM, `memr1 serve` without --api-key-env)
        # ignores the placeholder.
        self._client = openai.OpenAI(
            base_url=url.rstrip("/"), api_key=os.environ.get(api_key_env) or "no-key", timeout=timeout_s, max_retries=retries
        )

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
        optional = {"max_tokens": max_tokens, "top_p": top_p, "stop": list(stop) or None, "seed": seed,
                    "response_format": dict(response_format) if response_format else None}
        try:
            reply = self._client.chat.completions.create(
                model=self.model, messages=[dict(m) for m in messages], temperature=temperature,  # type: ignore[misc]
                **{key: value for key, value in optional.items() if value is not None},
            )
        except openai.APIStatusError as error:
            raise EndpointError(f"endpoint {self.endpoint}: HTTP {error.status_code} {error.message}") from error
        except openai.APIConnectionError as error:  # timeouts included
            raise EndpointError(f"endpoint {self.endpoint} unreachable after {self.retries + 1} tries: {error}") from error
        payload = reply.model_dump()  # the client builds it without validating: a field may be missing
        choices = payload.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            raise ValueError(f"endpoint {self.endpoint}: unexpected reply {str(payload)[:200]}")
        usage = payload.get("usage")
        return choice, usage if isinstance(usage, dict) else None
