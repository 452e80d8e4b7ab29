"""The RL states of both agents, built lazily and cached.

Manager states (`ManagerStates`): one per (evidence turn of a training question, fact of that turn),
or with `questions="fact_and_candidates"` one per fact whose turn or whose candidate memories a
question cites. A fact belongs to the turn it becomes knowable at (`memr1.types.knowable_at`, the
order banks are built in). The state's bank is the paper's temporal bank (`memr1.states.windows`):
the memories of the `window` turns strictly before the fact's turn, cut out of a *teacher* bank built
once per conversation over all its facts. The teacher ADDs every fact, so its memories are the
dataset's facts with their turns as provenance.

Answer states (`AnswerStates`): one per question, with the top memories of each speaker retrieved
from the conversation's bank.

Both datasets hold only their (small) index eagerly; a state is built in `__getitem__` and kept in a
small LRU cache. States hold views of Milvus-backed banks, which live in this process: load them with
`num_workers=0`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from torch.utils.data import Dataset

from memr1.envs.answer import AnswerState
from memr1.envs.manager import ManagerState
from memr1.memory import MemoryView
from memr1.memory.retrieval import retrieve_memories
from memr1.states.windows import window_bank
from memr1.types import Conversation, MemoryEntry, Question

DEFAULT_CACHE_SIZE = 128
# Which questions judge a Manager state (`model.questions`):
# - "fact": those citing the fact's turn (the paper's: the reward asks what the fact is evidence for);
# - "fact_and_candidates": those too that cite a candidate memory's turns. A candidate is what an UPDATE
#   or DELETE can change, so an operation that overwrites a memory another question needs pays for it
#   in its own reward; under "fact" it costs nothing, and a fact no question cites has no state at all.
STATE_QUESTIONS = ("fact", "fact_and_candidates")


class StateKey(NamedTuple):
    """Which manager state: the fact `fact_index` of turn `dia_id` (in `facts_by_turn` order)."""

    conversation_id: str
    dia_id: str
    fact_index: int


def by_sample_id(conversations: Sequence[Conversation]) -> dict[str, Conversation]:
    result: dict[str, Conversation] = {}
    for position, conversation in enumerate(conversations):
        if conversation.sample_id in result:
            raise ValueError(f"conversations[{position}]: sample_id {conversation.sample_id!r} appears twice")
        result[conversation.sample_id] = conversation
    return result


class ManagerStates(Dataset[ManagerState]):
    """One `ManagerState` per (evidence turn of a question of `conversations`, fact of that turn); with
    `questions="fact_and_candidates"`, per fact (in dialogue order) that some question judges.

    bank_for(conversation_id): the conversation's opened teacher bank, built over all its facts
        (`build_teacher_banks`); asked once per conversation, when its first state is built.
    window: turns before the fact's turn whose facts the state's bank holds (the paper: 24 or 50).
    num_candidates: memories shown to the Manager (Mem0: 5).
    questions: which questions judge a state (`STATE_QUESTIONS`). "fact_and_candidates" finds every
        fact's candidates when the dataset is made (one search per fact; the teacher banks are fetched
        then), since whether a fact has a state depends on them.

    Evidence turns with no fact are skipped and counted in `skipped_turns`; questions with no evidence
    give no state. `keys` lists the states: conversations in the given order, turns in dialogue order.
    """

    def __init__(
        self,
        conversations: Sequence[Conversation],
        bank_for: Callable[[str], MemoryView],
        window: int = 50,
        num_candidates: int = 5,
        cache_size: int = DEFAULT_CACHE_SIZE,
        questions: str = "fact",
    ) -> None:
        if questions not in STATE_QUESTIONS:
            raise ValueError(f"ManagerStates.questions: {questions!r} is not one of {STATE_QUESTIONS}")
        if window < 1:
            raise ValueError(f"ManagerStates.window: must be >= 1, got {window}")
        if num_candidates < 0:
            raise ValueError(f"ManagerStates.num_candidates: must be >= 0, got {num_candidates}")
        self.window = window
        self.num_candidates = num_candidates
        self._bank_for = bank_for
        self._conversations = by_sample_id(conversations)
        self._positions = {cid: c.turn_positions() for cid, c in self._conversations.items()}
        self._facts = {cid: c.facts_by_turn() for cid, c in self._conversations.items()}
        self._questions: dict[StateKey, list[Question]] = {}
        self._teachers: dict[str, MemoryView] = {}
        # fact_and_candidates: the searches that decided which facts have states, kept for their states
        self._candidates: dict[StateKey, list[MemoryEntry]] = {}
        self.skipped_turns = 0
        for cid, conversation in self._conversations.items():
            positions = self._positions[cid]
            asking: dict[str, list[Question]] = {}  # evidence turn -> the questions citing it
            for question in conversation.questions:
                for dia_id in dict.fromkeys(question.evidence):  # a turn cited twice asks once
                    if dia_id not in positions:
                        raise ValueError(
                            f"conversation {cid}: question {question.qid}: evidence {dia_id!r} "
                            "is no turn of the conversation"
                        )
                    asking.setdefault(dia_id, []).append(question)
            if questions == "fact":
                for dia_id in sorted(asking, key=positions.__getitem__):
                    facts = self._facts[cid].get(dia_id, [])
                    self.skipped_turns += not facts
                    for index in range(len(facts)):
                        self._questions[StateKey(cid, dia_id, index)] = asking[dia_id]
            else:
                self.skipped_turns += sum(dia_id not in self._facts[cid] for dia_id in asking)
                for dia_id in sorted(self._facts[cid], key=positions.__getitem__):
                    for index in range(len(self._facts[cid][dia_id])):
                        key = StateKey(cid, dia_id, index)
                        _, candidates = self._bank_and_candidates(key)
                        cited = [dia_id, *(turn for memory in candidates for turn in memory.provenance)]
                        judging = list(dict.fromkeys(q for turn in cited for q in asking.get(turn, ())))
                        if judging:
                            self._questions[key] = judging
                            self._candidates[key] = candidates
        self.keys: list[StateKey] = list(self._questions)  # conversations in the given order, turns in dialogue order
        self._state = functools.lru_cache(maxsize=cache_size)(self._build)

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int) -> ManagerState:
        if not 0 <= index < len(self.keys):
            raise IndexError(f"ManagerStates: index {index} out of range 0..{len(self.keys) - 1}")
        return self._state(index)

    def _build(self, index: int) -> ManagerState:
        key = self.keys[index]
        bank, candidates = self._bank_and_candidates(key)
        return ManagerState(
            fact=self._facts[key.conversation_id][key.dia_id][key.fact_index],
            conversation_id=key.conversation_id,
            speakers=self._conversations[key.conversation_id].speakers,
            bank=bank,
            candidates=candidates,
            questions=list(self._questions[key]),
        )

    def _bank_and_candidates(self, key: StateKey) -> tuple[MemoryView, list[MemoryEntry]]:
        """The state's window bank and the fact's speaker's memories in it most similar to the fact."""
        fact = self._facts[key.conversation_id][key.dia_id][key.fact_index]
        positions = self._positions[key.conversation_id]
        bank = window_bank(self._teacher(key.conversation_id), positions, positions[key.dia_id], self.window)
        candidates = self._candidates.get(key)
        if candidates is None:
            candidates = bank.search(fact.text, speaker=fact.speaker, k=self.num_candidates) if self.num_candidates else []
        return bank, candidates

    def _teacher(self, conversation_id: str) -> MemoryView:
        teacher = self._teachers.get(conversation_id)
        if teacher is None:
            teacher = self._bank_for(conversation_id)
            if len(teacher) == 0:
                raise ValueError(
                    f"ManagerStates: the teacher bank of {conversation_id} ({teacher.name!r}) is empty; "
                    "build it first (build_teacher_banks)"
                )
            self._teachers[conversation_id] = teacher
        return teacher


