"""The agents' prompts (snapshots) and parsers (hand-written outputs and expected results).

Snapshots: each rendering is compared with a file in tests/snapshots/. A missing file is written and
the test fails saying so; review the new file, then run again. To change a prompt on purpose, delete
its snapshot and run twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memr1.agents import answer as answer_module
from memr1.agents import manager as manager_module
from memr1.agents.answer import AnswerAgent, AnswerParse
from memr1.agents.lenient_json import JSONInvalid, JSONTruncated, find_json_object
from memr1.agents.manager import ManagerAgent, temp_id_map
from memr1.types import Fact, MemoryEntry, MemoryOp, OpKind

SNAPSHOTS = Path(__file__).parent / "snapshots"

FACT = Fact(
    text="Andrew adopted another dog,\nScout",
    speaker="Andrew",
    dia_ids=("D4:7", "D4:9"),
    session=4,
    date_time="1:14 pm on 25 May, 2023",
)
CANDIDATES = (
    MemoryEntry(
        id="mem-buddy",
        text="Andrew adopted a dog named Buddy",
        speaker="Andrew",
        timestamp="2:01 pm on 3 April, 2023",
    ),
    MemoryEntry(id="mem-hike", text="Andrew likes hiking", speaker="Andrew"),
    MemoryEntry(id="mem-job", text="Andrew works as\n  a nurse", speaker="Andrew"),
)
QUESTION = "When did Andrew\nadopt Scout?"
MEMORIES = {
    "Andrew": [
        MemoryEntry(
            id="a1",
            text="Andrew adopted a dog named Buddy",
            speaker="Andrew",
            timestamp="2:01 pm on 3 April, 2023",
        ),
        MemoryEntry(
            id="a2",
            text="Andrew adopted Scout\nlast week",
            speaker="Andrew",
            timestamp="1:14 pm on 25 May, 2023",
        ),
    ],
    "Audrey": [
        MemoryEntry(id="b1", text="Audrey has four dogs", speaker="Audrey", timestamp=""),
    ],
}


def render(messages: list[dict[str, str]]) -> str:
    return "".join(f"=== {message['role']} ===\n{message['content']}\n" for message in messages)


def check_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        pytest.fail(f"snapshot {path} was missing and has been written: review it and run again")
    assert text == path.read_text(encoding="utf-8"), f"rendering differs from snapshot {path}"


# --- prompts --------------------------------------------------------------------------------------


def test_manager_prompt_snapshot() -> None:
    check_snapshot("manager_messages.txt", render(ManagerAgent().build_messages(FACT, CANDIDATES)))


def test_manager_prompt_without_candidates_snapshot() -> None:
    check_snapshot(
        "manager_messages_no_candidates.txt", render(ManagerAgent().build_messages(FACT, []))
    )


def test_answer_prompt_snapshot() -> None:
    check_snapshot(
        "answer_messages_distill.txt", render(AnswerAgent().build_messages(QUESTION, MEMORIES))
    )


def test_answer_prompt_without_distillation_snapshot() -> None:
    agent = AnswerAgent(distill=False, max_answer_words=5)
    check_snapshot("answer_messages_direct.txt", render(agent.build_messages(QUESTION, MEMORIES)))


def test_manager_prompt_lists_candidates_under_temporary_ids_one_per_line() -> None:
    user = ManagerAgent().build_messages(FACT, CANDIDATES)[-1]["content"]
    assert user == (
        "Memories:\n"
        "0: Andrew adopted a dog named Buddy\n"
        "1: Andrew likes hiking\n"
        "2: Andrew works as a nurse\n"
        "New fact: Andrew adopted another dog, Scout"
    )
    assert "mem-buddy" not in user


def test_manager_example_exchange_parses_to_its_own_update() -> None:
    buddy = [MemoryEntry(id="real-0", text="Andrew adopted a dog named Buddy", speaker="Andrew")]
    op = ManagerAgent().parse(manager_module.MANAGER_EXAMPLE_REPLY, FACT, buddy)
    assert (op.kind, op.target_id, op.text) == (
        OpKind.UPDATE,
        "real-0",
        "Andrew adopted two dogs, Buddy and Scout",
    )


def test_answer_prompt_lists_each_speaker_with_timestamps() -> None:
    user = AnswerAgent().build_messages(QUESTION, MEMORIES)[-1]["content"]
    assert user.startswith(
        "Memories of Andrew:\n"
        "[2:01 pm on 3 April, 2023] Andrew adopted a dog named Buddy\n"
        "[1:14 pm on 25 May, 2023] Andrew adopted Scout last week\n"
        "\n"
        "Memories of Audrey:\n"
        "[unknown date] Audrey has four dogs\n"
        "\n"
        "Question: When did Andrew adopt Scout?\n"
    )
    assert user.endswith('Then write "**Answer:**" and the answer in at most 6 words.')


def test_answer_prompt_without_distillation_asks_for_no_selection() -> None:
    user = AnswerAgent(distill=False).build_messages(QUESTION, MEMORIES)[-1]["content"]
    assert "Relevant memories" not in user and "**Answer:**" not in user
    assert user.endswith("Answer in at most 6 words, with no explanation.")


def test_bad_prompt_inputs_name_the_problem() -> None:
    blank = Fact(text="  ", speaker="Andrew", dia_ids=("D1:2",), session=1, date_time="")
    with pytest.raises(ValueError, match=r"\('D1:2',\): text is empty"):
        ManagerAgent().build_messages(blank, CANDIDATES)
    with pytest.raises(ValueError, match="question is empty"):
        AnswerAgent().build_messages(" \n", MEMORIES)
    with pytest.raises(ValueError, match="max_answer_words must be at least 1, got 0"):
        AnswerAgent(max_answer_words=0)


# --- Manager parser -------------------------------------------------------------------------------


def manager_op(
    kind: OpKind, text: str = "", target_id: str | None = None, format_error: str | None = None
) -> MemoryOp:
    """The op `parse` should return for FACT: the fact's speaker, date-time and dia_ids attached."""
    return MemoryOp(
        kind=kind,
        text=text,
        target_id=target_id,
        speaker="Andrew",
        timestamp="1:14 pm on 25 May, 2023",
        provenance=("D4:7", "D4:9"),
        format_error=format_error,
    )


