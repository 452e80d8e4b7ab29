"""The Memory Manager's prompt and parser.

The Manager sees one new fact and the k existing memories most similar to it, and answers with one
operation in Mem0's schema::

    {"memory": [{"id": "<temporary id>", "text": "...", "event": "ADD|UPDATE|DELETE|NONE",
                 "old_memory": "..."}]}

The memories are shown under temporary ids "0".."k-1" (their position in `candidates`), so the model
cannot invent or misspell a real id; `parse` maps the temporary id back to `MemoryEntry.id`.

Reading the output (`ManagerAgent.parse`):
- the first complete JSON object in the text is read leniently (`lenient_json`): fences, chatter,
  single quotes and trailing commas are fine, a truncated object is not;
- `{"memory": [...]}` is the schema; `{"memory": {...}}` (one entry without the list) and a bare
  entry `{"event": ...}` are read as a one-entry list;
- the entries are read in order and the first one whose event is not NONE is the operation; the
  entries after it are not read. An entry that is malformed before that point makes the whole output
  a format error: the model said something it did not mean to be ignored;
- only NONE entries: a NOOP with no format error (the model chose to change nothing), whose
  `target_id` is the memory the first NONE names as equal to the fact, when it names one shown;
- events are case-insensitive and NOOP is read as NONE; an id may be a string or an integer;
  `old_memory` is informational and never read;
- anything else is `MemoryOp(OpKind.NOOP, format_error=<one of MANAGER_FORMAT_ERRORS>)`.

What an ADD stores (`add_text`): the prompt defines an ADD's "text" as the new fact, so by default
(`"fact"`) an ADD stores the fact as given and its "text" is not read: the Manager decides the
operation, and only UPDATE writes text of its own (the merge). Mem0, and the paper after it, store
the model's text (`"model"`); a small model's copy is not the fact: of the 2,127 ADDs of the lift's
SFT Manager (SmolLM2-135M) on the LoCoMo test split, 48% wrote other text (a lossy rewrite, or
another memory of the conversation copied from the prompt), and its banks scored 3.75 F1 under
ADD-all's (paired over the 1,307 questions, 95% interval [2.39, 5.13]; docs/cpu_lift.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memr1.agents.lenient_json import JSONTruncated, find_json_object
from memr1.agents.text import one_line
from memr1.types import ADD_TEXTS, Fact, MemoryEntry, MemoryOp, OpKind

MANAGER_SYSTEM_PROMPT = """\
You manage a memory bank. Compare a new fact with the existing memories and choose one operation:
- ADD: the fact is new. "text" is the fact.
- UPDATE: the fact adds detail to a memory about the same thing. "id" is that memory's id, "text" \
merges the old and new details, "old_memory" is the old text.
- DELETE: the fact contradicts a memory. "id" is that memory's id.
- NONE: the fact is already in the memories.
Reply with JSON only:
{"memory": [{"id": "<id>", "text": "<memory>", "event": "ADD|UPDATE|DELETE|NONE", \
"old_memory": "<old text>"}]}"""

MANAGER_USER_TEMPLATE = """\
Memories:
{memories}
New fact: {fact}"""

MEMORY_LINE_TEMPLATE = "{temp_id}: {text}"
NO_MEMORIES = "(none)"

# One worked exchange, sent as a user / assistant turn pair before the real one: a small model
# copies a format it has seen itself produce more reliably than one it was told about.
MANAGER_EXAMPLE_USER = MANAGER_USER_TEMPLATE.format(
    memories=MEMORY_LINE_TEMPLATE.format(temp_id="0", text="Andrew adopted a dog named Buddy"),
    fact="Andrew adopted another dog, Scout",
)
MANAGER_EXAMPLE_REPLY = (
    '{"memory": [{"id": "0", "text": "Andrew adopted two dogs, Buddy and Scout", '
    '"event": "UPDATE", "old_memory": "Andrew adopted a dog named Buddy"}]}'
)

# Format-error reasons, the only values `MemoryOp.format_error` takes here; RL logs count them.
NO_JSON = "no_json"
TRUNCATED_JSON = "truncated_json"
MISSING_MEMORY = "missing_memory"
EMPTY_MEMORY = "empty_memory"
WRONG_TYPE = "wrong_type"
MISSING_EVENT = "missing_event"
UNKNOWN_EVENT = "unknown_event"
MISSING_ID = "missing_id"
UNKNOWN_ID = "unknown_id"
EMPTY_TEXT = "empty_text"
MANAGER_FORMAT_ERRORS: tuple[str, ...] = (
    NO_JSON,
    TRUNCATED_JSON,
    MISSING_MEMORY,
    EMPTY_MEMORY,
    WRONG_TYPE,
    MISSING_EVENT,
    UNKNOWN_EVENT,
    MISSING_ID,
    UNKNOWN_ID,
    EMPTY_TEXT,
)

_EVENTS = {
    "ADD": OpKind.ADD,
    "UPDATE": OpKind.UPDATE,
    "DELETE": OpKind.DELETE,
    "NONE": OpKind.NOOP,
    "NOOP": OpKind.NOOP,
}


class _FormatError(Exception):
    """Internal: carries one of MANAGER_FORMAT_ERRORS out of the nested checks."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def temp_id_map(candidates: Sequence[MemoryEntry]) -> dict[str, str]:
    """Temporary id shown to the model ("0", "1", ...) -> real `MemoryEntry.id`, in order."""
    return {str(position): entry.id for position, entry in enumerate(candidates)}


