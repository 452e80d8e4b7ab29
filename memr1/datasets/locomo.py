"""LoCoMo (`locomo10.json`) into `memr1.types.Conversation`s, with the paper's split by conversation.

The file is a list of samples, each with `sample_id`, `conversation` (`speaker_a`, `speaker_b`,
`session_N` turn lists and `session_N_date_time`), `observation` (GPT-written facts per session and
speaker: `[[fact, dia_id], ...]`) and `qa`. The real file has quirks in its dia_ids, measured on the
public copy: a fact's dia_id may be a list or a comma-separated string; evidence entries may hold
several ids (`'D8:6; D9:17'`, `'D9:1 D4:4 D4:6'`), leading zeros (`'D30:05'`), a stray colon
(`'D:11:26'`), no id at all (`'D'`) or an id of no turn (`'D10:19'` in conv-42). Recoverable ids are
normalised, the rest dropped, and every repair or drop is recorded as a `ParseIssue`.

Anything else that does not match the format raises `DatasetFormatError` naming the file and the JSON
path of the field, e.g. ``locomo10.json: $[3].conversation.session_2[5].text: missing``.
"""

from __future__ import annotations

import enum
import logging
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memr1.datasets.registry import DatasetSpec, JsonNode, json_type_name, read_json
from memr1.types import Conversation, Fact, Question, Session, Turn, knowable_at

logger = logging.getLogger(__name__)

LOCOMO_URL = "https://raw.githubusercontent.com/snap-research/locomo/main/data/locomo10.json"
LOCOMO_SHA256 = "79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4"

# Mem0's reading of locomo10.json's `category` numbers (mem0ai/mem0#2609, from the questions
# themselves), which Mem0's tables and Memory-R1's per-category rows use. LoCoMo's own evaluation code
# reads them otherwise: 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop (snap-research/locomo#29).
# Only the names differ; every score is per number.
CATEGORIES_SOURCE = "Mem0's mapping (mem0ai/mem0#2609); LoCoMo's own code names 1-4 multi-hop, temporal, open-domain, single-hop (snap-research/locomo#29)"
CATEGORY_NAMES: Mapping[int, str] = {
    1: "single-hop",
    2: "temporal",
    3: "multi-hop",
    4: "open-domain",
    5: "adversarial",
}
ADVERSARIAL_CATEGORY = 5
# Adversarial questions have no `answer` (only the misleading `adversarial_answer`); LoCoMo's own
# scoring counts an answer as right when it says the thing is not mentioned, so that is the gold.
ADVERSARIAL_ANSWER = "Not mentioned in the conversation"

# The paper's 1:1:8 split by conversation. `None` means "every conversation no other split names".
SPLITS: Mapping[str, tuple[str, ...] | None] = {
    "train": ("conv-26",),
    "validation": ("conv-30",),
    "test": None,
}

_SESSION_KEY = re.compile(r"session_(\d+)")
_OBSERVATION_KEY = re.compile(r"session_(\d+)_observation")
_DIA_ID_SEPARATORS = re.compile(r"[\s,;]+")
# "D30:05" and "D:11:26" are recoverable spellings of D30:5 and D11:26.
_DIA_ID = re.compile(r"D:?(\d+):(\d+)")
_CANONICAL_DIA_ID = re.compile(r"D[1-9]\d*:[1-9]\d*")


class IssueKind(str, enum.Enum):
    """What the parser did to a dia_id entry that was not one plain id of a turn."""

    EVIDENCE_REPAIRED = "evidence_repaired"
    EVIDENCE_DROPPED_MALFORMED = "evidence_dropped_malformed"
    EVIDENCE_DROPPED_UNKNOWN = "evidence_dropped_unknown"
    FACT_DIA_ID_REPAIRED = "fact_dia_id_repaired"
    FACT_DIA_ID_DROPPED_MALFORMED = "fact_dia_id_dropped_malformed"
    FACT_DIA_ID_DROPPED_UNKNOWN = "fact_dia_id_dropped_unknown"


@dataclass(frozen=True)
class ParseIssue:
    """One repaired or dropped dia_id: where it was, the entry as written, and what became of it."""

    sample_id: str
    json_path: str
    kind: IssueKind
    raw: str
    detail: str


@dataclass(frozen=True)
class LoCoMoParse:
    """A parsed LoCoMo file: its conversations in file order and every dia_id repair or drop."""

    path: Path
    conversations: tuple[Conversation, ...]
    issues: tuple[ParseIssue, ...]


