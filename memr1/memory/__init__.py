"""Memory: one store of scoped records (Milvus, Qdrant, in memory), banks over it searched through an
in-process index, copy-on-write forks."""

from memr1.memory.bank import BankFork, MemoryBank, MemoryView
from memr1.memory.errors import (
    BankLockedError,
    InvalidOpError,
    MemoryBankError,
    StaleForkError,
    UnknownMemoryError,
)
from memr1.memory.records import Revision

__all__ = [
    "BankFork",
    "BankLockedError",
    "InvalidOpError",
    "MemoryBank",
    "MemoryBankError",
    "MemoryView",
    "Revision",
    "StaleForkError",
    "UnknownMemoryError",
]
