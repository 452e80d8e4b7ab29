"""Fuzzing the two parsers with a fixed seed: random and adversarial outputs never raise, and every
result keeps the invariants the pipeline relies on.

Manager: the kind is an OpKind; an UPDATE / DELETE targets a real candidate id; ADD / UPDATE texts
are non-empty single lines; a format error is one of MANAGER_FORMAT_ERRORS and comes with a bare
NOOP; garbage (no complete object in the text) always carries a format error.
Answer: the answer is a stripped single line; the selected memories are non-empty single lines; an
empty answer always carries a format error.

Runs in about two seconds.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from memr1.agents.answer import ANSWER_FORMAT_ERRORS, AnswerAgent, AnswerParse
from memr1.agents.lenient_json import find_json_object
from memr1.agents.manager import MANAGER_FORMAT_ERRORS, ManagerAgent
from memr1.types import Fact, MemoryEntry, MemoryOp, OpKind

SEED = 1_540
FACT = Fact(
    text="Andrew adopted Scout",
    speaker="Andrew",
    dia_ids=("D4:7",),
    session=4,
    date_time="1:14 pm on 25 May, 2023",
)
CANDIDATES = [
    MemoryEntry(id=f"real-{index}", text=f"memory {index}", speaker="Andrew") for index in range(3)
]
REAL_IDS = {entry.id for entry in CANDIDATES}

VALID_ENTRIES: list[dict[str, Any]] = [
    {
        "id": "0",
        "text": "Andrew adopted two dogs, Buddy and Scout",
        "event": "UPDATE",
        "old_memory": "Andrew adopted a dog named Buddy",
    },
    {"id": "1", "text": "Andrew likes hiking", "event": "DELETE"},
    {"id": "9", "text": "Andrew adopted Scout", "event": "ADD"},
    {"id": "2", "text": "Andrew works as a nurse", "event": "NONE"},
]
# Which fields each event needs, and the error their absence gives.
REQUIRED_FIELDS = {
    "UPDATE": {"id": "missing_id", "text": "empty_text", "event": "missing_event"},
    "DELETE": {"id": "missing_id", "event": "missing_event"},
    "ADD": {"text": "empty_text", "event": "missing_event"},
    "NONE": {"event": "missing_event"},
}
WRAPPERS: list[Callable[[str], str]] = [
    lambda body: body,
    lambda body: f"```json\n{body}\n```",
    lambda body: f"Sure! Here is the operation:\n{body}\nHope this helps.",
]
SOUP = [
    "{",
    "}",
    "[",
    "]",
    '"',
    "'",
    ":",
    ",",
    "\\",
    " ",
    "\n",
    '"memory"',
    '"event"',
    '"id"',
    '"text"',
    "'text'",
    '"ADD"',
    '"UPDATE"',
    '"DELETE"',
    '"NONE"',
    '"0"',
    '"1"',
    '"7"',
    "0",
    "-1",
    "1e999",
    "9" * 400,
    "true",
    "null",
    "None",
    "```json",
    "```",
    "\u2028",
    "\x00",
    "\ud800",
    "é",
    "**Answer:**",
    "Answer:",
    "answer",
    "**Relevant memories:**",
    "- ",
    "*",
    "_",
    ".",
    "\r\n",
]


# --- generators -----------------------------------------------------------------------------------


def random_unicode(rng: random.Random, length: int) -> str:
    """Mostly printable ASCII, some code points from anywhere (lone surrogates and controls too)."""
    return "".join(
        chr(rng.randrange(0x20, 0x7F)) if rng.random() < 0.7 else chr(rng.randrange(0x110000))
        for _ in range(length)
    )


def random_bytes_text(rng: random.Random, length: int) -> str:
    raw = bytes(rng.randrange(256) for _ in range(length))
    return raw.decode("utf-8", errors="replace") if rng.random() < 0.5 else raw.decode("latin-1")


def soup(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(SOUP) for _ in range(length))


def random_json(rng: random.Random, depth: int = 0) -> Any:
    """A random JSON value whose keys often come from the Manager's schema."""
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, 1, 2, -1, 10 ** rng.randrange(400), -(10 ** rng.randrange(40))])
    if kind == 3:
        return rng.choice([0.0, -0.0, 1.5, 1e308, -2.5e-300, rng.uniform(-1e6, 1e6)])
    if kind in (4, 5):
        return rng.choice(
            ["", "0", "1", "ADD", "update", "NONE", "MODIFY", " ", random_unicode(rng, 12)]
        )
    if kind == 6:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["memory", "event", "id", "text", "old_memory", random_unicode(rng, 5)]
    return {rng.choice(keys): random_json(rng, depth + 1) for _ in range(rng.randrange(5))}


