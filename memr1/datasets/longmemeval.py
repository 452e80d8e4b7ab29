"""LongMemEval (Wu et al., ICLR 2025; github.com/xiaowu0162/LongMemEval) into `memr1.types.Conversation`s.

The public files `longmemeval_s.json`, `longmemeval_m.json` and `longmemeval_oracle.json` are lists
of instances, each one question over its own chat history: `question_id`, `question_type`,
`question`, `answer` (a string or a number), `question_date`, and the history as parallel lists
`haystack_dates`, `haystack_session_ids`, `haystack_sessions` (each session a list of
`{"role": "user"|"assistant", "content", "has_answer"?}` turns), plus `answer_session_ids`.

Each instance becomes one conversation (`sample_id` = `question_id`) between the speakers "user" and
"assistant", with one question:
- Sessions are put in chronological order (the oracle file does not sort them) and numbered from 1;
  turns get LoCoMo-style dia_ids `D<session>:<turn>` counted from 1, and the session's date string
  as given (`2023/05/20 (Sat) 02:21`). The question keeps `question_date` as its `date_time`.
- Evidence: the turns marked `has_answer: true`; when no turn is marked, every turn of the
  `answer_session_ids` sessions.
- There are no per-turn facts, so `facts` is empty: the pipeline uses raw turns or LLM extraction.
- Categories: `QUESTION_TYPES` numbers the six question types 1..6. An abstention question (its id
  ends in `_abs`; the gold answer says the history does not tell) is kept, with its type's number
  plus `ABSTENTION_OFFSET`, named `<type>_abs` (e.g. `knowledge-update_abs` = 16).

Anything that does not match the format raises `DatasetFormatError` naming the file and JSON path.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from memr1.datasets.registry import DatasetSpec, JsonNode, read_json
from memr1.types import Conversation, Question, Session, Turn

SPEAKERS: tuple[str, str] = ("user", "assistant")
DATE_FORMAT = "%Y/%m/%d (%a) %H:%M"
ABSTENTION_SUFFIX = "_abs"
ABSTENTION_OFFSET = 10

_ANSWERABLE_TYPES: Mapping[str, int] = {
    "single-session-user": 1,
    "single-session-assistant": 2,
    "single-session-preference": 3,
    "multi-session": 4,
    "temporal-reasoning": 5,
    "knowledge-update": 6,
}
QUESTION_TYPES: dict[str, int] = {
    **_ANSWERABLE_TYPES,
    **{name + ABSTENTION_SUFFIX: code + ABSTENTION_OFFSET for name, code in _ANSWERABLE_TYPES.items()},
}
CATEGORY_NAMES: Mapping[int, str] = {code: name for name, code in QUESTION_TYPES.items()}


def load_longmemeval(path: str | Path) -> list[Conversation]:
    """The conversations of a LongMemEval file, one per instance, in file order.

    Raises `DatasetFormatError` (file, JSON path, problem) for invalid JSON, a malformed field or a
    duplicate `question_id`; `FileNotFoundError` when the file is absent.
    """
    first_seen: dict[str, str] = {}
    conversations = []
    for instance in read_json(path).items():
        conversation = instance_to_conversation(instance)
        if conversation.sample_id in first_seen:
            raise instance.field("question_id").error(
                f"duplicate {conversation.sample_id!r} (first at {first_seen[conversation.sample_id]})"
            )
        first_seen[conversation.sample_id] = instance.path
        conversations.append(conversation)
    return conversations


def question_category(question_type: str, question_id: str) -> int:
    """The category of a question: its type's number, plus `ABSTENTION_OFFSET` for an `_abs` id.

    Raises KeyError for a type that is not one of LongMemEval's six.
    """
    code = _ANSWERABLE_TYPES[question_type]
    return code + ABSTENTION_OFFSET if question_id.endswith(ABSTENTION_SUFFIX) else code


def instance_to_conversation(instance: JsonNode) -> Conversation:
    """One LongMemEval instance (a JSON object) as a conversation with its one question."""
    question_id = instance.field("question_id").as_str(non_empty=True)
    type_node = instance.field("question_type")
    question_type = type_node.as_str()
    if question_type not in _ANSWERABLE_TYPES:
        expected = ", ".join(_ANSWERABLE_TYPES)
        raise type_node.error(f"unknown question type {question_type!r}; expected one of {expected}")
    question_date_node = instance.field("question_date")
    _parse_date(question_date_node)  # checked like the session dates, kept as the dataset writes it

    dates = instance.field("haystack_dates").items()
    session_ids = instance.field("haystack_session_ids").items()
    raw_sessions = instance.field("haystack_sessions").items()
    for name, nodes in (("haystack_dates", dates), ("haystack_session_ids", session_ids)):
        if len(nodes) != len(raw_sessions):
            raise instance.field(name).error(
                f"has {len(nodes)} entries but haystack_sessions has {len(raw_sessions)}"
            )
    moments = [_parse_date(node) for node in dates]
    # Stable: sessions with equal dates keep the file's order.
    chronological = sorted(range(len(raw_sessions)), key=moments.__getitem__)

    sessions: list[Session] = []
    marked: list[str] = []
    # A list per id: an id repeated in the haystack names every session that carries it.
    numbers_by_id: dict[str, list[int]] = {}
    for number, position in enumerate(chronological, start=1):
        date_time = dates[position].as_str()
        turns = []
        for index, raw_turn in enumerate(raw_sessions[position].items(), start=1):
            turn = _turn(raw_turn, number, index, date_time)
            turns.append(turn)
            if raw_turn.has("has_answer") and raw_turn.field("has_answer").as_bool():
                marked.append(turn.dia_id)
        session = Session(index=number, date_time=date_time, turns=tuple(turns))
        sessions.append(session)
        numbers_by_id.setdefault(session_ids[position].as_str(), []).append(number)
    # `marked` is in session-processing order, which is chronological, hence dialogue order.
    evidence = tuple(marked) if marked else _answer_session_turns(instance, sessions, numbers_by_id)

    question = Question(
        qid=question_id,
        conversation_id=question_id,
        question=instance.field("question").as_str(non_empty=True),
        answer=instance.field("answer").as_answer(),
        evidence=evidence,
        category=question_category(question_type, question_id),
        date_time=question_date_node.as_str(),
    )
    return Conversation(
        sample_id=question_id,
        speaker_a=SPEAKERS[0],
        speaker_b=SPEAKERS[1],
        sessions=tuple(sessions),
        questions=(question,),
    )


def _turn(node: JsonNode, session: int, index: int, date_time: str) -> Turn:
    role_node = node.field("role")
    role = role_node.as_str()
    if role not in SPEAKERS:
        raise role_node.error(f"expected 'user' or 'assistant', got {role!r}")
    text = node.field("content").as_str()
    return Turn(dia_id=f"D{session}:{index}", speaker=role, text=text, session=session, date_time=date_time)


def _answer_session_turns(
    instance: JsonNode, sessions: list[Session], numbers_by_id: Mapping[str, list[int]]
) -> tuple[str, ...]:
    """The dia_ids of every turn of the `answer_session_ids` sessions, in dialogue order."""
    wanted: set[int] = set()
    for node in instance.field("answer_session_ids").items():
        session_id = node.as_str()
        if session_id not in numbers_by_id:
            raise node.error(f"{session_id!r} is not in haystack_session_ids")
        wanted.update(numbers_by_id[session_id])
    return tuple(turn.dia_id for session in sessions if session.index in wanted for turn in session.turns)


def _parse_date(node: JsonNode) -> datetime:
    text = node.as_str()
    try:
        return datetime.strptime(text, DATE_FORMAT)
    except ValueError as error:
        raise node.error(f"expected a date like '2023/05/20 (Sat) 02:21', got {text!r}") from error


SPEC = DatasetSpec(
    title="LongMemEval",
    load=load_longmemeval,
    categories=CATEGORY_NAMES,
    categories_source="LongMemEval's question_type, numbered here (QUESTION_TYPES); _abs: its abstention questions",
    locomo_format=False,
    missing_file="Point data.path at your copy of LongMemEval's longmemeval_s.json, _m or _oracle.",
)
