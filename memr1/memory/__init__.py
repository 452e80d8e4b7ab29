"""Memory banks on Milvus: the store of record, an in-process index for search, copy-on-write forks."""

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