class AnswerStates(Dataset[AnswerState]):
    """One `AnswerState` per question of `conversations` (dataset order), with the `k_per_speaker`
    memories of each speaker most similar to the question, retrieved from `banks[conversation_id]`."""

    def __init__(
        self,
        conversations: Sequence[Conversation],
        banks: Mapping[str, MemoryView],
        k_per_speaker: int = 30,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        if k_per_speaker < 1:
            raise ValueError(f"AnswerStates.k_per_speaker: must be >= 1, got {k_per_speaker}")
        by_id = by_sample_id(conversations)
        missing = sorted(set(by_id) - set(banks))
        if missing:
            raise ValueError(f"AnswerStates: banks: no bank for conversations {missing}")
        self.k_per_speaker = k_per_speaker
        self.questions = [question for conversation in by_id.values() for question in conversation.questions]
        self._speakers = {cid: conversation.speakers for cid, conversation in by_id.items()}
        self._banks = banks
        self._state = functools.lru_cache(maxsize=cache_size)(self._build)

    def __len__(self) -> int:
        return len(self.questions)

    def __getitem__(self, index: int) -> AnswerState:
        if not 0 <= index < len(self.questions):
            raise IndexError(f"AnswerStates: index {index} out of range 0..{len(self.questions) - 1}")
        return self._state(index)

    def _build(self, index: int) -> AnswerState:
        question = self.questions[index]
        cid = question.conversation_id
        memories = retrieve_memories(self._banks[cid], question.question, self._speakers[cid], self.k_per_speaker)
        return AnswerState(question, memories)


def collate_states(batch: Sequence[Any]) -> list[Any]:
    """States are dataclasses, not tensors: a batch is a plain list of them."""
    return list(batch)
