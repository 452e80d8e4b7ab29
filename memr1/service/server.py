"""`memr1 serve`: a `Memory` behind Mem0's REST routes, plus `POST /answer`, `POST /memories/{id}/restore`,
`GET /health` and an OpenAI-compatible `POST /v1/chat/completions` for the loaded model.

Bad input is a 4xx naming the field: 422 for a malformed body (FastAPI's validation, with the field's
location), 400 for a value the memory layer refuses (empty messages, no user_id), 404 for an unknown
memory id, 413 for a body over `max_body_bytes`, 401 without the API key when one is set. Route
handlers are plain functions, run in the server's thread pool; `Memory` serialises each bank's
operations, so concurrent writers and readers never see half an operation.
"""

from __future__ import annotations

import hmac
import time
import uuid
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from memr1.service.memory import Memory, MemoryNotFound
from memr1.service.models import TextModel

MAX_BODY_BYTES = 1 << 20  # 1 MiB: far above any conversation chunk, far below what would hurt


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: str = Field(min_length=1, max_length=64)
    content: str = Field(min_length=1)


class MemoryCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    messages: list[Message] = Field(min_length=1)
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    metadata: dict[str, Any] | None = None
    infer: bool = True


class MemoryUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1)


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(min_length=1)
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    filters: dict[str, str] | None = None
    top_k: int = Field(20, ge=1, le=1000)
    threshold: float | None = None


class AnswerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1)
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI clients send more fields (temperature, ...)
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=4096)


def create_app(memory: Memory, chat_model: TextModel | None = None, api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The FastAPI app over `memory`; `chat_model` serves `/v1/chat/completions` (default: the
    Answer Agent's model)."""
    app = FastAPI(title="memr1 memory service", version="1")
    chat_model = chat_model or memory.answerer

    @app.middleware("http")
    async def limit_body(request: Request, call_next: Any) -> Any:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            return JSONResponse(status_code=413, content={"detail": f"body of {declared} bytes; the limit is {max_body_bytes}"})
        return await call_next(request)

    def authorised(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        token = header.removeprefix("Bearer ").removeprefix("Token ")
        if not hmac.compare_digest(token.encode(), api_key.encode()):
            raise HTTPException(status_code=401, detail="missing or wrong API key (Authorization: Bearer KEY)")

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
            role: getattr(model, "name", None) for role, model in
            (("extractor", memory.extractor), ("manager", memory.manager), ("answerer", memory.answerer))
        }}

    @app.post("/memories", dependencies=auth)
    def add(body: MemoryCreate) -> dict[str, Any]:
        messages = [message.model_dump() for message in body.messages]
        return call(memory.add, messages, user_id=body.user_id, agent_id=body.agent_id, run_id=body.run_id, metadata=body.metadata, infer=body.infer)

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
        return call(memory.update, memory_id, body.text)

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

    @app.post("/v1/chat/completions", dependencies=auth)
    def chat(body: ChatRequest) -> dict[str, Any]:
        if chat_model is None:
            raise HTTPException(status_code=400, detail="no model loaded to chat with (memr1 serve --answer-model ...)")
        text = chat_model.complete([[m.model_dump() for m in body.messages]], body.max_tokens or 256)[0]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.model or chat_model.name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        }

    return app