def parse_op(text: str) -> MemoryOp:
    """How the schema is read: with add_text="model", where an ADD's text is read too."""
    return ManagerAgent(add_text="model").parse(text, FACT, CANDIDATES)


def test_temp_id_map_follows_candidate_order() -> None:
    assert temp_id_map(CANDIDATES) == {"0": "mem-buddy", "1": "mem-hike", "2": "mem-job"}
    assert temp_id_map([]) == {}


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        pytest.param(
            '{"memory": [{"id": "0", "text": "Andrew adopted two dogs, Buddy and Scout", '
            '"event": "UPDATE", "old_memory": "Andrew adopted a dog named Buddy"}]}',
            manager_op(OpKind.UPDATE, "Andrew adopted two dogs, Buddy and Scout", "mem-buddy"),
            id="buddy-scout-update-maps-temp-id-0",
        ),
        pytest.param(
            '{"memory": [{"id": "2", "text": "Andrew quit nursing", "event": "DELETE"}]}',
            manager_op(OpKind.DELETE, "", "mem-job"),
            id="delete-maps-temp-id-2",
        ),
        pytest.param(
            '{"memory": [{"id": "7", "text": "Andrew adopted Scout", "event": "ADD"}]}',
            manager_op(OpKind.ADD, "Andrew adopted Scout"),
            id="add-ignores-id",
        ),
        pytest.param(
            '{"memory": [{"id": "0", "text": "Andrew adopted a dog named Buddy", '
            '"event": "NONE"}]}',
            manager_op(OpKind.NOOP, "", "mem-buddy"),
            id="none-is-a-valid-noop-naming-the-memory-judged-equal",
        ),
        pytest.param(
            '{"memory": [{"id": "9", "event": "NONE"}, {"id": "2", "event": "NONE"}]}',
            manager_op(OpKind.NOOP, "", "mem-job"),
            id="none-naming-no-memory-shown-is-still-a-noop-and-the-next-none-names-it",
        ),
        pytest.param(
            'Here is the update:\n```json\n{"memory": [{"id": "1", "text": "Andrew likes hiking '
            'with Scout", "event": "UPDATE"}]}\n```\nLet me know!',
            manager_op(OpKind.UPDATE, "Andrew likes hiking with Scout", "mem-hike"),
            id="fenced-with-chatter",
        ),
        pytest.param(
            "The {old} memory: {'memory': [{'id': 1, 'text': 'Andrew\\'s dog \"Scout\"', "
            "'event': 'update',},],}",
            manager_op(OpKind.UPDATE, 'Andrew\'s dog "Scout"', "mem-hike"),
            id="single-quotes-trailing-commas-int-id-lowercase-event-braces-in-chatter",
        ),
        pytest.param(
            '{"memory": [{"event": "NONE"}, {"id": "0", "text": "Andrew has two dogs", '
            '"event": "UPDATE"}, {"event": "DELETE"}]}',
            manager_op(OpKind.UPDATE, "Andrew has two dogs", "mem-buddy"),
            id="first-entry-that-is-not-none-wins-later-ones-unread",
        ),
        pytest.param(
            '{"memory": {"text": "  Andrew adopted\\n Scout ", "event": "ADD"}}',
            manager_op(OpKind.ADD, "Andrew adopted Scout"),
            id="memory-as-one-entry-text-on-one-line",
        ),
        pytest.param(
            '{"id": "0", "event": "Delete"}',
            manager_op(OpKind.DELETE, "", "mem-buddy"),
            id="bare-entry",
        ),
        pytest.param(
            '{"memory": [{"event": "NOOP"}, {"event": "none"}]}',
            manager_op(OpKind.NOOP),
            id="all-none",
        ),
        pytest.param(
            '{"memory": [{"id": "0", "text": "Andrew adopted two dogs", "event": "UPDA',
            manager_op(OpKind.NOOP, format_error="truncated_json"),
            id="truncated",
        ),
        pytest.param(
            '{"memory": [{"id": "5", "text": "Andrew has a cat", "event": "UPDATE"}]}',
            manager_op(OpKind.NOOP, format_error="unknown_id"),
            id="unknown-temp-id",
        ),
        pytest.param(
            '{"memory": [{"id": "mem-buddy", "event": "DELETE"}]}',
            manager_op(OpKind.NOOP, format_error="unknown_id"),
            id="real-id-is-not-a-temp-id",
        ),
        pytest.param(
            '{"memory": [{"text": "Andrew has a cat", "event": "UPDATE"}]}',
            manager_op(OpKind.NOOP, format_error="missing_id"),
            id="update-without-id",
        ),
        pytest.param(
            '{"memory": [{"id": "0", "text": "x", "event": "MODIFY"}]}',
            manager_op(OpKind.NOOP, format_error="unknown_event"),
            id="bad-event",
        ),
        pytest.param(
            '{"memory": [{"id": "0", "text": "x"}]}',
            manager_op(OpKind.NOOP, format_error="missing_event"),
            id="missing-event",
        ),
        pytest.param(
            '{"memory": [{"text": "   ", "event": "ADD"}]}',
            manager_op(OpKind.NOOP, format_error="empty_text"),
            id="add-blank-text",
        ),
        pytest.param(
            '{"memory": [{"id": "0", "event": "UPDATE"}]}',
            manager_op(OpKind.NOOP, format_error="empty_text"),
            id="update-without-text",
        ),
        pytest.param(
            '{"memory": [{"text": ["Andrew"], "event": "ADD"}]}',
            manager_op(OpKind.NOOP, format_error="wrong_type"),
            id="text-is-a-list",
        ),
        pytest.param(
            '{"memory": [{"id": true, "event": "DELETE"}]}',
            manager_op(OpKind.NOOP, format_error="wrong_type"),
            id="id-is-a-bool",
        ),
        pytest.param(
            '{"memory": [{"id": 0.0, "event": "DELETE"}]}',
            manager_op(OpKind.NOOP, format_error="wrong_type"),
            id="id-is-a-float",
        ),
        pytest.param(
            '{"memory": [{"event": 3}]}',
            manager_op(OpKind.NOOP, format_error="wrong_type"),
            id="event-is-int",
        ),
        pytest.param(
            '{"memory": ["ADD"]}',
            manager_op(OpKind.NOOP, format_error="wrong_type"),
            id="entry-is-a-string",
        ),
        pytest.param(
            '{"memory": "ADD"}',
            manager_op(OpKind.NOOP, format_error="wrong_type"),
            id="memory-is-a-string",
        ),
        pytest.param(
            '{"memory": [{"event": "garbage"}, {"text": "Scout", "event": "ADD"}]}',
            manager_op(OpKind.NOOP, format_error="unknown_event"),
            id="malformed-entry-before-the-chosen-one",
        ),
        pytest.param(
            '{"memory": []}', manager_op(OpKind.NOOP, format_error="empty_memory"), id="empty-list"
        ),
        pytest.param(
            '{"memories": [{"event": "ADD", "text": "x"}]}',
            manager_op(OpKind.NOOP, format_error="missing_memory"),
            id="wrong-key",
        ),
        pytest.param(
            "ADD: Andrew adopted Scout", manager_op(OpKind.NOOP, format_error="no_json"), id="prose"
        ),
        pytest.param(
            '[{"memory": 1} oops',
            manager_op(OpKind.NOOP, format_error="wrong_type"),
            id="list-around-object",
        ),
        pytest.param(
            '{"memory": [{"id": "0", "event": "DELETE"} {"event": "ADD", "text": "x"}]}',
            manager_op(OpKind.NOOP, format_error="no_json"),
            id="missing-comma-never-reads-the-nested-object",
        ),
        pytest.param(
            '{memory: [{"event": "ADD", "text": "x"}]}',
            manager_op(OpKind.ADD, "x"),
            id="unreadable-brace-before-the-entry-is-skipped",
        ),
        pytest.param("", manager_op(OpKind.NOOP, format_error="no_json"), id="empty"),
    ],
)
def test_manager_parse(output: str, expected: MemoryOp) -> None:
    assert parse_op(output) == expected


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        pytest.param(
            '{"memory": [{"id": "7", "text": "Andrew adopted Scout", "event": "ADD"}]}',
            manager_op(OpKind.ADD, FACT.text),
            id="add-stores-the-fact-not-a-rewrite",
        ),
        pytest.param(
            '{"memory": [{"id": "0", "text": "Andrew adopted a dog named Buddy", "event": "ADD"}]}',
            manager_op(OpKind.ADD, FACT.text),
            id="add-stores-the-fact-not-a-copied-memory",
        ),
        pytest.param('{"memory": [{"event": "ADD"}]}', manager_op(OpKind.ADD, FACT.text), id="add-without-text"),
        pytest.param(
            '{"memory": [{"text": ["Andrew"], "event": "ADD"}]}', manager_op(OpKind.ADD, FACT.text), id="add-text-unread"
        ),
        pytest.param(
            '{"memory": [{"id": "0", "text": "Andrew adopted two dogs, Buddy and Scout", "event": "UPDATE"}]}',
            manager_op(OpKind.UPDATE, "Andrew adopted two dogs, Buddy and Scout", "mem-buddy"),
            id="update-writes-the-model-text",
        ),
        pytest.param(
            '{"memory": [{"id": "0", "event": "UPDATE"}]}',
            manager_op(OpKind.NOOP, format_error="empty_text"),
            id="update-without-text-is-malformed",
        ),
        pytest.param(
            '{"memory": [{"event": "garbage"}, {"event": "ADD"}]}',
            manager_op(OpKind.NOOP, format_error="unknown_event"),
            id="malformed-entry-before-the-add",
        ),
        pytest.param('{"memory": [{"event": "NONE"}]}', manager_op(OpKind.NOOP), id="none"),
    ],
)
def test_manager_add_stores_the_fact_by_default(output: str, expected: MemoryOp) -> None:
    assert ManagerAgent().parse(output, FACT, CANDIDATES) == expected


