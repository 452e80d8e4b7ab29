"""`memr1 serve`: a `Memory` behind Mem0's REST routes, plus `POST /answer`, `POST /memories/{id}/restore`,
`GET /health`, the OpenAI-compatible `/v1/chat/completions` and `/v1/models` for the loaded model
(`memr1.service.openai_api`), and the memory's MCP tools at `/mcp` (`memr1.service.mcp`).

Bad input is a 4xx naming the field: 422 for a malformed body (FastAPI's validation, with the field's
location), 400 for a value the memory layer refuses (empty messages, no user_id), 404 for an unknown
memory id, 413 for a body over `max_body_bytes` (counted as it arrives, so a chunked body is held to it
too), 401 without the API key when one is set. Every refusal is decided before anything is written:
a 200 means the write happened. Route
handlers are plain functions, run in the server's thread pool; `Memory` serialises each scope's
writes, and every read goes to Milvus, so replicas of this server on one Milvus server agree.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from memr1.service.gates import MAX_BODY_BYTES, UNAUTHORISED, BodyLimit, key_matches
from memr1.service.mcp import MemoryMCP, mount_mcp
from memr1.service.memory import Memory, MemoryNotFound
from memr1.service.models import TextModel
from memr1.service.openai_api import install_error_shapes, openai_router

# Request bodies are JSON with finite numbers only: NaN or Infinity is a 422 naming the field.
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


def finite_json(value: Any, where: str) -> Any:
    """`value` (parsed JSON) unchanged, or a ValueError naming the first non-finite number in it."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: {value} is not a finite number")
    if isinstance(value, dict):
        for key, item in value.items():
            finite_json(item, f"{where}.{key}")
    if isinstance(value, list):
        for index, item in enumerate(value):
            finite_json(item, f"{where}[{index}]")
    return value


class Message(BaseModel):
    model_config = STRICT
    role: str = Field(min_length=1, max_length=64)
    content: str = Field(min_length=1)


class MemoryCreate(BaseModel):
    model_config = STRICT
    messages: list[Message] = Field(min_length=1)
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    metadata: dict[str, Any] | None = None
    infer: bool = True
    timestamp: float | None = Field(None, ge=0)  # Mem0 2.x: the memories' date, in Unix seconds

    @field_validator("metadata")
    @classmethod
    def _finite_metadata(cls, metadata: dict[str, Any] | None) -> dict[str, Any] | None:
        return finite_json(metadata, "metadata")


class MemoryUpdate(BaseModel):
    """Mem0's PUT body: a new `text`, new `metadata` (replacing the old), or both."""

    model_config = STRICT
    text: str | None = Field(None, min_length=1)
    metadata: dict[str, Any] | None = None

    @field_validator("metadata")
    @classmethod
    def _finite_metadata(cls, metadata: dict[str, Any] | None) -> dict[str, Any] | None:
        return finite_json(metadata, "metadata")


class SearchRequest(BaseModel):
    model_config = STRICT
    query: str = Field(min_length=1)
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    filters: dict[str, str] | None = None
    top_k: int = Field(20, ge=1, le=1000)
    threshold: float | None = None


class AnswerRequest(BaseModel):
    model_config = STRICT
    question: str = Field(min_length=1)
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None


def create_app(memory: Memory, chat_model: TextModel | None = None, api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The FastAPI app over `memory`; `chat_model` serves `/v1/chat/completions` (default: the
    Answer Agent's model)."""
    app = FastAPI(title="memr1 memory service", version="1")
    chat_model = chat_model or memory.answerer

    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    install_error_shapes(app)

    def authorised(request: Request) -> None:
        if api_key is not None and not key_matches(request.headers.get("authorization", ""), api_key):
            raise HTTPException(status_code=401, detail=UNAUTHORISED)

    auth = [Depends(authorised)]

    def call(function: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except MemoryNotFound as error:
            raise HTTPException(status_code=404, detail=str(error)) from None
        except ValueError as error:
            raise HTTPException(status_code=400, detail=str(error)) from None

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "models": {
            role: None if model is None else model.name for role, model in
            (("extractor", memory.extractor), ("manager", memory.manager), ("answerer", memory.answerer))
        }}

    @app.post("/memories", dependencies=auth)
    def add(body: MemoryCreate) -> dict[str, Any]:
        messages = [message.model_dump() for message in body.messages]
        return call(memory.add, messages, user_id=body.user_id, agent_id=body.agent_id, run_id=body.run_id, metadata=body.metadata,
                    infer=body.infer, timestamp=body.timestamp)

    @app.get("/memories", dependencies=auth)
    def get_all(user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None, top_k: int = Query(100, ge=1, le=10_000)) -> dict[str, Any]:
        return call(memory.get_all, user_id=user_id, agent_id=agent_id, run_id=run_id, top_k=top_k)

    @app.get("/memories/{memory_id}", dependencies=auth)
    def get(memory_id: str) -> dict[str, Any]:
        item = call(memory.get, memory_id)
        if item is None:
            raise HTTPException(status_code=404, detail=f"memory id {memory_id!r}: no such live memory")
        return item

    @app.post("/search", dependencies=auth)
    def search(body: SearchRequest) -> dict[str, Any]:
        return call(memory.search, body.query, user_id=body.user_id, agent_id=body.agent_id, run_id=body.run_id, filters=body.filters, top_k=body.top_k, threshold=body.threshold)

    @app.put("/memories/{memory_id}", dependencies=auth)
    def update(memory_id: str, body: MemoryUpdate) -> dict[str, Any]:
        return call(memory.update, memory_id, text=body.text, metadata=body.metadata)

    @app.get("/memories/{memory_id}/history", dependencies=auth)
    def history(memory_id: str) -> list[dict[str, Any]]:
        return call(memory.history, memory_id)

    @app.delete("/memories/{memory_id}", dependencies=auth)
    def delete(memory_id: str) -> dict[str, Any]:
        return call(memory.delete, memory_id)

    @app.post("/memories/{memory_id}/restore", dependencies=auth)
    def restore(memory_id: str) -> dict[str, Any]:
        return call(memory.restore, memory_id)

    @app.delete("/memories", dependencies=auth)
    def delete_all(user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None) -> dict[str, Any]:
        return call(memory.delete_all, user_id=user_id, agent_id=agent_id, run_id=run_id)

    @app.post("/reset", dependencies=auth)
    def reset() -> dict[str, str]:
        call(memory.reset)
        return {"message": "All memories reset"}

    @app.post("/answer", dependencies=auth)
    def answer(body: AnswerRequest) -> dict[str, Any]:
        return call(memory.answer, body.question, user_id=body.user_id, agent_id=body.agent_id, run_id=body.run_id)

    app.include_router(openai_router(chat_model, auth, call, memory.embedder))
    mount_mcp(app, MemoryMCP(memory), api_key)
    return app
