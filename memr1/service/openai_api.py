"""The OpenAI-compatible routes of `memr1 serve`: `POST /v1/chat/completions` (plain and streamed as
server-sent events) and `GET /v1/models`, for the model the service loaded, so that the official
`openai` client, Mem0's OpenAI provider and other OpenAI-speaking tools can call it.

What the protocol asks is honoured or refused, never silently ignored: content as a string or as a list
of text parts; `max_tokens` / `max_completion_tokens`, `temperature` (OpenAI's default 1.0),
`top_p`, `stop`, `seed`; `finish_reason` "length" when the reply was cut at its budget; `usage`; for
a stream, `stream_options.include_usage`. A request for what the service cannot do (n > 1, log-probs,
tools, penalties, a logit bias, non-text content parts) is a 400 naming the field. `response_format`
`json_object` / `json_schema` is enforced by constrained decoding (memr1/llm/constraints.py): the reply
parses, and fits the schema, unless it was cut at its token budget (`finish_reason` "length"). A
stream carries the reply as the local model decodes it, a content chunk per piece of text (an
OpenAI-compatible upstream's reply comes in one piece).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Literal

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from pydantic import BaseModel, ConfigDict, Field

from memr1.embed import Embedder
from memr1.llm.sampling import SamplingConfig
from memr1.service.models import Completion, ResponseFormat, TextModel

DEFAULT_MAX_TOKENS = 256
# Fields that would change the reply in ways the service does not implement: refused, not ignored.
# Each maps to the value that asks for nothing (the OpenAI default).
UNSUPPORTED = {"n": 1, "logprobs": False, "top_logprobs": None, "tools": None, "tool_choice": None,
               "functions": None, "function_call": None, "frequency_penalty": 0, "presence_penalty": 0,
               "logit_bias": None, "audio": None, "modalities": None, "prediction": None}


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # name, tool_call_id, ...
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # user, metadata, store, ...: no effect on the reply
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=4096)
    max_completion_tokens: int | None = Field(None, ge=1, le=4096)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: dict[str, Any] | None = None


def message_texts(request: ChatRequest) -> list[dict[str, str]]:
    """The messages as {role, content} strings; text parts are joined, any other part is refused."""
    messages = []
    for index, message in enumerate(request.messages):
        content = message.content
        if isinstance(content, list):
            for part_index, part in enumerate(content):
                if part.type != "text" or part.text is None:
                    raise HTTPException(400, f"messages[{index}].content[{part_index}].type: {part.type!r} parts are not supported (text only)")
            content = "\n".join(part.text or "" for part in content)
        messages.append({"role": "system" if message.role == "developer" else message.role, "content": content or ""})
    return messages


def sampling_of(request: ChatRequest) -> SamplingConfig:
    """The request's decoding settings, after refusing what the service does not implement."""
    extras = request.model_extra or {}
    for field, neutral in UNSUPPORTED.items():
        if field in extras and extras[field] not in (neutral, None, [], {}):
            raise HTTPException(400, f"{field}: {extras[field]!r} is not supported by this server")
    if request.max_tokens and request.max_completion_tokens and request.max_tokens != request.max_completion_tokens:
        raise HTTPException(400, "max_tokens and max_completion_tokens disagree: send one")
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if len(stop) > 4 or any(not text for text in stop):
        raise HTTPException(400, f"stop: up to 4 non-empty strings, got {stop!r}")
    return SamplingConfig(
        max_new_tokens=request.max_completion_tokens or request.max_tokens or DEFAULT_MAX_TOKENS,
        temperature=request.temperature,
        top_p=request.top_p,
        stop=tuple(stop),
        seed=request.seed,
    )


def response_format_of(request: ChatRequest) -> ResponseFormat | None:
    """OpenAI's `response_format`: text (None), `json_object`, or `json_schema` with its schema."""
    spec = request.response_format
    if spec is None or spec.get("type", "text") == "text":
        return None
    if spec.get("type") == "json_object":
        return ResponseFormat("json_object")
    if spec.get("type") != "json_schema":
        raise HTTPException(400, f"response_format.type: {spec.get('type')!r} is not one of text, json_object, json_schema")
    inner = spec.get("json_schema")
    if not isinstance(inner, dict) or not isinstance(inner.get("schema"), dict):
        raise HTTPException(400, "response_format.json_schema.schema: a JSON Schema object is required")
    return ResponseFormat("json_schema", inner["schema"], str(inner.get("name", "response")))


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # user: no effect
    model: str | None = None
    input: str | list[str] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] = "float"  # base64: little-endian float32 (the openai client's default)
    dimensions: int | None = Field(None, ge=1)


