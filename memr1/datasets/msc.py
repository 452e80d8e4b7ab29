"""MSC (Multi-Session Chat) and its memory-QA release into `memr1.types.Conversation`s.

Sources followed:
- ParlAI's MSC task (`parlai/tasks/msc`, data `msc_v0.1`): one JSON object per line with
  `previous_dialogs` (earlier sessions, each `{"dialog": [{"text", ...}, ...], "time_num",
  "time_unit", ...}`), `dialog` (the current session, `[{"id": "Speaker 1"|"Speaker 2", "text", ...}]`),
  `personas`, `metadata`. A previous session's `time_num` `time_unit` is the time that passed between
  it and the next session (ParlAI prints the last one as "time since the last conversation").
- "Beyond Goldfish Memory: Long-Term Open-Domain Conversation" (Xu, Szlam, Weston, ACL 2022), which
  introduced MSC: two crowdworkers, "Speaker 1" and "Speaker 2", alternating, 1-7 hours or 1-7 days
  between sessions.
- MemGPT's `msc_self_instruct` (Packer et al. 2023, "MemGPT: Towards LLMs as Operating Systems";
  Letta's deep-memory-retrieval task): MSC records plus `self_instruct: {"B": question, "A": answer}`,
  a question about the earlier sessions. A top-level `question` / `answer` pair is read the same way
  (`self_instruct` wins when both are present).

Mapping:
- A file is a JSON list of records or JSON Lines. Record `i` becomes conversation `msc-<i>` between
  "Speaker 1" and "Speaker 2"; sessions are the previous dialogs in order, then `dialog`, numbered
  from 1; dia_ids are `D<session>:<turn>` counted from 1. A turn's speaker is its `id` when given,
  otherwise the speakers alternate from "Speaker 1" at the start of each session.
- Session date-times: MSC gives only the gaps, so session 1 is placed at a fixed anchor
  (`MSC_ANCHOR`, 1 January 2023 9:00 am, changeable per call) and each later session at the previous
  one plus its gap; a month counts as 30 days and a year as 365. They are written like LoCoMo's,
  "1:00 pm on 3 January, 2023", which is what the memory pipeline stores as timestamps.
- Facts: a turn's `persona_text` (the persona sentence crowdworkers wrote for it, in MSC's
  persona-summary files) becomes a `Fact` of that turn; records without it have no facts, and the
  pipeline falls back to raw turns or LLM extraction.
- Questions: at most one, `msc-<i>/q0`, category 1 (`QUESTION_TYPES`); MSC marks no evidence turns,
  so `evidence` is empty. A record with no question (plain ParlAI MSC) has no questions.

Anything that does not match the format raises `DatasetFormatError` naming the file and JSON path
(`line N: $...` in JSON Lines files).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path

from memr1.datasets.registry import DatasetSpec, JsonNode, read_json_records
from memr1.types import Conversation, Fact, Question, Session, Turn

SPEAKERS: tuple[str, str] = ("Speaker 1", "Speaker 2")
MSC_ANCHOR = datetime(2023, 1, 1, 9, 0)
TIME_UNITS: Mapping[str, timedelta] = {
    "second": timedelta(seconds=1),
    "minute": timedelta(minutes=1),
    "hour": timedelta(hours=1),
    "day": timedelta(days=1),
    "week": timedelta(weeks=1),
    "month": timedelta(days=30),
    "year": timedelta(days=365),
}
QUESTION_TYPES: dict[str, int] = {"deep-memory-retrieval": 1}
CATEGORY_NAMES: Mapping[int, str] = {code: name for name, code in QUESTION_TYPES.items()}

_MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip


def load_msc(path: str | Path, anchor: datetime = MSC_ANCHOR) -> list[Conversation]:
    """The conversations of an MSC file (JSON list or JSON Lines), session 1 placed at `anchor`.

    Raises `DatasetFormatError` (file, JSON path, problem) for invalid JSON or a malformed field,
    `FileNotFoundError` when the file is absent.
    """
    return [
        record_to_conversation(record, f"msc-{index}", anchor)
        for index, record in enumerate(read_json_records(path))
    ]


def session_start_times(gaps: Sequence[timedelta], anchor: datetime) -> list[datetime]:
    """When each session starts: the first at `anchor`, each next one a gap after the one before.

    `gaps[k]` is the time between session k+1 and session k+2, so n gaps give n+1 start times.
    """
    times = [anchor]
    for gap in gaps:
        times.append(times[-1] + gap)
    return times


def format_date_time(moment: datetime) -> str:
    """LoCoMo's date-time style, independent of the locale: `1:56 pm on 8 May, 2023`."""
    hour = moment.hour % 12 or 12
    meridiem = "am" if moment.hour < 12 else "pm"
    return f"{hour}:{moment.minute:02d} {meridiem} on {moment.day} {_MONTHS[moment.month - 1]}, {moment.year}"


