"""memr1: Memory-R1 in PyTorch Lightning.

LLM agents that learn, by outcome-driven RL, to manage an external memory (the Memory Manager) and to
use it (the Answer Agent).
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # `memr1.Memory` / `memr1.AsyncMemory` without importing the service (and its models) for every
    # `import memr1`.
    if name == "Memory":
        from memr1.service.memory import Memory

        return Memory
    if name == "AsyncMemory":
        from memr1.service.async_memory import AsyncMemory

        return AsyncMemory
    raise AttributeError(f"module 'memr1' has no attribute {name!r}")