class ManagerAgent:
    """Turns (fact, similar memories) into chat messages, and the model's reply into a MemoryOp.

    add_text: what an ADD stores, one of ADD_TEXTS (the module's docstring says why "fact" is the default).
    """

    def __init__(self, add_text: str = "fact") -> None:
        if add_text not in ADD_TEXTS:
            raise ValueError(f"add_text: {add_text!r} is not one of {ADD_TEXTS}")
        self.add_text = add_text

    def build_messages(self, fact: Fact, candidates: Sequence[MemoryEntry]) -> list[dict[str, str]]:
        """System + user messages for `fact` against `candidates` (the k most similar memories)."""
        if not fact.text.strip():
            raise ValueError(f"fact from {fact.dia_ids}: text is empty")
        lines = [
            MEMORY_LINE_TEMPLATE.format(temp_id=temp_id, text=one_line(entry.text))
            for temp_id, entry in zip(temp_id_map(candidates), candidates, strict=True)
        ]
        user = MANAGER_USER_TEMPLATE.format(
            memories="\n".join(lines) if lines else NO_MEMORIES, fact=one_line(fact.text)
        )
        return [
            {"role": "system", "content": MANAGER_SYSTEM_PROMPT},
            {"role": "user", "content": MANAGER_EXAMPLE_USER},
            {"role": "assistant", "content": MANAGER_EXAMPLE_REPLY},
            {"role": "user", "content": user},
        ]

    def parse(self, text: str, fact: Fact, candidates: Sequence[MemoryEntry]) -> MemoryOp:
        """The operation the model's `text` describes; a NOOP with a `format_error` if malformed.

        Never raises on model output. The op carries the fact's speaker, date-time (as timestamp)
        and dia_ids (as provenance); UPDATE / DELETE target the real id of the chosen candidate.
        """
        try:
            kind, op_text, target_id = _read_operation(text, temp_id_map(candidates), read_add_text=self.add_text == "model")
            format_error = None
        except _FormatError as error:
            kind, op_text, target_id, format_error = OpKind.NOOP, "", None, error.reason
        if kind is OpKind.ADD and self.add_text == "fact":
            op_text = fact.text  # as ADD-all stores it
        return MemoryOp(
            kind=kind,
            text=op_text,
            target_id=target_id,
            speaker=fact.speaker,
            timestamp=fact.date_time,
            provenance=fact.dia_ids,
            format_error=format_error,
        )


def _read_operation(text: str, ids: dict[str, str], read_add_text: bool) -> tuple[OpKind, str, str | None]:
    """(kind, text, real target id) of the first actionable entry; an ADD's text is "" unless
    `read_add_text`. Raises _FormatError."""
    if not isinstance(text, str):
        raise _FormatError(WRONG_TYPE)
    try:
        document = find_json_object(text)
    except JSONTruncated:
        raise _FormatError(TRUNCATED_JSON) from None
    except ValueError:
        raise _FormatError(NO_JSON) from None
    equal_to = None  # the memory the first NONE entry names, if it names one shown
    for entry in _entries(document):
        kind, op_text, target_id = _read_entry(entry, ids, read_add_text)
        if kind is not OpKind.NOOP:
            return kind, op_text, target_id
        equal_to = equal_to or target_id
    return OpKind.NOOP, "", equal_to


def _entries(document: dict[str, Any]) -> list[Any]:
    if "memory" not in document:
        if "event" in document:
            return [document]
        raise _FormatError(MISSING_MEMORY)
    entries = document["memory"]
    if isinstance(entries, dict):
        return [entries]
    if not isinstance(entries, list):
        raise _FormatError(WRONG_TYPE)
    if not entries:
        raise _FormatError(EMPTY_MEMORY)
    return entries


def _read_entry(entry: Any, ids: dict[str, str], read_add_text: bool) -> tuple[OpKind, str, str | None]:
    if not isinstance(entry, dict):
        raise _FormatError(WRONG_TYPE)
    kind = _event(entry)
    if kind is OpKind.NOOP:  # its id, informational, is the memory judged equal: kept when it is one shown
        temp_id = entry.get("id")
        return kind, "", ids.get(str(temp_id).strip()) if isinstance(temp_id, (str, int)) and not isinstance(temp_id, bool) else None
    if kind is OpKind.ADD:
        return kind, _text(entry) if read_add_text else "", None
    target_id = _target(entry, ids)
    if kind is OpKind.DELETE:
        return kind, "", target_id
    return kind, _text(entry), target_id


def _event(entry: dict[str, Any]) -> OpKind:
    if "event" not in entry:
        raise _FormatError(MISSING_EVENT)
    event = entry["event"]
    if not isinstance(event, str):
        raise _FormatError(WRONG_TYPE)
    kind = _EVENTS.get(event.strip().upper())
    if kind is None:
        raise _FormatError(UNKNOWN_EVENT)
    return kind


def _text(entry: dict[str, Any]) -> str:
    text = entry.get("text")
    if text is None:
        raise _FormatError(EMPTY_TEXT)
    if not isinstance(text, str):
        raise _FormatError(WRONG_TYPE)
    text = one_line(text)
    if not text:
        raise _FormatError(EMPTY_TEXT)
    return text


def _target(entry: dict[str, Any], ids: dict[str, str]) -> str:
    temp_id = entry.get("id")
    if temp_id is None:
        raise _FormatError(MISSING_ID)
    # bool is an int subclass, but `true` is no id.
    if isinstance(temp_id, int) and not isinstance(temp_id, bool):
        temp_id = str(temp_id)
    if not isinstance(temp_id, str):
        raise _FormatError(WRONG_TYPE)
    real_id = ids.get(temp_id.strip())
    if real_id is None:
        raise _FormatError(UNKNOWN_ID)
    return real_id