def time_unit_length(time_unit: str) -> timedelta:
    """The length of one MSC `time_unit` ("hours", "Week", ...): singular or plural, any case.

    Raises ValueError for a unit that is not one of `TIME_UNITS`.
    """
    unit = time_unit.strip().lower().removesuffix("s")
    if unit not in TIME_UNITS:
        raise ValueError(f"unknown time unit {time_unit!r}; expected one of {', '.join(f'{u}s' for u in TIME_UNITS)}")
    return TIME_UNITS[unit]


def record_to_conversation(record: JsonNode, sample_id: str, anchor: datetime = MSC_ANCHOR) -> Conversation:
    """One MSC record (a JSON object) as a conversation with at most one question."""
    previous = record.field("previous_dialogs").items() if record.has("previous_dialogs") else []
    dialogs = [session.field("dialog") for session in previous] + [record.field("dialog")]
    gaps = [_time_gap(session) for session in previous]
    sessions: list[Session] = []
    facts: list[Fact] = []
    for number, (dialog, start) in enumerate(zip(dialogs, session_start_times(gaps, anchor)), start=1):
        date_time = format_date_time(start)
        turns = []
        for index, raw_turn in enumerate(dialog.items(), start=1):
            turn = _turn(raw_turn, number, index, date_time)
            turns.append(turn)
            if raw_turn.has("persona_text"):
                persona = raw_turn.field("persona_text").as_str().strip()
                if persona:
                    facts.append(Fact(persona, turn.speaker, (turn.dia_id,), number, date_time))
        sessions.append(Session(index=number, date_time=date_time, turns=tuple(turns)))
    return Conversation(
        sample_id=sample_id,
        speaker_a=SPEAKERS[0],
        speaker_b=SPEAKERS[1],
        sessions=tuple(sessions),
        facts=tuple(facts),
        questions=_questions(record, sample_id),
    )


def _time_gap(session: JsonNode) -> timedelta:
    number_node, unit_node = session.field("time_num"), session.field("time_unit")
    number = number_node.as_number()
    if number < 0:
        raise number_node.error(f"negative time gap {number}")
    try:
        return number * time_unit_length(unit_node.as_str())
    except ValueError as error:
        raise unit_node.error(str(error)) from error


def _turn(node: JsonNode, session: int, index: int, date_time: str) -> Turn:
    """Turn `index` (from 1) of `session`; without an `id`, odd turns are Speaker 1's."""
    text = node.field("text").as_str()
    if node.has("id"):
        id_node = node.field("id")
        speaker = id_node.as_str()
        if speaker not in SPEAKERS:
            raise id_node.error(f"expected 'Speaker 1' or 'Speaker 2', got {speaker!r}")
    else:
        speaker = SPEAKERS[(index - 1) % 2]
    return Turn(dia_id=f"D{session}:{index}", speaker=speaker, text=text, session=session, date_time=date_time)


def _questions(record: JsonNode, sample_id: str) -> tuple[Question, ...]:
    if record.has("self_instruct"):
        pair = record.field("self_instruct")
        question_node, answer_node = pair.field("B"), pair.field("A")
    elif record.has("question") or record.has("answer"):
        question_node, answer_node = record.field("question"), record.field("answer")
    else:
        return ()
    question = Question(
        qid=f"{sample_id}/q0",
        conversation_id=sample_id,
        question=question_node.as_str(non_empty=True),
        answer=answer_node.as_answer(),
        evidence=(),
        category=QUESTION_TYPES["deep-memory-retrieval"],
    )
    return (question,)


SPEC = DatasetSpec(
    title="MSC",
    load=load_msc,
    categories=CATEGORY_NAMES,
    categories_source="MemGPT's msc_self_instruct task: one kind of question (deep memory retrieval)",
    locomo_format=False,
    missing_file="Point data.path at your copy of MemGPT's msc_self_instruct JSON Lines.",
)
