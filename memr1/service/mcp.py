"""`memr1 mcp`: the memory as Model Context Protocol tools, on the official `mcp` SDK.

The tools carry OpenMemory's names and arguments (`add_memories`, `search_memory`, `list_memories`,
`delete_memories`, `delete_all_memories`), plus memr1's `answer`, `history` and `restore`. Each acts
for one user: the tool's `user_id` argument, else the connection's (`--user-id` over stdio, the URL's
`?user_id=` over HTTP, as OpenMemory takes it from its URL). A memory named by id is found only in
that user's scope: another user's id reads as "no such memory".

Transports: stdio (desktop agents start `memr1 mcp`), and streamable HTTP, stateless with JSON replies,
so that a plain JSON-RPC client can post `tools/list` / `tools/call` without a session or an
`initialize` (as the neutral memory benchmarks do) while the SDK's own client works as usual. Over HTTP
it is mounted on `memr1 serve` at `/mcp` or served alone (`memr1 mcp --transport http`), behind the
same API key and body limit as the REST routes.

A refused call is an MCP error result (`isError`) whose text names what is wrong; it writes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import FastAPI
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import Field

from memr1.service.gates import MAX_BODY_BYTES, ApiKeyGate, BodyLimit
from memr1.service.memory import Memory
from memr1.service.scopes import MemoryNotFound, scope_of

MCP_PATH = "/mcp"
MAX_IDS = 1000  # memory ids one delete_memories call may name

INSTRUCTIONS = (
    "memr1: a long-term memory managed by a trained Memory Manager. add_memories stores what the user "
    "said (the Manager ADDs, UPDATEs an outdated memory, DELETEs a contradicted one, or keeps nothing new, "
    "and says which); search_memory finds memories; answer replies from them in a few words."
)

UserId = Annotated[str | None, Field(description="whose memories (default: the connection's user)", max_length=256)]


def _refused(call: Any, *args: Any, **kwargs: Any) -> Any:
    """`call`'s result, or a ToolError carrying the memory layer's refusal (nothing was written)."""
    try:
        return call(*args, **kwargs)
    except (ValueError, MemoryNotFound) as error:
        raise ToolError(str(error)) from None


class MemoryMCP(MCPServer):
    """An `MCPServer` whose tools act on one `Memory`."""

    def __init__(self, memory: Memory, default_user_id: str | None = None) -> None:
        super().__init__(name="memr1", instructions=INSTRUCTIONS, log_level="WARNING")
        if default_user_id is not None:
            scope_of(default_user_id)  # a bad default is refused at start, not at the first call
        self.memory, self.default_user_id = memory, default_user_id
        self._install_tools()

    def _user(self, user_id: str | None, context: Context) -> str:
        """The user a call acts for: its argument, else the connection's; a ToolError when neither is set."""
        if user_id is None:
            request = context.request_context.request
            user_id = (request.query_params.get("user_id") if request is not None else None) or self.default_user_id
        if user_id is None:
            raise ToolError("user_id: required (as the tool's argument, or the connection's: --user-id / ?user_id=)")
        return user_id

    def _own(self, memory_id: str, user: str, live: bool = True) -> None:
        """Refuse `memory_id` unless it is a memory of `user`'s scope (live, unless `live=False`)."""
        stored = self.memory.record(memory_id) if isinstance(memory_id, str) and memory_id else None
        if stored is None or stored.scope != scope_of(user) or (live and stored.deleted):
            raise ToolError(f"memory id {memory_id!r}: no such {'live ' if live else ''}memory of this user")

    def _install_tools(self) -> None:
        memory = self.memory

        @self.tool(description="Store what the user said. Returns what the Memory Manager did with each fact: "
                   "ADD, UPDATE (with the text it replaced), DELETE, or NONE (with the memory judged equal).")
        def add_memories(
            text: Annotated[str, Field(description="what to remember, in the user's words", min_length=1)],
            context: Context, user_id: UserId = None,
        ) -> dict[str, Any]:
            return _refused(memory.add, text, user_id=self._user(user_id, context))

        @self.tool(description="The user's memories most relevant to a query, with their similarity scores.")
        def search_memory(
            query: Annotated[str, Field(description="what to look for", min_length=1)],
            context: Context, user_id: UserId = None,
            limit: Annotated[int, Field(ge=1, le=1000, description="how many memories at most")] = 10,
        ) -> dict[str, Any]:
            return _refused(memory.search, query, user_id=self._user(user_id, context), top_k=limit)

        @self.tool(description="All of the user's current memories, oldest first.")
        def list_memories(
            context: Context, user_id: UserId = None,
            limit: Annotated[int, Field(ge=1, le=10_000, description="how many memories at most")] = 100,
        ) -> dict[str, Any]:
            return _refused(memory.get_all, user_id=self._user(user_id, context), top_k=limit)

        @self.tool(description="Delete some of the user's memories by id (restore undoes it).")
        def delete_memories(
            memory_ids: Annotated[list[str], Field(min_length=1, max_length=MAX_IDS, description="the ids to delete")],
            context: Context, user_id: UserId = None,
        ) -> dict[str, Any]:
            user = self._user(user_id, context)
            for memory_id in memory_ids:  # every id checked before any is deleted
                self._own(memory_id, user)
            for memory_id in dict.fromkeys(memory_ids):
                _refused(memory.delete, memory_id)
            return {"message": f"Deleted {len(set(memory_ids))} memories", "deleted": list(dict.fromkeys(memory_ids))}

        @self.tool(description="Delete all of the user's memories.")
        def delete_all_memories(context: Context, user_id: UserId = None) -> dict[str, Any]:
            return _refused(memory.delete_all, user_id=self._user(user_id, context))

        @self.tool(description="Answer a question from the user's memories, in a few words, with the memories used.")
        def answer(
            question: Annotated[str, Field(description="the question", min_length=1)],
            context: Context, user_id: UserId = None,
        ) -> dict[str, Any]:
            return _refused(memory.answer, question, user_id=self._user(user_id, context))

        @self.tool(description="Every write to one of the user's memories, oldest first: ADD, UPDATE, DELETE, RESTORE.")
        def history(
            memory_id: Annotated[str, Field(min_length=1, max_length=256)], context: Context, user_id: UserId = None,
        ) -> dict[str, Any]:
            self._own(memory_id, self._user(user_id, context), live=False)
            return {"history": _refused(memory.history, memory_id)}

        @self.tool(description="Bring back one of the user's deleted memories.")
        def restore(
            memory_id: Annotated[str, Field(min_length=1, max_length=256)], context: Context, user_id: UserId = None,
        ) -> dict[str, Any]:
            self._own(memory_id, self._user(user_id, context), live=False)
            return _refused(memory.restore, memory_id)