def random_entry(rng: random.Random) -> dict[str, Any]:
    """A schema-shaped entry with values drawn near the edges of validity, some keys dropped."""
    entry = {
        "event": rng.choice(["ADD", "UPDATE", "DELETE", "NONE", "noop", " add ", "MODIFY", "", 1]),
        "id": rng.choice(["0", "2", " 1 ", "3", "-1", "real-0", 0, 2, 3, True, None, 1.0, ""]),
        "text": rng.choice(["Scout", " two\ndogs ", "", " ", "\n\t", "\u2028", None, 5, ["x"]]),
        "old_memory": random_json(rng),
    }
    return {key: value for key, value in entry.items() if rng.random() < 0.85}


def valid_manager_outputs() -> Iterator[tuple[str, str]]:
    """(output, its JSON body) for each valid entry in each wrapper."""
    for entry in VALID_ENTRIES:
        body = json.dumps({"memory": [entry]})
        for wrap in WRAPPERS:
            yield wrap(body), body


# --- invariants -----------------------------------------------------------------------------------


def parse_op(text: str, add_text: str = "model") -> MemoryOp:
    """The reader of the whole schema by default: with add_text="model" an ADD's text is read too."""
    return ManagerAgent(add_text=add_text).parse(text, FACT, CANDIDATES)


def check_op(op: MemoryOp) -> None:
    assert isinstance(op, MemoryOp) and isinstance(op.kind, OpKind)
    assert (op.speaker, op.timestamp, op.provenance) == (
        "Andrew",
        "1:14 pm on 25 May, 2023",
        ("D4:7",),
    )
    if op.format_error is not None:
        assert op.format_error in MANAGER_FORMAT_ERRORS
        assert (op.kind, op.text, op.target_id) == (OpKind.NOOP, "", None)
    if op.kind in (OpKind.UPDATE, OpKind.DELETE):
        assert op.target_id in REAL_IDS
    elif op.kind is OpKind.NOOP and op.format_error is None:  # a NONE may name the memory judged equal
        assert op.target_id is None or op.target_id in REAL_IDS
    else:
        assert op.target_id is None
    if op.kind in (OpKind.ADD, OpKind.UPDATE):
        assert op.text and op.text == " ".join(op.text.split())
    else:
        assert op.text == ""


def check_answer(parsed: AnswerParse, distill: bool) -> None:
    assert isinstance(parsed, AnswerParse) and isinstance(parsed.answer, str)
    assert len(parsed.answer.splitlines()) <= 1 and parsed.answer == parsed.answer.strip()
    assert parsed.format_error is None or parsed.format_error in ANSWER_FORMAT_ERRORS
    if not parsed.answer:
        assert parsed.format_error is not None
    assert all(
        isinstance(line, str) and line and len(line.splitlines()) == 1 for line in parsed.selected
    )
    if not distill:
        assert parsed.selected == []


# --- Manager --------------------------------------------------------------------------------------


def test_random_text_and_bytes_are_format_errors() -> None:
    rng = random.Random(SEED)
    for _ in range(1500):
        length = rng.choice([0, 1, 5, 40, 300])
        text = random_unicode(rng, length) if rng.random() < 0.5 else random_bytes_text(rng, length)
        op = parse_op(text)
        check_op(op)
        assert op.format_error is not None


