"""The models behind the memory service, as text in, text out: a local policy (the embedded SmolLM2,
a Hugging Face directory, or a trained `policy/` export on its backbone) or an OpenAI-compatible
endpoint. Each call is greedy; one lock per local model, which is not safe to call from two threads."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Protocol

from memr1.llm.openai_client import OpenAICompatibleClient
from memr1.llm.sampling import SamplingConfig

Messages = Sequence[Mapping[str, str]]
EMBEDDED_DEFAULT = "embedded:smollm2-135m-instruct"


class TextModel(Protocol):
    name: str

    def complete(self, prompts: Sequence[Messages], max_new_tokens: int) -> list[str]:
        """One greedy reply per chat prompt."""


class LocalModel:
    """A causal LM loaded in this process through an HF generation engine."""

    def __init__(
        self, name_or_path: str = EMBEDDED_DEFAULT, adapter: str | None = None, dtype: str = "float32", batch_size: int = 8,
        precision: str = "auto",
    ) -> None:
        import torch

        from memr1.factories import build_engine, frozen_policy
        from memr1.llm.precision import choose_precision

        model, tokenizer = frozen_policy(name_or_path, dtype, adapter)
        compute = choose_precision(precision, next(model.parameters()).device if torch.cuda.is_available() else "cpu")
        self.engine = build_engine("hf", model=model, tokenizer=tokenizer, batch_size=batch_size, precision=compute)
        self.name = f"{name_or_path}+{adapter}" if adapter else str(name_or_path)
        self._lock = threading.Lock()

    def complete(self, prompts: Sequence[Messages], max_new_tokens: int) -> list[str]:
        with self._lock:
            outputs = self.engine.generate(list(prompts), SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0))
        return [samples[0].text for samples in outputs]


class RemoteModel:
    """A model behind an OpenAI-compatible `/v1/chat/completions` endpoint."""

    def __init__(self, url: str, model: str, api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 120) -> None:
        self.client = OpenAICompatibleClient(url, model, api_key_env, timeout_s)
        self.name = f"{model}@{url}"

    def complete(self, prompts: Sequence[Messages], max_new_tokens: int) -> list[str]:
        return [self.client.chat(prompt, max_tokens=max_new_tokens) for prompt in prompts]


def text_model(
    spec: str | None, adapter: str | None = None, models: dict[str, TextModel] | None = None, precision: str = "auto"
) -> TextModel | None:
    """A model from a spec: None (no model), "openai:URL#MODEL" (an endpoint), else a local
    `name_or_path` with an optional trained `adapter`, computing in `precision` (auto: bf16 where the
    machine has bf16 units). `models` caches by spec, so the Manager and the Answer Agent share one copy
    of the same weights."""
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
        model = LocalModel(spec, adapter=adapter, precision=precision)
    if models is not None:
        models[key] = model
    return model
