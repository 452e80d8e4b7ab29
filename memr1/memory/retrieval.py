"""What an agent sees of a bank: the most similar memories of each speaker."""

from __future__ import annotations

from collections.abc import Sequence

from memr1.memory.bank import MemoryView
from memr1.types import MemoryEntry


def retrieve_memories(
    bank: MemoryView, question: str, speakers: Sequence[str], k_per_speaker: int
) -> dict[str, list[MemoryEntry]]:
    """The top `k_per_speaker` memories of each speaker's part of the bank, most similar first."""
    return {speaker: bank.search(question, speaker=speaker, k=k_per_speaker) for speaker in speakers}