def mount_mcp(app: FastAPI, server: MemoryMCP, api_key: str | None = None) -> None:
    """Serve `server` at `app`'s `/mcp` (stateless streamable HTTP, JSON replies), behind `api_key`;
    its session manager runs for as long as `app` does. Host checks are left to the deployment (the
    REST routes beside it have none): DNS-rebinding protection would refuse a proxy's Host header."""
    sdk_app = server.streamable_http_app(
        streamable_http_path=MCP_PATH, json_response=True, stateless_http=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    # The SDK's own route (an ASGI endpoint at exactly /mcp, no redirect to /mcp/), moved onto `app`.
    (route,) = [route for route in sdk_app.routes if getattr(route, "path", None) == MCP_PATH]
    endpoint = route.endpoint
    app.add_route(MCP_PATH, ApiKeyGate(endpoint, api_key) if api_key else endpoint, methods=["GET", "POST", "DELETE"])
    enclosing = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(running: FastAPI) -> AsyncIterator[Any]:
        async with server.session_manager.run(), enclosing(running) as state:
            yield state

    app.router.lifespan_context = lifespan


def mcp_http_app(server: MemoryMCP, api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """`memr1 mcp --transport http`: the MCP endpoint alone, with the REST service's key and body limit."""
    app = FastAPI(title="memr1 MCP", version="1")
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    mount_mcp(app, server, api_key)
    return app
