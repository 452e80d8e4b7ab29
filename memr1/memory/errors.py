"""The errors of memory banks. An error raised by a write means the write changed nothing."""

from __future__ import annotations


class MemoryBankError(Exception):
    """Base class of every memory-bank error."""


class InvalidOpError(MemoryBankError, ValueError):
    """A memory operation cannot be applied (missing text or speaker, text too long, ...)."""


class UnknownMemoryError(InvalidOpError, LookupError):
    """An operation names a memory id that the bank does not hold, or holds only as deleted."""

    def __init__(self, bank: str, memory_id: str | None, problem: str = "no such memory") -> None:
        self.bank = bank
        self.memory_id = memory_id
        super().__init__(f"bank {bank!r}: memory id {memory_id!r}: {problem}")


class BankLockedError(MemoryBankError, RuntimeError):
    """A Milvus Lite `.db` is held by another process (Milvus Lite allows one process per file)."""

    def __init__(self, path: str, hint: str = "give this process a different .db path") -> None:
        self.path = path
        super().__init__(
            f"{path} is locked: another process owns this Milvus Lite database (one process per .db file). "
            f"Connect to a Milvus server by URI (http://host:port) shared by both processes, or {hint}."
        )


class StaleForkError(MemoryBankError, RuntimeError):
    """A fork was used after its parent bank (or parent fork) changed or closed."""