@dataclass(frozen=True)
class SplitStats:
    """Sizes of a set of conversations, and the dia_id repairs and drops made while parsing them."""

    conversations: int
    sessions: int
    turns: int
    facts: int
    questions_by_category: Mapping[int, int]
    questions_without_evidence: int
    issues: Mapping[IssueKind, int]

    @property
    def questions(self) -> int:
        return sum(self.questions_by_category.values())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view: category keys as strings, every issue kind present (0 when none)."""
        return {
            "conversations": self.conversations,
            "sessions": self.sessions,
            "turns": self.turns,
            "facts": self.facts,
            "questions": {
                **{str(category): count for category, count in self.questions_by_category.items()},
                "total": self.questions,
            },
            "questions_without_evidence": self.questions_without_evidence,
            **{kind.value: self.issues.get(kind, 0) for kind in IssueKind},
        }


def normalise_dia_ids(raw: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Split one dia_id entry into canonical ids and the tokens that are no dia_id at all.

    `'D8:6; D9:17'` -> (("D8:6", "D9:17"), ()); `'D30:05'` -> (("D30:5",), ()); `'D:11:26'` ->
    (("D11:26",), ()); `'D'` -> ((), ("D",)). Duplicates are kept once, in first-seen order.
    """
    ids: dict[str, None] = {}
    rejected: list[str] = []
    for token in _DIA_ID_SEPARATORS.split(raw.strip()):
        if not token:
            continue
        match = _DIA_ID.fullmatch(token)
        if match is None:
            rejected.append(token)
        else:
            ids[f"D{int(match.group(1))}:{int(match.group(2))}"] = None
    return tuple(ids), tuple(rejected)


def load_locomo(
    path: str | Path, exclude_categories: Collection[int] = (ADVERSARIAL_CATEGORY,)
) -> list[Conversation]:
    """The conversations of a LoCoMo file, questions of `exclude_categories` left out."""
    return list(parse_locomo(path, exclude_categories).conversations)


def parse_locomo(
    path: str | Path, exclude_categories: Collection[int] = (ADVERSARIAL_CATEGORY,)
) -> LoCoMoParse:
    """Parse a LoCoMo file into conversations plus the list of dia_id repairs and drops.

    Raises `DatasetFormatError` (file, JSON path, problem) for invalid JSON and structural errors,
    `FileNotFoundError` when the file is absent.
    """
    path = Path(path)
    parser = _Parser(frozenset(exclude_categories))
    conversations = parser.samples(read_json(path))
    if parser.issues:
        counts = Counter(issue.kind.value for issue in parser.issues)
        logger.info("%s: dia_id repairs and drops: %s", path, dict(sorted(counts.items())))
    return LoCoMoParse(path=path, conversations=conversations, issues=tuple(parser.issues))


def split_conversations(
    conversations: Sequence[Conversation],
    splits: Mapping[str, Sequence[str] | None] = SPLITS,
) -> dict[str, list[Conversation]]:
    """Assign conversations to splits by `sample_id`, keeping file order within each split.

    A split mapped to `None` takes every conversation no other split names (at most one may).
    Raises ValueError for a sample_id named twice or absent from `conversations`.
    """
    rest_splits = [name for name, ids in splits.items() if ids is None]
    if len(rest_splits) > 1:
        raise ValueError(f"splits: only one split may take the rest (None), got {rest_splits}")
    known = {conversation.sample_id for conversation in conversations}
    owner: dict[str, str] = {}
    for name, ids in splits.items():
        for sample_id in ids or ():
            if sample_id not in known:
                raise ValueError(f"splits.{name}: no conversation {sample_id!r} (have {sorted(known)})")
            if sample_id in owner:
                raise ValueError(f"splits.{name}: {sample_id!r} is already in split {owner[sample_id]!r}")
            owner[sample_id] = name
    rest = rest_splits[0] if rest_splits else None
    assigned: dict[str, list[Conversation]] = {name: [] for name in splits}
    for conversation in conversations:
        name = owner.get(conversation.sample_id, rest)
        if name is not None:
            assigned[name].append(conversation)
    return assigned


def split_stats(
    conversations: Iterable[Conversation],
    issues: Iterable[ParseIssue],
    categories: Iterable[int] = (1, 2, 3, 4),
) -> SplitStats:
    """Count sessions, turns, facts, questions per category (each of `categories` listed, plus any
    other that occurs) and the parse issues that belong to these conversations."""
    conversations = list(conversations)
    sample_ids = {conversation.sample_id for conversation in conversations}
    questions = [question for conversation in conversations for question in conversation.questions]
    by_category = Counter(question.category for question in questions)
    return SplitStats(
        conversations=len(conversations),
        sessions=sum(len(conversation.sessions) for conversation in conversations),
        turns=sum(1 for conversation in conversations for _ in conversation.turns()),
        facts=sum(len(conversation.facts) for conversation in conversations),
        questions_by_category={c: by_category[c] for c in sorted(set(categories) | set(by_category))},
        questions_without_evidence=sum(1 for question in questions if not question.evidence),
        issues=dict(Counter(issue.kind for issue in issues if issue.sample_id in sample_ids)),
    )


