"""The models behind the memory service, as text in, text out: a local policy (the embedded SmolLM2,
a Hugging Face directory, or a trained `policy/` export on its backbone) or an OpenAI-compatible
endpoint. Each call is greedy; one lock per local model, which is not safe to call from two threads."""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from memr1.llm.openai_client import OpenAICompatibleClient
from memr1.llm.sampling import SamplingConfig

Messages = Sequence[Mapping[str, str]]
EMBEDDED_DEFAULT = "embedded:smollm2-135m-instruct"


@dataclass(frozen=True)
class Completion:
    """One reply as the OpenAI protocol reports it."""

    text: str
    finish_reason: Literal["stop", "length"]  # "length": cut at the token budget
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class ResponseFormat:
    """A reply that must be JSON: any object (`json_object`) or one that fits `schema` (`json_schema`)."""

    kind: Literal["json_object", "json_schema"]
    schema: Mapping[str, Any] | None = None
    name: str = "response"

    def as_openai(self) -> dict[str, Any]:
        if self.kind == "json_object":
            return {"type": "json_object"}
        return {"type": "json_schema", "json_schema": {"name": self.name, "schema": dict(self.schema or {})}}


class TextModel(Protocol):
    name: str

    def complete(self, prompts: Sequence[Messages], max_new_tokens: int) -> list[str]:
        """One greedy reply per chat prompt."""

    def chat(self, messages: Messages, sampling: SamplingConfig, response_format: ResponseFormat | None = None) -> Completion:
        """One reply to `messages`, decoded as `sampling` says (temperature, top_p, stop, seed, budget),
        and JSON when `response_format` says so."""

    def chat_stream(
        self, messages: Messages, sampling: SamplingConfig, response_format: ResponseFormat | None = None
    ) -> Iterator[str | Completion]:
        """`chat`'s reply as it is decoded: text pieces, each continuing the last, then the `Completion`
        (whose text the pieces add up to). Bad settings raise here, before the first piece."""


# Draft tokens a served request decodes per forward where its reply copies its context (HFEngine's
# prompt lookup): on conv-30's (validation) questions, 4 and 8 answered alike and as fast, 16 slower.
PROMPT_LOOKUP_TOKENS = 8


class LocalModel:
    """A causal LM loaded in this process through an HF generation engine."""

    def __init__(
        self, name_or_path: str = EMBEDDED_DEFAULT, adapter: str | None = None, dtype: str = "float32", batch_size: int = 8,
        precision: str = "auto", prompt_lookup: int = PROMPT_LOOKUP_TOKENS,
    ) -> None:
        import torch

        from memr1.factories import build_engine, frozen_policy
        from memr1.llm.engines import HFEngine
        from memr1.llm.precision import choose_precision

        model, tokenizer = frozen_policy(name_or_path, dtype, adapter)
        compute = choose_precision(precision, next(model.parameters()).device if torch.cuda.is_available() else "cpu")
        engine = build_engine("hf", model=model, tokenizer=tokenizer, batch_size=batch_size, precision=compute, prompt_lookup=prompt_lookup,
                              reuse_prefix=True)  # frozen weights: a request's cache serves the next one's shared prefix
        assert isinstance(engine, HFEngine)  # engine="hf": a stream reads its tokens as they are chosen
        self.engine = engine
        self.name = f"{name_or_path}+{adapter}" if adapter else str(name_or_path)
        self._lock = threading.Lock()
        self._grammars: Any = None  # JSONGrammars, made on the first JSON request (xgrammar's tables)

    def complete(self, prompts: Sequence[Messages], max_new_tokens: int) -> list[str]:
        with self._lock:
            outputs = self.engine.generate(list(prompts), SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0))
        return [samples[0].text for samples in outputs]

    def chat(self, messages: Messages, sampling: SamplingConfig, response_format: ResponseFormat | None = None) -> Completion:
        return self._reply(messages, self._constrained(sampling, response_format))

    def chat_stream(
        self, messages: Messages, sampling: SamplingConfig, response_format: ResponseFormat | None = None
    ) -> Iterator[str | Completion]:
        sampling = self._constrained(sampling, response_format)  # a bad schema raises now, not mid-stream
        return self._stream(messages, sampling)

    def _constrained(self, sampling: SamplingConfig, response_format: ResponseFormat | None) -> SamplingConfig:
        if response_format is None:
            return sampling
        with self._lock:
            return dataclasses.replace(sampling, constraint=self._json_constraint(response_format))

    def _reply(self, messages: Messages, sampling: SamplingConfig, on_token: Callable[[int, int, int], None] | None = None) -> Completion:
        with self._lock:
            reply = self.engine.generate([messages], sampling, on_token=on_token)[0][0]
        return Completion(reply.text, reply.finish_reason, len(reply.prompt_ids), len(reply.response_ids))

    def _stream(self, messages: Messages, sampling: SamplingConfig) -> Iterator[str | Completion]:
        """Decode in a thread, turning its tokens into text as they come. A piece is held back while
        it could still turn out to be the start of a stop string (the reply is cut before it) or ends
        in a character whose bytes have not all come. Closing the stream (the client left) stops the
        decoding at its next token."""
        events: queue.Queue[int | Completion | BaseException] = queue.Queue()
        left = threading.Event()

        def chosen(prompt: int, sample: int, token: int) -> None:
            if left.is_set():
                raise _ClientLeft
            events.put(token)

        def decode() -> None:
            try:
                events.put(self._reply(messages, sampling, on_token=chosen))
            except _ClientLeft:
                pass
            except BaseException as error:  # noqa: BLE001 - handed to the consumer, which raises it
                events.put(error)

        threading.Thread(target=decode, name="memr1-stream", daemon=True).start()
        held = max((len(stop) for stop in sampling.stop), default=0)
        tokens: list[int] = []
        sent = ""
        try:
            while True:
                event = events.get()
                if isinstance(event, BaseException):
                    raise event
                if isinstance(event, Completion):
                    if len(event.text) > len(sent) and event.text.startswith(sent):
                        yield event.text[len(sent) :]
                    yield event
                    return
                tokens.append(event)
                text = self.engine.tokenizer.decode(tokens, skip_special_tokens=True)
                ready = text[: len(text) - held].rstrip("\ufffd")
                if len(ready) > len(sent) and ready.startswith(sent):
                    yield ready[len(sent) :]
                    sent = ready
        finally:
            left.set()

    def _json_constraint(self, response_format: ResponseFormat) -> Any:
        if self._grammars is None:
            from memr1.llm.constraints import JSONGrammars

            model, tokenizer = self.engine.model, self.engine.tokenizer
            try:
                self._grammars = JSONGrammars(tokenizer, model.config.vocab_size, sorted(self.engine.eos_token_ids))
            except ImportError as missing:
                raise ValueError(f"response_format: {missing}") from None
        if response_format.kind == "json_object":
            return self._grammars.json_object()
        return self._grammars.json_schema(response_format.schema or {})


