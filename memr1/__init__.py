"""memr1: Memory-R1 in PyTorch Lightning.

LLM agents that learn, by outcome-driven RL, to manage an external memory (the Memory Manager) and to
use it (the Answer Agent).
"""

__version__ = "0.1.0"