def test_manager_add_text_is_checked() -> None:
    with pytest.raises(ValueError, match="add_text: 'both' is not one of"):
        ManagerAgent(add_text="both")


def test_manager_parse_with_no_candidates_rejects_every_target() -> None:
    op = ManagerAgent().parse('{"memory": [{"id": "0", "event": "DELETE"}]}', FACT, [])
    assert op == manager_op(OpKind.NOOP, format_error="unknown_id")


def test_manager_format_errors_are_listed_once() -> None:
    reasons = manager_module.MANAGER_FORMAT_ERRORS
    assert len(set(reasons)) == len(reasons) == 10
    assert "truncated_json" in reasons and "unknown_id" in reasons


# --- lenient JSON reader --------------------------------------------------------------------------


def test_lenient_json_reads_python_literals_and_raw_newlines() -> None:
    assert find_json_object("x {'a': [True, None, -1.5e2, \"b\\u00e9\"], 'c': 'l1\nl2'} y") == {
        "a": [True, None, -150.0, "bé"],
        "c": "l1\nl2",
    }


def test_lenient_json_escaped_backslash_before_closing_single_quote() -> None:
    assert find_json_object("{'a': 'x\\\\'}") == {"a": "x\\"}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"a": 1', JSONTruncated),
        ('{"a": "b\\', JSONTruncated),
        ('{"a": 01}', JSONInvalid),
        ('{"a": NaN}', JSONInvalid),
        ('{"a": 1 /* c */}', JSONInvalid),
        ('{"a": ' + "9" * 5000 + "}", JSONInvalid),
        ("[" * 10_000, JSONInvalid),
        ('{"a": ' + "[" * 10_000, JSONInvalid),
        ("no braces", JSONInvalid),
    ],
)
def test_lenient_json_rejects(text: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        find_json_object(text)


# --- Answer parser --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        pytest.param(
            "**Relevant memories:**\n"
            "- [1:14 pm on 25 May, 2023] Andrew adopted Scout last week\n"
            "2. [2:01 pm on 3 April, 2023] **Andrew adopted a dog named Buddy**\n"
            "\n"
            "**Answer:** The week before 25 May 2023.",
            AnswerParse(
                "The week before 25 May 2023",
                [
                    "[1:14 pm on 25 May, 2023] Andrew adopted Scout last week",
                    "[2:01 pm on 3 April, 2023] Andrew adopted a dog named Buddy",
                ],
            ),
            id="paper-format",
        ),
        pytest.param(
            "Answer: Buddy\n**Relevant memories:** [x] Andrew has dogs\n"
            '*Final Answer*: "Scout"\nthat is all',
            AnswerParse("Scout", ["[x] Andrew has dogs"]),
            id="last-marker-wins-first-line-only-heading-with-content",
        ),
        pytest.param(
            "Andrew adopted Scout in May.\nANSWER:\n\n  __May 2023__!  \n",
            AnswerParse("May 2023", ["Andrew adopted Scout in May."]),
            id="no-heading-answer-on-next-line",
        ),
        pytest.param(
            "Relevant memories:\n[x] Andrew hikes\nHe likes hiking.\n",
            AnswerParse("He likes hiking", ["[x] Andrew hikes"], "missing_answer_marker"),
            id="missing-marker-falls-back-to-last-line",
        ),
        pytest.param(
            "**Relevant memories:**\n[x] a\n**Answer:**  **  \n",
            AnswerParse("", ["[x] a"], "empty_answer"),
            id="empty-after-marker",
        ),
        pytest.param("  \n\t ", AnswerParse("", [], "empty_output"), id="blank"),
        pytest.param(
            "**Relevant memories:**\n**Answer:** Paris", AnswerParse("Paris", [], "missing_memory_list"), id="no-memory-listed"
        ),
        pytest.param(
            "My answers: none\nReanswer: no",
            AnswerParse("Reanswer: no", ["My answers: none"], "missing_answer_marker"),
            id="answer-must-be-a-word",
        ),
    ],
)
def test_answer_parse(output: str, expected: AnswerParse) -> None:
    assert AnswerAgent().parse(output) == expected


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        pytest.param(
            " 'Paris,\nFrance.' ", AnswerParse("Paris, France"), id="whole-output-on-one-line"
        ),
        pytest.param("I think so.\n**Answer:** Paris", AnswerParse("Paris"), id="marker-optional"),
        pytest.param("**", AnswerParse("", [], "empty_answer"), id="only-markup"),
        pytest.param("", AnswerParse("", [], "empty_output"), id="empty"),
    ],
)
def test_answer_parse_without_distillation(output: str, expected: AnswerParse) -> None:
    assert AnswerAgent(distill=False).parse(output) == expected


def test_answer_format_errors_are_listed_once() -> None:
    reasons = answer_module.ANSWER_FORMAT_ERRORS
    assert sorted(reasons) == ["empty_answer", "empty_output", "missing_answer_marker", "missing_memory_list"]