def test_token_soup_keeps_the_invariants() -> None:
    rng = random.Random(SEED + 1)
    for _ in range(2000):
        check_op(parse_op(soup(rng, rng.randrange(1, 60))))


def test_random_json_documents_keep_the_invariants() -> None:
    rng = random.Random(SEED + 2)
    for _ in range(2000):
        document = rng.choice(
            [
                {"memory": [random_entry(rng) for _ in range(rng.randrange(1, 4))]},
                {"memory": random_json(rng)},
                random_json(rng),
            ]
        )
        rendered = json.dumps(document, ensure_ascii=rng.random() < 0.5)
        if rng.random() < 0.3:
            rendered = repr(document)
        check_op(parse_op(rng.choice(WRAPPERS)(rendered)))


def test_storing_the_fact_changes_only_what_an_add_stores() -> None:
    """add_text="fact" reads every output as "model" does, except an ADD's text: the ADDs store the
    fact, and an ADD whose text alone was malformed is an ADD of the fact."""
    rng = random.Random(SEED + 4)
    for _ in range(2000):
        document = {"memory": [random_entry(rng) for _ in range(rng.randrange(1, 4))]}
        output = rng.choice(WRAPPERS)(json.dumps(document))
        as_model, as_fact = parse_op(output), parse_op(output, add_text="fact")
        check_op(as_fact)
        if as_model.kind is OpKind.ADD:
            assert as_fact == replace(as_model, text=FACT.text), output
        elif as_fact.kind is OpKind.ADD:  # the model's ADD had a malformed text, which "fact" does not read
            assert as_model.format_error in ("empty_text", "wrong_type"), output
        else:
            assert as_fact == as_model, output


def test_every_truncation_of_a_valid_output_is_a_format_error() -> None:
    for output, body in valid_manager_outputs():
        start = output.index(body)
        for cut in range(start + len(body)):
            op = parse_op(output[:cut])
            check_op(op)
            assert op.format_error in ("truncated_json", "no_json"), output[:cut]
        check_op(parse_op(output))


@pytest.mark.parametrize("entry", VALID_ENTRIES, ids=lambda entry: entry["event"])
def test_each_key_deletion_gives_its_hand_written_result(entry: dict[str, Any]) -> None:
    assert parse_op(json.dumps({"memory": [entry]})).format_error is None
    assert parse_op(json.dumps({})).format_error == "missing_memory"
    for key in entry:
        damaged = {name: value for name, value in entry.items() if name != key}
        op = parse_op(json.dumps({"memory": [damaged]}))
        check_op(op)
        assert op.format_error == REQUIRED_FIELDS[entry["event"]].get(key), key


def test_type_swaps_of_required_fields_are_format_errors() -> None:
    rng = random.Random(SEED + 3)
    for _ in range(300):
        for entry in VALID_ENTRIES:
            for key in entry:
                value = random_json(rng)
                op = parse_op(json.dumps({"memory": [{**entry, key: value}]}))
                check_op(op)
                required = key in REQUIRED_FIELDS[entry["event"]]
                keeps_meaning = isinstance(value, str) or (
                    key == "id" and isinstance(value, int) and not isinstance(value, bool)
                )
                if required and not keeps_meaning:
                    assert op.format_error is not None, (entry, key, value)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"memory": [{"id": ' + "1" * 5000 + ', "event": "DELETE"}]}', "no_json"),
        ('{"memory": [{"id": 1e999, "event": "DELETE"}]}', "wrong_type"),
        ('{"memory": [{"id": -0, "event": "DELETE"}]}', None),
        ('{"memory": [{"id": 123456789012345678901234567890, "event": "DELETE"}]}', "unknown_id"),
        ('{"memory": ' + "[" * 5 + '{"event": "ADD", "text": "x"}' + "]" * 5 + "}", "wrong_type"),
        ('{"memory": ' + "{" * 50_000, "no_json"),
        ("[" * 50_000 + '{"event": "NONE"}', None),
        ('{"memory": [' + '{"event": "NONE"}, ' * 10_000 + "]}", None),
        ("{}" * 10_000, "missing_memory"),
        ('{"a":' * 40 + '{"event": "ADD", "text": "x"}', "truncated_json"),
    ],
    ids=[
        "huge-int-id",
        "inf-id",
        "minus-zero-id",
        "big-int-id",
        "nested-lists",
        "deep-braces",
        "deep-list-around-entry",
        "ten-thousand-nones",
        "many-empty-objects",
        "deep-unclosed",
    ],
)
def test_huge_and_deep_inputs(text: str, error: str | None) -> None:
    op = parse_op(text)
    check_op(op)
    assert op.format_error == error


