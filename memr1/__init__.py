"""memr1: Memory-R1 in PyTorch Lightning.

LLM agents that learn, by outcome-driven RL, to manage an external memory (the Memory Manager) and to
use it (the Answer Agent).
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # `memr1.Memory` without importing the service (and its models) for every `import memr1`.
    if name == "Memory":
        from memr1.service.memory import Memory

        return Memory
    raise AttributeError(f"module 'memr1' has no attribute {name!r}")