@dataclass(frozen=True)
class _IssueKinds:
    """The three things that can happen to a dia_id entry of one field (evidence or fact)."""

    repaired: IssueKind
    malformed: IssueKind
    unknown: IssueKind


_EVIDENCE_ISSUES = _IssueKinds(
    repaired=IssueKind.EVIDENCE_REPAIRED,
    malformed=IssueKind.EVIDENCE_DROPPED_MALFORMED,
    unknown=IssueKind.EVIDENCE_DROPPED_UNKNOWN,
)
_FACT_ISSUES = _IssueKinds(
    repaired=IssueKind.FACT_DIA_ID_REPAIRED,
    malformed=IssueKind.FACT_DIA_ID_DROPPED_MALFORMED,
    unknown=IssueKind.FACT_DIA_ID_DROPPED_UNKNOWN,
)


class _Parser:
    """Walks one file's JSON (raising, with the JSON path, on structural errors) and collects issues."""

    def __init__(self, exclude_categories: frozenset[int]) -> None:
        self.exclude_categories = exclude_categories
        self.issues: list[ParseIssue] = []

    def samples(self, root: JsonNode) -> tuple[Conversation, ...]:
        first_seen: dict[str, str] = {}
        conversations = []
        for sample in root.items():
            id_node = sample.field("sample_id")
            sample_id = id_node.as_str(non_empty=True)
            if sample_id in first_seen:
                raise id_node.error(f"duplicate {sample_id!r} (first at {first_seen[sample_id]})")
            first_seen[sample_id] = sample.path
            conversations.append(self.sample(sample, sample_id))
        return tuple(conversations)

    def sample(self, sample: JsonNode, sample_id: str) -> Conversation:
        conversation = sample.field("conversation")
        speakers = (
            conversation.field("speaker_a").as_str(non_empty=True),
            conversation.field("speaker_b").as_str(non_empty=True),
        )
        sessions, turn_order = self.sessions(conversation, speakers)
        facts = self.facts(sample, sample_id, sessions, turn_order, speakers)
        questions = self.questions(sample.field("qa"), sample_id, turn_order)
        return Conversation(sample_id, speakers[0], speakers[1], sessions, facts, questions)

    def sessions(
        self, conversation: JsonNode, speakers: tuple[str, str]
    ) -> tuple[tuple[Session, ...], dict[str, int]]:
        """The sessions in numeric order, and each dia_id's position in the whole conversation."""
        # `session_N_date_time` keys without a `session_N` exist (conv-26 has dates up to session 35,
        # turns up to session 19): sessions are defined by their turn lists.
        keys = conversation.as_object()
        numbers = sorted(int(match.group(1)) for key in keys if (match := _SESSION_KEY.fullmatch(key)))
        sessions = []
        turn_order: dict[str, int] = {}
        for number in numbers:
            date_time = conversation.field(f"session_{number}_date_time").as_str()
            turns = []
            for node in conversation.field(f"session_{number}").items():
                turn = self.turn(node, number, date_time, speakers)
                if turn.dia_id in turn_order:
                    raise node.field("dia_id").error(f"duplicate {turn.dia_id!r}")
                turn_order[turn.dia_id] = len(turn_order)
                turns.append(turn)
            sessions.append(Session(index=number, date_time=date_time, turns=tuple(turns)))
        return tuple(sessions), turn_order

    def turn(self, node: JsonNode, session: int, date_time: str, speakers: tuple[str, str]) -> Turn:
        speaker_node = node.field("speaker")
        speaker = self.speaker(speaker_node.as_str(), speaker_node, speakers)
        dia_id_node = node.field("dia_id")
        dia_id = dia_id_node.as_str()
        if not _CANONICAL_DIA_ID.fullmatch(dia_id):
            raise dia_id_node.error(f"expected a dia_id like 'D1:3', got {dia_id!r}")
        text = node.field("text").as_str()
        caption = node.field("blip_caption").as_str() if node.has("blip_caption") else None
        return Turn(dia_id, speaker, text, session, date_time, image_caption=caption)

    @staticmethod
    def speaker(name: str, node: JsonNode, speakers: tuple[str, str]) -> str:
        """`name`, which `node` (a turn's speaker, or an observation's key) gives; one of the two speakers."""
        if name not in speakers:
            raise node.error(f"{name!r} is neither speaker_a nor speaker_b {speakers}")
        return name

    def facts(
        self,
        sample: JsonNode,
        sample_id: str,
        sessions: tuple[Session, ...],
        turn_order: dict[str, int],
        speakers: tuple[str, str],
    ) -> tuple[Fact, ...]:
        if not sample.has("observation"):
            return ()
        observation = sample.field("observation")
        date_times = {session.index: session.date_time for session in sessions}
        facts = []
        for key, value in observation.as_object().items():
            per_session = observation.child(key, value)
            match = _OBSERVATION_KEY.fullmatch(key)
            if match is None:
                raise per_session.error("expected a key like 'session_1_observation'")
            session = int(match.group(1))
            if session not in date_times:
                raise per_session.error(f"the conversation has no session_{session}")
            for name, entries in per_session.as_object().items():
                per_speaker = per_session.child(name, entries)
                speaker = self.speaker(name, per_speaker, speakers)
                for entry in per_speaker.items():
                    pair = entry.items()
                    if len(pair) != 2:
                        raise entry.error(f"expected a [fact, dia_id] pair, got {len(pair)} items")
                    dia_ids = self.fact_dia_ids(pair[1], sample_id, turn_order)
                    facts.append(Fact(pair[0].as_str(), speaker, dia_ids, session, date_times[session]))

        def dialogue_position(fact: Fact) -> tuple[int, float]:
            # Uncited facts go to the end of their session.
            known = knowable_at(fact.dia_ids, turn_order)
            return fact.session, float("inf") if known is None else known

        return tuple(sorted(facts, key=dialogue_position))

    def fact_dia_ids(self, node: JsonNode, sample_id: str, turn_order: dict[str, int]) -> tuple[str, ...]:
        """A fact cites one dia_id string, a comma-separated string of them, or a list of them."""
        entries = [node] if isinstance(node.value, str) else node.items()
        ids: dict[str, None] = {}
        for entry in entries:
            ids.update(dict.fromkeys(self.dia_ids(entry, sample_id, turn_order, _FACT_ISSUES)))
        return tuple(ids)

    def dia_ids(
        self, node: JsonNode, sample_id: str, turn_order: dict[str, int], kinds: _IssueKinds
    ) -> tuple[str, ...]:
        """Normalise one dia_id entry, keep the ids of real turns, and record what was changed."""
        raw = node.as_str()
        ids, rejected = normalise_dia_ids(raw)
        known = tuple(dia_id for dia_id in ids if dia_id in turn_order)
        found = [(kinds.malformed, f"{token!r} is not a dia_id") for token in rejected]
        found += [(kinds.unknown, f"no turn {dia_id}") for dia_id in ids if dia_id not in turn_order]
        if known and known != (raw,):
            found.append((kinds.repaired, f"read as {', '.join(known)}"))
        self.issues.extend(ParseIssue(sample_id, node.path, kind, raw, detail) for kind, detail in found)
        return known

    def questions(self, qa: JsonNode, sample_id: str, turn_order: dict[str, int]) -> tuple[Question, ...]:
        questions = []
        for index, node in enumerate(qa.items()):
            category = self.category(node.field("category"))
            if category in self.exclude_categories:
                continue
            if category == ADVERSARIAL_CATEGORY:
                answer = ADVERSARIAL_ANSWER  # these questions have no `answer`
            else:
                answer = node.field("answer").as_answer()  # a string, or a number such as 2022
            evidence: dict[str, None] = {}
            for entry in node.field("evidence").items():
                evidence.update(dict.fromkeys(self.dia_ids(entry, sample_id, turn_order, _EVIDENCE_ISSUES)))
            questions.append(
                Question(
                    qid=f"{sample_id}/q{index}",
                    conversation_id=sample_id,
                    question=node.field("question").as_str(non_empty=True),
                    answer=answer,
                    evidence=tuple(evidence),
                    category=category,
                )
            )
        return tuple(questions)

    @staticmethod
    def category(node: JsonNode) -> int:
        # bool is an int subclass, but `true` is no category.
        if isinstance(node.value, bool) or not isinstance(node.value, int):
            raise node.error(f"expected an int, got {json_type_name(node.value)}")
        return node.value


SPEC = DatasetSpec(
    title="LoCoMo",
    load=load_locomo,
    categories=CATEGORY_NAMES,
    categories_source=CATEGORIES_SOURCE,
    locomo_format=True,
    missing_file=(
        "Point data.path at your copy of locomo10.json, leave it unset for ../shared/data/locomo10.json or "
        "data/locomo10.json, or add data.download=true to download it to that path."
    ),
)
