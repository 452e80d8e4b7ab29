"""Teacher trajectories for Memory-SFT: the response a good agent would give in a state, cached as JSONL.

Two offline teachers are built from the dataset itself, so that SFT runs on a machine with no strong
model (they are the dataset's knowledge written in the agent's format, not a model's behaviour):

- `EvidenceAnswerTeacher` (the Answer Agent): the retrieved memories whose provenance cites one of the
  question's evidence turns, copied in the prompt's own `[timestamp] text` form under
  `**Relevant memories:**`, then `**Answer:** <gold answer>`. When retrieval missed every evidence turn,
  the one memory that shares most words with the gold answer (ties: the better-ranked), so that every
  target lists a memory: an empty list in 49 of 120 targets taught the agent to skip the distillation
  (98% of `make train`'s SFT replies then listed none). Without distillation only the answer.
- `RuleManagerTeacher` (the Memory Manager): NONE when a candidate memory of the fact's speaker is a
  near-duplicate of the fact (cosine >= `duplicate_score` under the bank's embedder), else ADD the fact,
  in the Manager's JSON schema.

`SearchManagerTeacher` (memr1/search_teacher.py) makes the Manager's environment its teacher: every
operation scored by RL's own reward. `EndpointTeacher` asks an OpenAI-compatible endpoint instead (the paper used GPT-class teachers), with
the agent's own prompt. `TeacherTrajectories` caches every target by state in a JSONL file, one row per
state with its provenance (teacher, ids, prompt digest), appended and fsynced: a resumed or repeated run
reads the targets back instead of asking again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from memr1.agents.answer import memory_line
from memr1.agents.manager import temp_id_map
from memr1.agents.text import one_line
from memr1.envs.answer import AnswerState
from memr1.envs.manager import ManagerState
from memr1.llm.openai_client import OpenAICompatibleClient
from memr1.metrics.lexical import f1_tokens
from memr1.types import MemoryEntry

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]

# all-MiniLM-L6-v2 cosine above which two LoCoMo facts say the same thing (paraphrases score ~0.85-0.95,
# facts about the same topic ~0.5-0.7).
DUPLICATE_SCORE = 0.85


@dataclass(frozen=True)
class Taught:
    """A target with what it was chosen from, kept beside it in the cache (a teacher that searched)."""

    text: str
    details: Mapping[str, Any]


class Teacher(Protocol):
    name: str

    def target(self, state: Any, messages: Messages) -> str | Taught:
        """The response to train on for `state`, whose prompt is `messages`."""
        ...


class EvidenceAnswerTeacher:
    """The Answer Agent's offline teacher (see the module docstring)."""

    # "-v2": the targets changed (the fallback memory); the cache reads back only its own teacher's rows.
    name = "evidence-v2"

    def __init__(self, distill: bool = True) -> None:
        self.distill = distill

    def target(self, state: AnswerState, messages: Messages) -> str:
        answer = f"**Answer:** {one_line(state.question.answer)}"
        if not self.distill:
            return answer
        evidence = set(state.question.evidence)
        retrieved = [memory for memories in state.memories.values() for memory in memories]
        selected = [memory for memory in retrieved if evidence.intersection(memory.provenance)]
        if not selected and retrieved:
            selected = [closest_to_answer(retrieved, str(state.question.answer))]
        lines = [memory_line(memory) for memory in selected]
        return "\n".join(["**Relevant memories:**", *dict.fromkeys(lines), answer])


def closest_to_answer(memories: Sequence[MemoryEntry], answer: str) -> MemoryEntry:
    """The memory whose `[timestamp] text` line shares most distinct words with `answer` (Mem0's F1
    tokens); ties go to the better retrieval score, then to the earlier memory."""
    wanted = set(f1_tokens(answer))

    def rank(indexed: tuple[int, MemoryEntry]) -> tuple[int, float, int]:
        position, memory = indexed
        shared = len(wanted.intersection(f1_tokens(memory_line(memory))))
        return shared, memory.score if memory.score is not None else float("-inf"), -position

    return max(enumerate(memories), key=rank)[1]