class _ClientLeft(Exception):
    """Raised in a streaming decode whose client closed the stream."""


class RemoteModel:
    """A model behind an OpenAI-compatible `/v1/chat/completions` endpoint."""

    def __init__(self, url: str, model: str, api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 120) -> None:
        self.client = OpenAICompatibleClient(url, model, api_key_env, timeout_s)
        self.name = f"{model}@{url}"

    def complete(self, prompts: Sequence[Messages], max_new_tokens: int) -> list[str]:
        return [self.client.chat(prompt, max_tokens=max_new_tokens) for prompt in prompts]

    def chat(self, messages: Messages, sampling: SamplingConfig, response_format: ResponseFormat | None = None) -> Completion:
        choice, usage = self.client.completion(
            messages, max_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
            stop=sampling.stop, seed=sampling.seed, response_format=response_format.as_openai() if response_format else None,
        )
        usage = usage or {}
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return Completion(choice["message"].get("content") or "", finish, int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))

    def chat_stream(
        self, messages: Messages, sampling: SamplingConfig, response_format: ResponseFormat | None = None
    ) -> Iterator[str | Completion]:
        """The endpoint's reply in one piece (memr1 asks it without streaming), then its `Completion`."""
        reply = self.chat(messages, sampling, response_format)
        return iter([reply.text, reply] if reply.text else [reply])


def text_model(
    spec: str | None, adapter: str | None = None, models: dict[str, TextModel] | None = None, precision: str = "auto",
    prompt_lookup: int = PROMPT_LOOKUP_TOKENS,
) -> TextModel | None:
    """A model from a spec: None (no model), "openai:URL#MODEL" (an endpoint), else a local
    `name_or_path` with an optional trained `adapter`, computing in `precision` (auto: bf16 where the
    machine has bf16 units) and decoding a lone request `prompt_lookup` draft tokens a forward.
    `models` caches by spec, so the Manager and the Answer Agent share one copy of the same weights."""
    if spec is None:
        return None
    key = f"{spec}|{adapter}"
    if models is not None and key in models:
        return models[key]
    if spec.startswith("openai:"):
        url, _, name = spec.removeprefix("openai:").partition("#")
        if not url or not name:
            raise ValueError(f"model spec {spec!r}: expected openai:URL#MODEL, e.g. openai:http://127.0.0.1:8000/v1#memr1")
        model: TextModel = RemoteModel(url, name)
    else:
        model = LocalModel(spec, adapter=adapter, precision=precision, prompt_lookup=prompt_lookup)
    if models is not None:
        models[key] = model
    return model