def openai_router(chat_model: TextModel | None, dependencies: list[Any], errors: Callable[..., Any], embedder: Embedder | None = None) -> APIRouter:
    """The routes for `chat_model` (None: chat refused with a 400) and `embedder` (`/v1/embeddings`,
    the service's own memory embedder: other tools then embed as the banks do); `errors` maps the
    model's own refusals (a ValueError) to 4xx, as the other routes do."""
    router = APIRouter(dependencies=dependencies)
    created = int(time.time())

    @router.post("/v1/embeddings")
    def embeddings(request: EmbeddingsRequest) -> dict[str, Any]:
        if embedder is None:
            raise HTTPException(400, "no embedder loaded")
        texts = [request.input] if isinstance(request.input, str) else request.input
        if any(not text.strip() for text in texts):
            raise HTTPException(400, "input: every text must be non-empty")
        if request.dimensions is not None and request.dimensions != embedder.dim:
            raise HTTPException(400, f"dimensions: this embedder's vectors have {embedder.dim}, not {request.dimensions}")
        vectors = embedder.encode(texts)
        tokens = embedder.count_tokens(texts)
        def encoded(vector: Any) -> list[float] | str:
            if request.encoding_format == "base64":
                return base64.b64encode(vector.astype("<f4").tobytes()).decode()
            return vector.tolist()

        return {"object": "list", "model": embedder.model_name, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                "data": [{"object": "embedding", "index": index, "embedding": encoded(vector)} for index, vector in enumerate(vectors)]}

    def served() -> TextModel:
        if chat_model is None:
            raise HTTPException(status_code=400, detail="no model loaded to chat with (memr1 serve --answer base|DIR|openai:URL#MODEL)")
        return chat_model

    @router.get("/v1/models")
    def models() -> dict[str, Any]:
        listed = [] if chat_model is None else [{"id": chat_model.name, "object": "model", "created": created, "owned_by": "memr1"}]
        return {"object": "list", "data": listed}

    @router.post("/v1/chat/completions", response_model=None)
    def chat(request: ChatRequest) -> dict[str, Any] | StreamingResponse:
        model = served()
        messages, sampling, response_format = message_texts(request), sampling_of(request), response_format_of(request)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": model.name}
        if request.stream:
            # Settings are checked (and refused with a 4xx) before the 200 and the first chunk.
            pieces = errors(model.chat_stream, messages, sampling, response_format)
            with_usage = request.stream_options is not None and request.stream_options.include_usage
            return StreamingResponse(stream_events(head, pieces, with_usage), media_type="text/event-stream")
        reply: Completion = errors(model.chat, messages, sampling, response_format)
        return {**head, "object": "chat.completion", "usage": usage_of(reply), "choices": [
            {"index": 0, "message": {"role": "assistant", "content": reply.text}, "finish_reason": reply.finish_reason}]}

    return router


def field_of(location: tuple[Any, ...] | list[Any]) -> str:
    """A validation error's location as the field's path: ("body", "messages", 0, "content") ->
    "messages[0].content"."""
    path = ""
    for part in location[1:] if location and location[0] in ("body", "query", "path") else location:
        path += f"[{part}]" if isinstance(part, int) else f"{'.' if path else ''}{part}"
    return path


def install_error_shapes(app: FastAPI) -> None:
    """Errors as each client expects them: under /v1/ in OpenAI's shape (`{"error": {"message",
    "type", "param"}}`, which the openai client shows), elsewhere FastAPI's `{"detail": ...}`. A
    validation error never echoes the input back (a NaN would not serialise: a 500 instead of a 422)."""

    def respond(request: Request, status: int, message: str, param: str | None, detail: Any) -> JSONResponse:
        if request.url.path.startswith("/v1/"):
            kind = "invalid_request_error" if status < 500 else "server_error"
            return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "param": param, "code": None}})
        return JSONResponse(status_code=status, content={"detail": detail})

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in error.errors()]
        message = "; ".join(f"{field_of(p['loc'])}: {p['msg']}" for p in problems)
        return respond(request, 422, message, field_of(problems[0]["loc"]) if problems else None, problems)

    @app.exception_handler(StarletteHTTPException)
    async def refused(request: Request, error: StarletteHTTPException) -> JSONResponse:
        message = str(error.detail)
        return respond(request, error.status_code, message, message.split(":", 1)[0] if ":" in message else None, error.detail)


def usage_of(reply: Completion) -> dict[str, int]:
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}


def stream_events(head: dict[str, Any], pieces: Iterator[str | Completion], with_usage: bool) -> Iterator[str]:
    """The reply as `chat.completion.chunk` server-sent events: the role, a content chunk per piece
    as it is decoded, the finish reason, the usage when asked (with empty choices, as OpenAI sends
    it), then `[DONE]`."""
    chunk = {**head, "object": "chat.completion.chunk"}

    def event(delta: dict[str, str], finish: str | None = None) -> str:
        return f"data: {json.dumps({**chunk, 'choices': [{'index': 0, 'delta': delta, 'finish_reason': finish}]})}\n\n"

    yield event({"role": "assistant", "content": ""})
    for piece in pieces:
        if isinstance(piece, str):
            yield event({"content": piece})
            continue
        yield event({}, piece.finish_reason)
        if with_usage:
            yield f"data: {json.dumps({**chunk, 'choices': [], 'usage': usage_of(piece)})}\n\n"
    yield "data: [DONE]\n\n"
