"""The trained agents as a memory layer: `Memory` (Mem0's calls over memr1 banks) and the HTTP
server of `memr1 serve` (`memr1.service.server.create_app`)."""

from memr1.service.memory import Memory, MemoryNotFound
from memr1.service.models import LocalModel, RemoteModel, TextModel, text_model

__all__ = ["LocalModel", "Memory", "MemoryNotFound", "RemoteModel", "TextModel", "text_model"]
