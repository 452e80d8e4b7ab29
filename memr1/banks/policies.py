"""Who decides the memory operations while a bank is built.

A `MemoryPolicy` turns (fact, its most similar memories) into one `MemoryOp`. The no-model baseline
ADDs every fact; the model-backed policy asks the Memory Manager (the prompted base model, or a trained
checkpoint: the same code with other weights).
"""

from __future__ import annotations

from typing import Protocol, Sequence

from memr1.agents.manager import ManagerAgent
from memr1.llm.engines import GenerationEngine, SamplingConfig
from memr1.memory import MemoryView
from memr1.types import Fact, MemoryEntry, MemoryOp, OpKind


class MemoryPolicy(Protocol):
    #: How many similar memories the policy wants to see (0: it needs none, skip the search).
    num_candidates: int

    def decide(
        self, conversation_ids: Sequence[str], facts: Sequence[Fact], candidates: Sequence[Sequence[MemoryEntry]], banks: Sequence[MemoryView]
    ) -> list[MemoryOp]:
        """One operation per fact, each given the conversation it is from, its own candidate memories and
        the bank it is written to, as it stands (a policy that prices its options forks it; the others
        never read it)."""


def add_op(fact: Fact) -> MemoryOp:
    return MemoryOp(
        OpKind.ADD, text=fact.text, speaker=fact.speaker, timestamp=fact.date_time, provenance=fact.dia_ids
    )


class AddAllPolicy:
    """Every fact is ADDed: the Mem0-without-manager baseline, and the default teacher for RL states."""

    num_candidates = 0

    def decide(
        self, conversation_ids: Sequence[str], facts: Sequence[Fact], candidates: Sequence[Sequence[MemoryEntry]], banks: Sequence[MemoryView]
    ) -> list[MemoryOp]:
        return [add_op(fact) for fact in facts]


class ModelPolicy:
    """The Memory Manager agent on a generation engine (greedy at evaluation time)."""

    def __init__(
        self,
        engine: GenerationEngine,
        agent: ManagerAgent | None = None,
        sampling: SamplingConfig | None = None,
        num_candidates: int = 5,
    ) -> None:
        self.engine = engine
        self.agent = agent or ManagerAgent()
        self.sampling = sampling or SamplingConfig(max_new_tokens=128, temperature=0.0)
        self.num_candidates = num_candidates

    def decide(
        self, conversation_ids: Sequence[str], facts: Sequence[Fact], candidates: Sequence[Sequence[MemoryEntry]], banks: Sequence[MemoryView]
    ) -> list[MemoryOp]:
        prompts = [self.agent.build_messages(fact, cands) for fact, cands in zip(facts, candidates)]
        outputs = self.engine.generate(prompts, self.sampling)
        return [
            self.agent.parse(samples[0].text, fact, cands)
            for samples, fact, cands in zip(outputs, facts, candidates)
        ]