def test_lenient_reader_agrees_with_json_on_strict_json() -> None:
    rng = random.Random(SEED + 4)
    for _ in range(2000):
        document = {str(index): random_json(rng) for index in range(rng.randrange(4))}
        text = json.dumps(document, ensure_ascii=rng.random() < 0.5)
        assert find_json_object(text) == json.loads(text)


def test_lenient_reader_reads_python_reprs() -> None:
    """repr() writes single quotes, True / None and escapes; printable text keeps it readable."""
    rng = random.Random(SEED + 5)
    alphabet = string.ascii_letters + string.digits + " '\"\\,:{}[]"
    for _ in range(2000):
        document = {
            "".join(rng.choices(alphabet, k=rng.randrange(6))): rng.choice(
                [
                    None,
                    True,
                    False,
                    rng.randrange(-5, 10**20),
                    "".join(rng.choices(alphabet, k=8)),
                    ["".join(rng.choices(alphabet, k=3)), 1.5],
                ]
            )
            for _ in range(rng.randrange(4))
        }
        assert find_json_object(repr(document)) == document


# --- Answer ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("distill", [True, False])
def test_random_answer_outputs_keep_the_invariants(distill: bool) -> None:
    rng = random.Random(SEED + 6)
    agent = AnswerAgent(distill=distill)
    for _ in range(2000):
        length = rng.choice([0, 1, 8, 80, 400])
        generator = rng.choice([random_unicode, random_bytes_text, soup])
        check_answer(agent.parse(generator(rng, length)), distill)


def test_answer_after_a_marker_survives_garbage_before_it() -> None:
    rng = random.Random(SEED + 7)
    agent = AnswerAgent()
    no_marker_soup = [token for token in SOUP if "nswer" not in token]
    for _ in range(2000):
        garbage = "".join(rng.choice(no_marker_soup) for _ in range(rng.randrange(30)))
        words = [
            "".join(rng.choices(string.ascii_letters + string.digits, k=rng.randrange(1, 8)))
            for _ in range(rng.randrange(1, 7))
        ]
        parsed = agent.parse(f"{garbage}\n**Answer:** {' '.join(words)}\n")
        check_answer(parsed, True)
        # garbage that leaves no memory line is a reply without its memory list
        assert parsed == AnswerParse(" ".join(words), parsed.selected, None if parsed.selected else "missing_memory_list")


def test_every_truncation_of_a_valid_answer() -> None:
    agent = AnswerAgent()
    output = (
        "**Relevant memories:**\n- [1:14 pm on 25 May, 2023] Andrew adopted Scout\n"
        "**Answer:** 25 May 2023"
    )
    answer_start = output.index("25 May 2023", output.index("**Answer:**"))
    for cut in range(len(output) + 1):
        parsed = agent.parse(output[:cut])
        check_answer(parsed, True)
        if cut <= answer_start:
            assert parsed.format_error is not None
        else:
            assert parsed.answer == output[answer_start:cut].strip()
            assert parsed.selected == ["[1:14 pm on 25 May, 2023] Andrew adopted Scout"]
