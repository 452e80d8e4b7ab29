"""`memr1.AsyncMemory`: Mem0's `AsyncMemory` call shapes for asyncio applications.

    memory = AsyncMemory("memories/", manager=..., answerer=...)
    await memory.add("I adopted a dog named Buddy", user_id="andrew")
    hits = await memory.search("pets", user_id="andrew")

Every call runs `memr1.Memory`'s in a worker thread, so the event loop goes on serving while a model
decides or Milvus answers; concurrent callers share the one `Memory` (one model, one store), whose
per-scope locks keep each scope's retrieve -> decide -> write whole.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from memr1.service.memory import Memory

T = TypeVar("T")


class AsyncMemory:
    """Mem0's `AsyncMemory` over a `Memory`: pass the `Memory`'s arguments, or `memory=` one to share."""

    def __init__(self, path: str | Path | None = None, *, memory: Memory | None = None, **options: Any) -> None:
        if (memory is None) == (path is None):
            raise ValueError("AsyncMemory: give a path (and Memory's options) or memory=, not both")
        if memory is not None and options:
            raise ValueError(f"AsyncMemory: options {sorted(options)} are Memory's; with memory= they are already set")
        self.memory = memory if memory is not None else Memory(path, **options)

    async def _run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(functools.partial(call, *args, **kwargs))

    async def add(self, messages: str | Sequence[Mapping[str, str]], **kwargs: Any) -> dict[str, Any]:
        """`Memory.add`: what the Manager decided for each fact."""
        return await self._run(self.memory.add, messages, **kwargs)

    async def search(self, query: str, **kwargs: Any) -> dict[str, Any]:
        return await self._run(self.memory.search, query, **kwargs)

    async def get_all(self, **kwargs: Any) -> dict[str, Any]:
        return await self._run(self.memory.get_all, **kwargs)

    async def get(self, memory_id: str) -> dict[str, Any] | None:
        return await self._run(self.memory.get, memory_id)

    async def update(self, memory_id: str, data: str | None = None, **kwargs: Any) -> dict[str, str]:
        return await self._run(self.memory.update, memory_id, data, **kwargs)

    async def delete(self, memory_id: str) -> dict[str, str]:
        return await self._run(self.memory.delete, memory_id)

    async def delete_all(self, **kwargs: Any) -> dict[str, str]:
        return await self._run(self.memory.delete_all, **kwargs)

    async def history(self, memory_id: str) -> list[dict[str, Any]]:
        return await self._run(self.memory.history, memory_id)

    async def restore(self, memory_id: str) -> dict[str, Any]:
        return await self._run(self.memory.restore, memory_id)

    async def answer(self, question: str, **kwargs: Any) -> dict[str, Any]:
        return await self._run(self.memory.answer, question, **kwargs)

    async def reset(self) -> None:
        await self._run(self.memory.reset)

    def close(self) -> None:
        self.memory.close()

    async def __aenter__(self) -> AsyncMemory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
