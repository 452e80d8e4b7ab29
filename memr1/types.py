"""The typed vocabulary of memr1: dialogue, facts, questions, memories and memory operations.

Every component speaks in these dataclasses, so a LoCoMo turn, a LongMemEval session and an MSC
dialogue all reach the pipeline in the same shape. They are frozen where identity matters (a fact or
an operation is a value) and carry only plain Python types, so they pickle across DataLoader workers
and serialise to JSON for predictions files.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from collections.abc import Iterator, Mapping, Sequence


@dataclass(frozen=True)
class Turn:
    """One utterance of a conversation.

    `dia_id` is LoCoMo's "D<session>:<index>" (other datasets synthesise the same form), `date_time`
    is the session's date-time string as the dataset gives it, used as the memory timestamp.
    """

    dia_id: str
    speaker: str
    text: str
    session: int
    date_time: str
    image_caption: str | None = None


@dataclass(frozen=True)
class Session:
    index: int
    date_time: str
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Fact:
    """A fact extracted from the dialogue, attributed to a speaker, with the turns it came from."""

    text: str
    speaker: str
    dia_ids: tuple[str, ...]
    session: int
    date_time: str


@dataclass(frozen=True)
class Question:
    """A question about a conversation. `answer` is always a string (LoCoMo has int answers).

    `date_time` is when the question is asked, where the dataset says so (LongMemEval's
    `question_date`, which its temporal questions count from); empty when unknown.
    """

    qid: str
    conversation_id: str
    question: str
    answer: str
    evidence: tuple[str, ...]
    category: int
    date_time: str = ""


@dataclass(frozen=True)
class Conversation:
    """A long two-speaker conversation with its facts and questions.

    `facts` are in dialogue order; `questions` keep the dataset's order.
    """

    sample_id: str
    speaker_a: str
    speaker_b: str
    sessions: tuple[Session, ...]
    facts: tuple[Fact, ...] = ()
    questions: tuple[Question, ...] = ()

    @property
    def speakers(self) -> tuple[str, str]:
        return (self.speaker_a, self.speaker_b)

    def turns(self) -> Iterator[Turn]:
        for session in self.sessions:
            yield from session.turns

    def turn_positions(self) -> dict[str, int]:
        """dia_id -> position of the turn in the whole conversation (0-based, across sessions)."""
        return {turn.dia_id: position for position, turn in enumerate(self.turns())}

    def facts_by_turn(self) -> dict[str, list[Fact]]:
        """Facts keyed by the turn they become knowable at (`knowable_at`); facts citing no turn are left out."""
        positions = self.turn_positions()
        turns = {position: dia_id for dia_id, position in positions.items()}
        grouped: dict[str, list[Fact]] = {}
        for fact in self.facts:
            known = knowable_at(fact.dia_ids, positions)
            if known is not None:
                grouped.setdefault(turns[known], []).append(fact)
        return grouped

    def facts_in_dialogue_order(self) -> list[Fact]:
        """The facts ordered by the turn each becomes knowable at; facts citing no turn come last."""
        positions = self.turn_positions()
        end = len(positions)

        def position(fact: Fact) -> int:
            known = knowable_at(fact.dia_ids, positions)
            return end if known is None else known

        return sorted(self.facts, key=position)


def knowable_at(dia_ids: Sequence[str], positions: Mapping[str, int]) -> int | None:
    """When a fact or memory becomes knowable: the position of the latest turn it cites, or None when it
    cites no turn of `positions` (dia_id -> position, `Conversation.turn_positions`). The one definition
    of fact order: banks are built, and Manager states are cut, in this order."""
    return max((positions[dia_id] for dia_id in dia_ids if dia_id in positions), default=None)


class OpKind(str, enum.Enum):
    """The Memory Manager's action space."""

    ADD = "ADD"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    NOOP = "NOOP"


# What the Manager's ADD stores: its fact as given, or the model's "text" (Mem0's); memr1.agents.manager says why.
ADD_TEXTS = ("fact", "model")


@dataclass(frozen=True)
class MemoryOp:
    """One memory operation.

    `target_id` names the entry that UPDATE / DELETE act on (None for ADD / NOOP). `timestamp` and
    `provenance` (source dia_ids) describe where the memory came from; an UPDATE adds its provenance to
    the entry's. `format_error` records why a model's output was turned into this op (a NOOP) when it
    could not be parsed; it is None for well-formed ops.
    """

    kind: OpKind
    text: str = ""
    target_id: str | None = None
    speaker: str | None = None
    timestamp: str = ""
    provenance: tuple[str, ...] = ()
    format_error: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, OpKind):
            object.__setattr__(self, "kind", OpKind(self.kind))


@dataclass(frozen=True)
class MemoryEntry:
    """A memory as stored in a bank. `score` is set on search results only (cosine similarity)."""

    id: str
    text: str
    speaker: str
    timestamp: str = ""
    provenance: tuple[str, ...] = ()
    created_step: int = 0
    updated_step: int = 0
    score: float | None = field(default=None, compare=False)
