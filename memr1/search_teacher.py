"""The environment as the Memory Manager's teacher: every operation the Manager may choose in a state,
scored by the reward RL uses, and the best kept under a stated tie rule.

No model stronger than the 135M one is available offline, and the rule teacher (ADD unless a near
duplicate) never UPDATEs or DELETEs, so SFT on it never shows RL those operations. A Manager's action
space is small, though, and `ManagerEnv.score` prices each action exactly (the same frozen Answer Agent,
questions and reward as RL). `SearchManagerTeacher` enumerates the options of a state (`options`):

- NONE (store nothing); ADD the fact;
- for each candidate memory: UPDATE it to a merge of its text and the fact (Mem0's UPDATE keeps what
  the old memory said and adds the new: here the two texts joined, as no model writes the merge), UPDATE
  it to the fact's text (a value replaced), and DELETE it;

scores them all in one `score` call, and takes the best under the tie rule: ADD stays unless an option
beats it by more than `margin`, and an option that stores none of the fact (NONE, DELETE) must beat it
by `drop_factor` times that. `margin` is the larger of `min_margin` and the answerer's own variation on
the state: how far ADD's score moves when the same fact is ADDed in a trivially different form (its
final full stop toggled, its speaker's name written out), which changes no information. A 135M answerer
reacts to any change of its context; a teacher that chased that noise would teach noise.

Each target's row in the trajectory cache carries the scores it was chosen from (`details`), so a
report counts how often each operation won and by how much (`scripts/search_teacher_report.py`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from memr1.agents.manager import temp_id_map
from memr1.agents.text import one_line
from memr1.banks.policies import add_op
from memr1.envs.manager import ManagerEnv, ManagerState
from memr1.memory import MemoryView
from memr1.teachers import Taught
from memr1.types import Conversation, Fact, MemoryEntry, MemoryOp, Question

OPERATIONS = ("NONE", "ADD", "MERGE", "REPLACE", "DELETE")  # MERGE / REPLACE: the two UPDATE forms


@dataclass(frozen=True)
class Option:
    """One thing the Manager may do in a state, written as its JSON reply.

    operation: one of OPERATIONS; target: the candidate's temporary id ("0".."k-1") or None;
    keeps_fact: whether the fact's information is stored (ADD, MERGE, REPLACE)."""

    operation: str
    target: str | None
    reply: str
    keeps_fact: bool


@dataclass(frozen=True)
class SearchChoice:
    """The option taught for a state, with what it was chosen from."""

    option: Option
    scores: dict[str, float]  # option label -> score
    add_score: float
    noise: float
    margin: float

    def details(self) -> dict[str, object]:
        return {"operation": self.option.operation, "target": self.option.target, "add": self.add_score,
                "noise": self.noise, "margin": self.margin, "scores": self.scores}


def label(option: Option) -> str:
    return option.operation if option.target is None else f"{option.operation}:{option.target}"


def _reply(entry: dict[str, str]) -> str:
    return json.dumps({"memory": [entry]})


def options(state: ManagerState) -> list[Option]:
    """NONE, ADD, and MERGE / REPLACE / DELETE of each candidate, as the Manager's replies."""
    fact = one_line(state.fact.text)
    ids = list(temp_id_map(state.candidates))
    found = [
        Option("NONE", None, _reply({"id": ids[0], "text": one_line(state.candidates[0].text), "event": "NONE"}) if ids
               else _reply({"event": "NONE"}), keeps_fact=False),
        Option("ADD", None, _reply({"id": str(len(ids)), "text": fact, "event": "ADD"}), keeps_fact=True),
    ]
    for temp_id, memory in zip(ids, state.candidates):
        old = one_line(memory.text)
        merged = f"{old.rstrip('.')}; {fact}"
        found += [
            Option("MERGE", temp_id, _reply({"id": temp_id, "text": merged, "event": "UPDATE", "old_memory": old}), keeps_fact=True),
            Option("REPLACE", temp_id, _reply({"id": temp_id, "text": fact, "event": "UPDATE", "old_memory": old}), keeps_fact=True),
            Option("DELETE", temp_id, _reply({"id": temp_id, "text": old, "event": "DELETE"}), keeps_fact=False),
        ]
    return found


def margins_over_add(found: Sequence[Option], margin: float, drop_factor: float) -> list[float]:
    """What each option must beat ADD's score by to displace it (`SearchManagerTeacher.choose`'s rule):
    nothing for ADD, `margin` for an option that keeps the fact, `drop_factor` x `margin` for one that
    stores none of it (NONE, DELETE)."""
    return [0.0 if option.operation == "ADD" else margin if option.keeps_fact else drop_factor * margin for option in found]


def add_variants(state: ManagerState) -> list[str]:
    """ADD replies of the same fact in trivially different forms (no information changed), the probes
    of the answerer's own variation; scored where an ADD stores its reply's text (`add_text="model"`)."""
    fact = one_line(state.fact.text)
    toggled = fact[:-1] if fact.endswith(".") else f"{fact}."
    named = fact if fact.startswith(state.fact.speaker) else f"{state.fact.speaker}: {fact}"
    k = str(len(state.candidates))
    return [_reply({"id": k, "text": text, "event": "ADD"}) for text in dict.fromkeys((toggled, named)) if text != fact]