class RuleManagerTeacher:
    """The Memory Manager's offline teacher (see the module docstring)."""

    name = "rule"

    def __init__(self, duplicate_score: float = DUPLICATE_SCORE) -> None:
        if not 0.0 < duplicate_score <= 1.0:
            raise ValueError(f"teacher.duplicate_score: must be in (0, 1], got {duplicate_score}")
        self.duplicate_score = duplicate_score

    def target(self, state: ManagerState, messages: Messages) -> str:
        ids = list(temp_id_map(state.candidates))
        same_speaker = [
            (temp_id, memory)
            for temp_id, memory in zip(ids, state.candidates)
            if memory.speaker == state.fact.speaker and (memory.score or 0.0) >= self.duplicate_score
        ]
        if same_speaker:
            temp_id, memory = max(same_speaker, key=lambda pair: pair[1].score or 0.0)
            entry = {"id": temp_id, "text": one_line(memory.text), "event": "NONE"}
        else:
            # Mem0 gives an added memory the next free id.
            entry = {"id": str(len(ids)), "text": one_line(state.fact.text), "event": "ADD"}
        return json.dumps({"memory": [entry]})


class EndpointTeacher:
    """A strong model behind an OpenAI-compatible endpoint answers the agent's own prompt (greedy)."""

    def __init__(self, url: str, model: str, max_tokens: int = 512, api_key_env: str = "OPENAI_API_KEY") -> None:
        if not url or not model:
            raise ValueError("teacher=endpoint needs teacher.url and teacher.model")
        self.client = OpenAICompatibleClient(url, model, api_key_env=api_key_env)
        self.name = f"endpoint:{model}@{url}"
        self.max_tokens = max_tokens

    def target(self, state: Any, messages: Messages) -> str:
        return self.client.chat(messages, max_tokens=self.max_tokens, temperature=0.0)


def state_ids(state: AnswerState | ManagerState) -> dict[str, Any]:
    """What a trajectory row says its state was: the question, or the fact and its turns."""
    if isinstance(state, AnswerState):
        return {"conversation_id": state.question.conversation_id, "qid": state.question.qid}
    return {"conversation_id": state.conversation_id, "dia_ids": list(state.fact.dia_ids), "fact": state.fact.text}


def prompt_digest(messages: Messages) -> str:
    """A state's key: the digest of the prompt the target answers (retrieval settings included)."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:16]


class TeacherTrajectories:
    """Targets of `teacher` by prompt digest, read from and appended to the JSONL file at `path`."""

    def __init__(self, teacher: Teacher, path: str | Path) -> None:
        self.teacher = teacher
        self.path = Path(path)
        self._rows: dict[str, dict[str, Any]] = {}  # prompt digest -> its cache row
        if self.path.is_file():
            for number, line in enumerate(self.path.read_text().splitlines(), start=1):
                try:
                    row = json.loads(line)
                    if not isinstance(row["target"], str):
                        raise TypeError("target is not text")
                    if row["teacher"] == teacher.name:  # another (older) teacher's targets are asked anew
                        self._rows[row["key"]] = row
                except (json.JSONDecodeError, KeyError, TypeError):
                    # A row cut by a kill mid-write: the state is asked again and appended anew.
                    log.warning("%s:%d: unreadable trajectory row skipped", self.path, number)

    def __len__(self) -> int:
        return len(self._rows)

    def targets(self, states: Sequence[Any], prompts: Sequence[Messages]) -> list[str]:
        """The teacher's target for each state (`prompts[i]` is the prompt of `states[i]`)."""
        return [row["target"] for row in self._rows_of(states, prompts)]

    def details(self, states: Sequence[Any], prompts: Sequence[Messages]) -> list[dict[str, Any]]:
        """What each state's target was chosen from (a searching teacher's `Taught.details`; {} for a
        teacher that says nothing more), asking the teacher where the cache has no row."""
        return [row.get("details", {}) for row in self._rows_of(states, prompts)]

    def _rows_of(self, states: Sequence[Any], prompts: Sequence[Messages]) -> list[dict[str, Any]]:
        keys = [prompt_digest(messages) for messages in prompts]
        missing = [(key, state, messages) for key, state, messages in zip(keys, states, prompts) if key not in self._rows]
        if missing:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as out:
                for key, state, messages in missing:
                    if key in self._rows:  # the same prompt twice in one batch
                        continue
                    taught = self.teacher.target(state, messages)
                    row = {"key": key, "teacher": self.teacher.name, **state_ids(state), "target": taught if isinstance(taught, str) else taught.text}
                    if isinstance(taught, Taught):
                        row["details"] = dict(taught.details)
                    out.write(json.dumps(row) + "\n")
                    self._rows[key] = row
                out.flush()
                os.fsync(out.fileno())
        return [self._rows[key] for key in keys]
