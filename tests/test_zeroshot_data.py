"""The zero-shot transfer datasets: LongMemEval and MSC loaders, and the `load_dataset` registry.

Fixtures in tests/fixtures are small files in each public format; every expected value below is
written out by hand from them. Time budget: well under a second (pure Python, no models).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable

import pytest

from memr1.datasets.errors import DatasetFormatError
from memr1.datasets.longmemeval import CATEGORY_NAMES as LME_CATEGORY_NAMES
from memr1.datasets.longmemeval import QUESTION_TYPES as LME_QUESTION_TYPES
from memr1.datasets.longmemeval import load_longmemeval, question_category
from memr1.datasets.msc import (
    CATEGORY_NAMES as MSC_CATEGORY_NAMES,
    format_date_time,
    load_msc,
    session_start_times,
    time_unit_length,
)
from memr1.datasets.registry import category_names, load_dataset, read_json_records
from memr1.types import Conversation, Fact, Question, Session, Turn

FIXTURES = Path(__file__).parent / "fixtures"
LME_SAMPLE = FIXTURES / "lme_sample.json"
MSC_SAMPLE = FIXTURES / "msc_self_instruct_sample.jsonl"


def _session(index: int, date_time: str, *turns: tuple[str, str]) -> Session:
    """A session whose turns are (speaker, text) pairs, numbered D<index>:1, D<index>:2, ..."""
    return Session(
        index=index,
        date_time=date_time,
        turns=tuple(
            Turn(dia_id=f"D{index}:{n}", speaker=speaker, text=text, session=index, date_time=date_time)
            for n, (speaker, text) in enumerate(turns, start=1)
        ),
    )


ABSTENTION_ANSWER = (
    "The information provided is not enough. You mentioned your tennis lessons but not where they moved."
)

LME_EXPECTED = [
    Conversation(
        sample_id="e47becba",
        speaker_a="user",
        speaker_b="assistant",
        sessions=(
            _session(
                1,
                "2023/05/20 (Sat) 02:21",
                ("user", "I bought a road bike today."),
                ("assistant", "Congratulations on the road bike!"),
            ),
            _session(
                2,
                "2023/05/25 (Thu) 10:05",
                ("user", "Any tips for cleaning a chain?"),
                ("assistant", "Use a degreaser and a rag."),
                ("user", "I now have two mountain bikes as well."),
            ),
        ),
        facts=(),
        questions=(
            Question(
                qid="e47becba",
                conversation_id="e47becba",
                question="How many bikes do I own?",
                answer="3",  # the file's answer is the int 3
                evidence=("D1:1", "D2:3"),  # the two has_answer: true turns; D2:1 is marked false
                category=4,  # multi-session
                date_time="2023/05/30 (Tue) 23:40",
            ),
        ),
    ),
    Conversation(
        sample_id="0a99d2a4_abs",
        speaker_a="user",
        speaker_b="assistant",
        # The file lists 06/02 before 06/01 (as the oracle file may): sessions are renumbered by date.
        sessions=(
            _session(
                1,
                "2023/06/01 (Thu) 08:15",
                ("user", "What is a good stretch before running?"),
                ("assistant", "Try leg swings."),
            ),
            _session(
                2,
                "2023/06/02 (Fri) 18:30",
                ("user", "My tennis lessons are on Fridays now."),
                ("assistant", "Noted: Fridays it is."),
            ),
        ),
        facts=(),
        questions=(
            Question(
                qid="0a99d2a4_abs",
                conversation_id="0a99d2a4_abs",
                question="Where did I move my tennis lessons to?",
                answer=ABSTENTION_ANSWER,
                evidence=("D2:1", "D2:2"),  # no has_answer flags: every turn of answer_0a99d2a4_1
                category=16,  # knowledge-update (6) + abstention offset (10)
                date_time="2023/06/10 (Sat) 09:00",
            ),
        ),
    ),
]

# Anchor 9:00 am on 1 January 2023; gaps 4 hours then 2 days (record 0), 1 Week (record 1).
MSC_EXPECTED = [
    Conversation(
        sample_id="msc-0",
        speaker_a="Speaker 1",
        speaker_b="Speaker 2",
        sessions=(
            _session(
                1,
                "9:00 am on 1 January, 2023",
                ("Speaker 1", "Hi! I just got back from a hike with my dog Max."),
                ("Speaker 2", "Nice, I love hiking too. I teach chemistry."),
            ),
            _session(
                2,
                "1:00 pm on 1 January, 2023",
                ("Speaker 1", "Max hurt his paw yesterday."),
                ("Speaker 2", "Oh no, is he okay?"),
                ("Speaker 1", "Yes, the vet says he will heal."),
            ),
            _session(
                3,
                "1:00 pm on 3 January, 2023",
                ("Speaker 1", "I booked a trip to Peru."),
                ("Speaker 2", "Will you take Max?"),
            ),
        ),
        facts=(),
        questions=(
            Question(
                qid="msc-0/q0",
                conversation_id="msc-0",
                question="What is the name of your dog?",
                answer="Max",
                evidence=(),
                category=1,
            ),
        ),
    ),
    Conversation(
        sample_id="msc-1",
        speaker_a="Speaker 1",
        speaker_b="Speaker 2",
        sessions=(
            _session(
                1,
                "9:00 am on 1 January, 2023",
                ("Speaker 1", "I run a bakery in town."),
                ("Speaker 2", "I have three cats."),
            ),
            # The current dialog's ids say Speaker 2 opens it.
            _session(
                2,
                "9:00 am on 8 January, 2023",
                ("Speaker 2", "My cats knocked over a vase."),
                ("Speaker 1", "Cats will be cats."),
            ),
        ),
        # Only the non-empty persona_text becomes a fact.
        facts=(Fact("I own a bakery.", "Speaker 1", ("D1:1",), 1, "9:00 am on 1 January, 2023"),),
        questions=(
            Question(
                qid="msc-1/q0",
                conversation_id="msc-1",
                question="How many cats do you have?",
                answer="3",
                evidence=(),
                category=1,
            ),
        ),
    ),
]


def assert_pipeline_invariants(conversation: Conversation) -> None:
    """What the memory pipeline and evaluation rely on in any loaded conversation."""
    turns = list(conversation.turns())
    dia_ids = [turn.dia_id for turn in turns]
    position = {dia_id: index for index, dia_id in enumerate(dia_ids)}
    assert len(position) == len(dia_ids), "dia_ids are unique"
    assert [session.index for session in conversation.sessions] == list(range(1, len(conversation.sessions) + 1))
    for session in conversation.sessions:
        for turn in session.turns:
            assert (turn.session, turn.date_time) == (session.index, session.date_time)
            assert turn.speaker in conversation.speakers
    for fact in conversation.facts:
        assert fact.speaker in conversation.speakers
        assert fact.dia_ids and set(fact.dia_ids) <= set(position)
        assert {dia_id.split(":")[0] for dia_id in fact.dia_ids} == {f"D{fact.session}"}
    assert sum(len(group) for group in conversation.facts_by_turn().values()) == len(conversation.facts)
    qids = [question.qid for question in conversation.questions]
    assert len(set(qids)) == len(qids)
    for question in conversation.questions:
        assert question.conversation_id == conversation.sample_id
        assert isinstance(question.answer, str) and question.answer.strip()
        assert set(question.evidence) <= set(position)
        assert list(question.evidence) == sorted(question.evidence, key=position.__getitem__)


# --- LongMemEval --------------------------------------------------------------------------------


def test_longmemeval_sample_converts_exactly() -> None:
    assert load_longmemeval(LME_SAMPLE) == LME_EXPECTED


def test_longmemeval_question_types_name_every_category() -> None:
    assert LME_QUESTION_TYPES["single-session-user"] == 1
    assert LME_QUESTION_TYPES["knowledge-update"] == 6
    assert LME_QUESTION_TYPES["single-session-user_abs"] == 11
    assert len(LME_QUESTION_TYPES) == 12
    assert LME_CATEGORY_NAMES[16] == "knowledge-update_abs"
    assert question_category("temporal-reasoning", "gpt4_2655b836") == 5
    assert question_category("temporal-reasoning", "gpt4_2655b836_abs") == 15


def _lme_records() -> list[dict[str, Any]]:
    return json.loads(LME_SAMPLE.read_text(encoding="utf-8"))


def _write(tmp_path: Path, name: str, data: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_longmemeval_all_flags_false_falls_back_to_answer_sessions(tmp_path: Path) -> None:
    records = _lme_records()
    for session in records[0]["haystack_sessions"]:
        for turn in session:
            turn["has_answer"] = False
    (conversation, _) = load_longmemeval(_write(tmp_path, "longmemeval_s.json", records))
    assert conversation.questions[0].evidence == ("D1:1", "D1:2", "D2:1", "D2:2", "D2:3")


def test_longmemeval_repeated_session_id_names_every_session_with_it(tmp_path: Path) -> None:
    records = _lme_records()
    records[1]["haystack_session_ids"] = ["answer_0a99d2a4_1", "answer_0a99d2a4_1"]
    (_, conversation) = load_longmemeval(_write(tmp_path, "longmemeval_s.json", records))
    assert conversation.questions[0].evidence == ("D1:1", "D1:2", "D2:1", "D2:2")


def _set(path: tuple[str | int, ...], value: Any) -> Callable[[list[Any]], None]:
    def mutate(records: list[Any]) -> None:
        target = records
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _delete(path: tuple[str | int, ...]) -> Callable[[list[Any]], None]:
    def mutate(records: list[Any]) -> None:
        target = records
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


LME_MALFORMED = [
    (_delete((0, "question_id")), "$[0].question_id: missing"),
    (_set((0, "answer"), None), "$[0].answer: expected a string or a number, got null"),
    (_set((0, "answer"), True), "$[0].answer: expected a string or a number, got bool"),
    (_set((1, "question"), "  "), "$[1].question: empty string"),
    (
        _set((0, "question_type"), "multi-hop"),
        "$[0].question_type: unknown question type 'multi-hop'; expected one of single-session-user, "
        "single-session-assistant, single-session-preference, multi-session, temporal-reasoning, knowledge-update",
    ),
    (
        _set((0, "haystack_sessions", 1, 0, "role"), "system"),
        "$[0].haystack_sessions[1][0].role: expected 'user' or 'assistant', got 'system'",
    ),
    (
        _set((0, "haystack_sessions", 1, 2, "content"), 7),
        "$[0].haystack_sessions[1][2].content: expected a string, got int",
    ),
    (
        _set((0, "haystack_sessions", 0, 0, "has_answer"), "yes"),
        "$[0].haystack_sessions[0][0].has_answer: expected a bool, got string",
    ),
    (_set((0, "haystack_sessions"), {}), "$[0].haystack_sessions: expected a list, got object"),
    (_set((1, "haystack_sessions", 0, 1), "Noted."), "$[1].haystack_sessions[0][1]: expected an object, got string"),
    (
        _set((0, "haystack_dates", 1), "May 25"),
        "$[0].haystack_dates[1]: expected a date like '2023/05/20 (Sat) 02:21', got 'May 25'",
    ),
    (
        _set((1, "question_date"), "2023-06-10"),
        "$[1].question_date: expected a date like '2023/05/20 (Sat) 02:21', got '2023-06-10'",
    ),
    (_delete((1, "haystack_dates", 0)), "$[1].haystack_dates: has 1 entries but haystack_sessions has 2"),
    (
        _set((0, "haystack_session_ids"), ["answer_e47becba_1"]),
        "$[0].haystack_session_ids: has 1 entries but haystack_sessions has 2",
    ),
    (
        _set((1, "answer_session_ids"), ["answer_0a99d2a4_9"]),
        "$[1].answer_session_ids[0]: 'answer_0a99d2a4_9' is not in haystack_session_ids",
    ),
    (_set((1, "question_id"), "e47becba"), "$[1].question_id: duplicate 'e47becba' (first at $[0])"),
    (_set((1,), ["not", "an", "instance"]), "$[1]: expected an object, got list"),
]


@pytest.mark.parametrize(("mutate", "expected"), LME_MALFORMED)
def test_longmemeval_malformed_field_names_file_and_json_path(
    tmp_path: Path, mutate: Callable[[list[Any]], None], expected: str
) -> None:
    records = _lme_records()
    mutate(records)
    path = _write(tmp_path, "longmemeval_s.json", records)
    with pytest.raises(DatasetFormatError) as caught:
        load_longmemeval(path)
    assert str(caught.value) == f"{path}: {expected}"


def test_longmemeval_top_level_must_be_a_list(tmp_path: Path) -> None:
    path = _write(tmp_path, "longmemeval_s.json", _lme_records()[0])
    with pytest.raises(DatasetFormatError, match=r"longmemeval_s\.json: \$: expected a list, got object$"):
        load_longmemeval(path)


def test_longmemeval_malformed_fixture_names_the_turn() -> None:
    path = FIXTURES / "lme_bad_content.json"
    with pytest.raises(DatasetFormatError) as caught:
        load_longmemeval(path)
    assert (caught.value.path, caught.value.json_path, caught.value.problem) == (
        str(path),
        "$[1].haystack_sessions[0][1].content",
        "missing",
    )


def test_longmemeval_invalid_json_names_line_and_column() -> None:
    path = FIXTURES / "lme_bad_syntax.json"
    with pytest.raises(DatasetFormatError) as caught:
        load_longmemeval(path)
    # Line 3 is `   "question": "Where?" "answer": ...`: the missing comma is before column 25.
    assert str(caught.value) == f"{path}: $: invalid JSON at line 3, column 25: Expecting ',' delimiter"


def test_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_longmemeval(tmp_path / "longmemeval_m.json")


def test_non_utf8_file_names_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "longmemeval_s.json"
    path.write_bytes(b'[{"question": "caf\xe9"}]')
    with pytest.raises(DatasetFormatError, match=r"\$: not UTF-8 text \(byte 18\)$"):
        load_longmemeval(path)


# --- MSC ----------------------------------------------------------------------------------------


def test_msc_sample_converts_exactly() -> None:
    assert load_msc(MSC_SAMPLE) == MSC_EXPECTED


def test_msc_json_list_reads_like_json_lines(tmp_path: Path) -> None:
    records = [json.loads(line) for line in MSC_SAMPLE.read_text(encoding="utf-8").splitlines() if line.strip()]
    path = tmp_path / "msc_self_instruct.json"
    path.write_text(json.dumps(records, indent=2), encoding="utf-8")
    assert load_msc(path) == MSC_EXPECTED


def test_msc_single_pretty_printed_record_is_one_conversation(tmp_path: Path) -> None:
    record = {"dialog": [{"text": "Hello."}, {"text": "Hi."}], "question": "Who spoke first?", "answer": "Speaker 1"}
    path = tmp_path / "msc_one.json"
    path.write_text(json.dumps(record, indent=2), encoding="utf-8")
    (conversation,) = load_msc(path)
    assert conversation.sessions == (
        _session(1, "9:00 am on 1 January, 2023", ("Speaker 1", "Hello."), ("Speaker 2", "Hi.")),
    )
    assert conversation.questions[0].answer == "Speaker 1"


def test_msc_anchor_moves_every_session(tmp_path: Path) -> None:
    # 11:30 pm on 28 Feb 2024, +4 hours crosses into the leap day, +2 days into March.
    (conversation, _) = load_msc(MSC_SAMPLE, anchor=datetime(2024, 2, 28, 23, 30))
    assert [session.date_time for session in conversation.sessions] == [
        "11:30 pm on 28 February, 2024",
        "3:30 am on 29 February, 2024",
        "3:30 am on 2 March, 2024",
    ]


def test_format_date_time_uses_twelve_hour_clock() -> None:
    assert format_date_time(datetime(2023, 5, 8, 13, 56)) == "1:56 pm on 8 May, 2023"
    assert format_date_time(datetime(2023, 1, 1, 0, 5)) == "12:05 am on 1 January, 2023"
    assert format_date_time(datetime(2023, 12, 31, 12, 0)) == "12:00 pm on 31 December, 2023"


def test_time_units_and_session_start_times() -> None:
    assert time_unit_length("hours") == timedelta(hours=1)
    assert time_unit_length(" Week ") == timedelta(days=7)
    assert time_unit_length("months") == timedelta(days=30)
    assert time_unit_length("year") == timedelta(days=365)
    with pytest.raises(ValueError, match="unknown time unit 'fortnights'"):
        time_unit_length("fortnights")
    anchor = datetime(2023, 1, 1, 9, 0)
    assert session_start_times([], anchor) == [anchor]
    assert session_start_times([timedelta(hours=4), timedelta(days=2)], anchor) == [
        anchor,
        datetime(2023, 1, 1, 13, 0),
        datetime(2023, 1, 3, 13, 0),
    ]


def test_msc_question_types() -> None:
    assert MSC_CATEGORY_NAMES == {1: "deep-memory-retrieval"}


def test_msc_record_without_question_or_previous_sessions(tmp_path: Path) -> None:
    path = _write(tmp_path, "msc_session_1.json", [{"dialog": [{"id": "Speaker 2", "text": "Hey."}]}])
    assert load_msc(path) == [
        Conversation(
            sample_id="msc-0",
            speaker_a="Speaker 1",
            speaker_b="Speaker 2",
            sessions=(_session(1, "9:00 am on 1 January, 2023", ("Speaker 2", "Hey.")),),
        )
    ]


def _msc_records() -> list[dict[str, Any]]:
    return [json.loads(line) for line in MSC_SAMPLE.read_text(encoding="utf-8").splitlines() if line.strip()]


MSC_MALFORMED = [
    (_delete((0, "dialog")), "$[0].dialog: missing"),
    (_delete((0, "previous_dialogs", 1, "dialog", 2, "text")), "$[0].previous_dialogs[1].dialog[2].text: missing"),
    (_set((0, "previous_dialogs", 0, "time_num"), -4), "$[0].previous_dialogs[0].time_num: negative time gap -4"),
    (
        _set((0, "previous_dialogs", 0, "time_num"), "4"),
        "$[0].previous_dialogs[0].time_num: expected a number, got string",
    ),
    (_delete((1, "previous_dialogs", 0, "time_unit")), "$[1].previous_dialogs[0].time_unit: missing"),
    (
        _set((0, "dialog", 1, "id"), "Speaker 3"),
        "$[0].dialog[1].id: expected 'Speaker 1' or 'Speaker 2', got 'Speaker 3'",
    ),
    (_set((0, "previous_dialogs"), {"dialog": []}), "$[0].previous_dialogs: expected a list, got object"),
    (_delete((0, "self_instruct", "A")), "$[0].self_instruct.A: missing"),
    (_set((0, "self_instruct", "B"), ""), "$[0].self_instruct.B: empty string"),
    (_delete((1, "answer")), "$[1].answer: missing"),
    (
        _set((1, "previous_dialogs", 0, "dialog", 0, "persona_text"), ["I own a bakery."]),
        "$[1].previous_dialogs[0].dialog[0].persona_text: expected a string, got list",
    ),
    (_set((1,), "not a record"), "$[1]: expected an object, got string"),
]


@pytest.mark.parametrize(("mutate", "expected"), MSC_MALFORMED)
def test_msc_malformed_field_names_file_and_json_path(
    tmp_path: Path, mutate: Callable[[list[Any]], None], expected: str
) -> None:
    records = _msc_records()
    mutate(records)
    path = _write(tmp_path, "msc_self_instruct.json", records)
    with pytest.raises(DatasetFormatError) as caught:
        load_msc(path)
    assert str(caught.value) == f"{path}: {expected}"


def test_msc_json_lines_errors_name_the_line(tmp_path: Path) -> None:
    lines = MSC_SAMPLE.read_text(encoding="utf-8").splitlines()
    # The fixture's record 1 is on line 3 (line 2 is blank).
    lines[2] = lines[2].replace('"time_unit": "Week"', '"time_unit": "moons"')
    path = tmp_path / "msc_self_instruct.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DatasetFormatError) as caught:
        load_msc(path)
    assert caught.value.json_path == "line 3: $.previous_dialogs[0].time_unit"
    assert caught.value.problem.startswith("unknown time unit 'moons'; expected one of seconds, minutes, hours")


def test_msc_invalid_json_line_names_line_and_column() -> None:
    path = FIXTURES / "msc_bad_syntax.jsonl"
    with pytest.raises(DatasetFormatError) as caught:
        load_msc(path)
    # Line 2 is `{"dialog": [{"id": "Speaker 1", "text": "Hi" "there"}]}`: "there" starts at column 46.
    assert str(caught.value) == f"{path}: line 2: $: invalid JSON at line 2, column 46: Expecting ',' delimiter"


def test_msc_malformed_fixture_names_the_time_unit() -> None:
    path = FIXTURES / "msc_bad_time_unit.json"
    with pytest.raises(DatasetFormatError) as caught:
        load_msc(path)
    assert caught.value.json_path == "$[1].previous_dialogs[1].time_unit"
    assert caught.value.problem == (
        "unknown time unit 'fortnights'; expected one of seconds, minutes, hours, days, weeks, months, years"
    )


def test_empty_records_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "msc.jsonl"
    path.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=r"msc\.jsonl: \$: empty file: no records$"):
        read_json_records(path)


# --- Both datasets and the registry -------------------------------------------------------------


@pytest.mark.parametrize(("kind", "path"), [("longmemeval", LME_SAMPLE), ("msc", MSC_SAMPLE)])
def test_loaded_conversations_keep_pipeline_invariants(kind: str, path: Path) -> None:
    conversations = load_dataset(kind, path)
    assert len(conversations) == 2
    assert len({conversation.sample_id for conversation in conversations}) == 2
    for conversation in conversations:
        assert_pipeline_invariants(conversation)


def test_registry_dispatches_and_forwards_keywords() -> None:
    assert load_dataset("longmemeval", LME_SAMPLE) == LME_EXPECTED
    assert load_dataset("msc", str(MSC_SAMPLE)) == MSC_EXPECTED
    shifted = load_dataset("msc", MSC_SAMPLE, anchor=datetime(2023, 1, 2, 9, 0))
    assert shifted[1].sessions[1].date_time == "9:00 am on 9 January, 2023"
    with pytest.raises(TypeError, match="exclude_categories"):
        load_dataset("longmemeval", LME_SAMPLE, exclude_categories=())


def test_registry_rejects_unknown_kind() -> None:
    with pytest.raises(ValueError, match=r"data.kind: unknown 'locomo10'; memr1's are knowledge_update, locomo, longmemeval, msc"):
        load_dataset("locomo10", LME_SAMPLE)
    with pytest.raises(ValueError, match="unknown 'msc_v0.1'"):
        category_names("msc_v0.1")
    with pytest.raises(ValueError, match="module memr1.datasets.errors defines no SPEC"):
        category_names("memr1.datasets.errors")


def test_a_dataset_of_ones_own_is_its_module_and_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One module with a loader and its SPEC, named by its path: what `data.kind=my_data.sets` reads.
    (tmp_path / "my_data").mkdir()
    (tmp_path / "my_data" / "__init__.py").write_text("")
    (tmp_path / "my_data" / "sets.py").write_text(
        "from memr1.datasets.longmemeval import load_longmemeval\n"
        "from memr1.datasets.registry import DatasetSpec\n"
        "SPEC = DatasetSpec('my set', load_longmemeval, {1: 'recall'}, 'my labels', False, 'bring it')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert category_names("my_data.sets") == {1: "recall"}
    assert load_dataset("my_data.sets", LME_SAMPLE) == load_dataset("longmemeval", LME_SAMPLE)


def test_registry_category_names() -> None:
    assert category_names("longmemeval")[14] == "multi-session_abs"
    assert category_names("msc") == {1: "deep-memory-retrieval"}


def test_registry_loads_locomo_with_its_category_filter(tmp_path: Path) -> None:
    locomo = pytest.importorskip("memr1.datasets.locomo")
    sample = {
        "sample_id": "conv-1",
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Bo",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a dog."},
                {"speaker": "Bo", "dia_id": "D1:2", "text": "What is its name?"},
            ],
        },
        "observation": {"session_1_observation": {"Ann": [["Ann adopted a dog.", "D1:1"]]}},
        "qa": [
            {"question": "What did Ann adopt?", "answer": "a dog", "evidence": ["D1:1"], "category": 1},
            {"question": "What did Bo adopt?", "adversarial_answer": "a cat", "evidence": ["D1:2"], "category": 5},
        ],
    }
    path = _write(tmp_path, "locomo10.json", [sample])
    (default,) = load_dataset("locomo", path)
    assert [question.question for question in default.questions] == ["What did Ann adopt?"]
    assert load_dataset("locomo", path) == locomo.load_locomo(path)
    (everything,) = load_dataset("locomo", path, exclude_categories=())
    assert [question.category for question in everything.questions] == [1, 5]
    assert category_names("locomo")[1] == "single-hop"
