"""What every HTTP request of the service passes first: the body limit and the API key, one check each
for the REST routes, the OpenAI routes and the MCP endpoint."""

from __future__ import annotations

import hmac
import json

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message as ASGIMessage, Receive, Scope, Send

MAX_BODY_BYTES = 1 << 20  # 1 MiB: far above any conversation chunk, far below what would hurt


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is a 413, whether its Content-Length says so
    up front or its chunks add up to it as they arrive (the handler's read of the body is cut there)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    def refusal(self, size: str) -> HTTPException:
        return HTTPException(status_code=413, detail=f"body of {size} bytes; the limit is {self.max_bytes}")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"").decode()
        if declared.isdigit() and int(declared) > self.max_bytes:
            error = self.refusal(declared)
            await JSONResponse(status_code=error.status_code, content={"detail": error.detail})(scope, receive, send)
            return
        received = 0

        async def counted() -> ASGIMessage:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # FastAPI passes an HTTPException raised while reading the body on as itself.
                    raise self.refusal(f"more than {self.max_bytes}")
            return message

        await self.app(scope, counted, send)


UNAUTHORISED = "missing or wrong API key (Authorization: Bearer KEY)"


def key_matches(authorization: str, api_key: str) -> bool:
    """Whether an Authorization header (`Bearer KEY`, or `Token KEY` as Mem0's clients send) carries
    `api_key`; compared in constant time."""
    token = authorization.removeprefix("Bearer ").removeprefix("Token ")
    return hmac.compare_digest(token.encode(), api_key.encode())


class ApiKeyGate:
    """ASGI middleware: an HTTP request without the API key is a 401 and reaches nothing behind."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app, self.api_key = app, api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        authorization = dict(scope.get("headers", [])).get(b"authorization", b"").decode("latin-1")
        if scope["type"] == "http" and not key_matches(authorization, self.api_key):
            body = json.dumps({"detail": UNAUTHORISED}).encode()
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