class SearchManagerTeacher:
    """The Manager's teacher that searches the environment (see the module docstring).

    env: the Manager's environment, outcome credit (its reward is what RL maximises); its Manager agent's
        `add_text` must be "fact" (ADD stores the fact as given, as the trained Manager's ADDs will).
    variants_env: the same environment with `add_text="model"`, for the ADD variants' own texts.
    answerer: names the frozen Answer Agent, part of the teacher's name (the cache keeps targets per name).
    questions: which questions judge its states (`memr1.states.datasets.STATE_QUESTIONS`): the scores
        depend on them, so the name does too (the cache is keyed by the Manager's prompt, which does not
        show them); "fact", the first setting, leaves the name as it was.
    """

    def __init__(
        self, env: ManagerEnv, variants_env: ManagerEnv, answerer: str, min_margin: float = 0.1, drop_factor: float = 2.0,
        questions: str = "fact",
    ) -> None:
        if env.credit != "outcome":
            raise ValueError(f"teacher=search: the environment's credit must be 'outcome' (scores, not differences), got {env.credit!r}")
        if env.manager_agent.add_text != "fact" or variants_env.manager_agent.add_text != "model":
            raise ValueError("teacher=search: env stores an ADD's fact as given (add_text=fact), variants_env the reply's text (add_text=model)")
        if min_margin < 0 or drop_factor < 1:
            raise ValueError(f"teacher=search: min_margin must be >= 0 and drop_factor >= 1, got {min_margin}, {drop_factor}")
        self.env, self.variants_env = env, variants_env
        self.min_margin, self.drop_factor = min_margin, drop_factor
        settings = json.dumps([answerer, env.reward, env.k_per_speaker, min_margin, drop_factor, *([questions] if questions != "fact" else [])])
        self.name = f"search-v1-{hashlib.sha256(settings.encode()).hexdigest()[:8]}"

    def choose(self, state: ManagerState) -> SearchChoice:
        found = options(state)
        scores = [reward.score for reward in self.env.score([state] * len(found), [option.reply for option in found])]
        variants = add_variants(state)
        variant_scores = [reward.score for reward in self.variants_env.score([state] * len(variants), variants)]
        add_score = scores[1]
        noise = max((abs(score - add_score) for score in variant_scores), default=0.0)
        margin = max(self.min_margin, noise)
        chosen, best = found[1], add_score
        for option, score, needed in zip(found, scores, margins_over_add(found, margin, self.drop_factor)):
            if score > add_score + needed and score > best:
                chosen, best = option, score
        return SearchChoice(chosen, {label(o): s for o, s in zip(found, scores)}, add_score, noise, margin)

    def target(self, state: ManagerState, messages: Sequence[dict[str, str]]) -> Taught:
        choice = self.choose(state)
        return Taught(choice.option.reply, choice.details())


class OraclePolicy:
    """Banks decided by the search with the questions they are scored on: an upper bound, never a method.

    Each fact whose turn some question of its conversation cites is decided by `teacher.choose` on the
    bank as it stands (every option forked and answered by the frozen Answer Agent); a fact no question
    cites is ADDed (every option would score nothing). `conversations` are the ones whose banks are
    built, found by the id each fact is decided with (the same fact can be said in two conversations).
    """

    def __init__(self, teacher: SearchManagerTeacher, conversations: Sequence[Conversation], num_candidates: int = 5) -> None:
        self.teacher = teacher
        self.num_candidates = num_candidates
        self._conversations = {conversation.sample_id: conversation for conversation in conversations}
        self._facts = {conversation.sample_id: frozenset(conversation.facts) for conversation in conversations}
        self._asking: dict[tuple[str, str], list[Question]] = {}  # (conversation, turn) -> questions citing it
        for conversation in conversations:
            for question in conversation.questions:
                for dia_id in dict.fromkeys(question.evidence):
                    self._asking.setdefault((conversation.sample_id, dia_id), []).append(question)

    def decide(
        self, conversation_ids: Sequence[str], facts: Sequence[Fact], candidates: Sequence[Sequence[MemoryEntry]], banks: Sequence[MemoryView]
    ) -> list[MemoryOp]:
        ops = []
        for conversation_id, fact, found, bank in zip(conversation_ids, facts, candidates, banks):
            conversation = self._conversations.get(conversation_id)
            if conversation is None:
                raise ValueError(f"OraclePolicy: the conversation {conversation_id!r} is not one of those it was given")
            if fact not in self._facts[conversation_id]:
                raise ValueError(f"OraclePolicy: the fact {fact.text!r} is not a fact of the conversation {conversation_id!r}")
            questions = list(dict.fromkeys(q for dia_id in fact.dia_ids for q in self._asking.get((conversation.sample_id, dia_id), ())))
            if not questions:
                ops.append(add_op(fact))
                continue
            state = ManagerState(fact, conversation.sample_id, conversation.speakers, bank, list(found), questions)
            ops.append(self.teacher.env.manager_agent.parse(self.teacher.choose(state).option.reply, fact, found))
        return ops
