"""The Answer Agent's prompt and parser.

The agent sees a question and the memories retrieved from each speaker's bank (the paper: 30 per
speaker), each as `[timestamp] text` under the speaker's name. With distillation (the paper's agent)
it first copies the memories that help under a heading, then answers after `**Answer:**` in a few
words; without it (the ablation) it answers at once.

Reading the output (`AnswerAgent.parse`), never raising:
- the answer follows the LAST answer marker: `**Answer:**`, `Answer:`, `*answer*:`, `Final answer:`
  ... (case-insensitive, any bold / italics). The first non-empty line after it is the answer, with
  markdown, quotes and surrounding punctuation stripped;
- with distillation, a missing marker falls back to the last non-empty line (format error
  `missing_answer_marker`); the selected memories are the lines between the `Relevant memories`
  heading (or the start of the text when the model skipped it) and the answer, bullets stripped; a
  well-formed answer with no memory line before it is the format error `missing_memory_list` (the
  distilling agent skipped its distillation);
- without distillation the marker is optional: absent, the whole output (on one line) is the answer;
- an empty output or an empty answer after the marker gives "" and a format error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from memr1.agents.text import one_line
from memr1.types import MemoryEntry

ANSWER_SYSTEM_PROMPT = """\
You answer questions about a long conversation between two people, using memories taken from it. \
Each memory starts with the date it was recorded; when memories disagree, trust the most recent."""

SPEAKER_MEMORIES_TEMPLATE = """\
Memories of {speaker}:
{memories}"""

MEMORY_LINE_TEMPLATE = "[{timestamp}] {text}"
NO_TIMESTAMP = "unknown date"
NO_MEMORIES = "(none)"

TIME_INSTRUCTION = """\
If the question is about time, turn relative times ("yesterday", "last year") into dates using the \
date of the memory."""

DISTILL_USER_TEMPLATE = """\
{memories}

Question: {question}

{time_instruction}
First write "**Relevant memories:**" and copy the memories that help answer the question, one per \
line. Then write "**Answer:**" and the answer in at most {max_words} words."""

DIRECT_USER_TEMPLATE = """\
{memories}

Question: {question}

{time_instruction}
Answer in at most {max_words} words, with no explanation."""

# Format-error reasons, the only values `AnswerParse.format_error` takes; RL logs count them.
EMPTY_OUTPUT = "empty_output"
MISSING_ANSWER_MARKER = "missing_answer_marker"
EMPTY_ANSWER = "empty_answer"
MISSING_MEMORY_LIST = "missing_memory_list"
ANSWER_FORMAT_ERRORS: tuple[str, ...] = (EMPTY_OUTPUT, MISSING_ANSWER_MARKER, EMPTY_ANSWER, MISSING_MEMORY_LIST)

# "answer", then any bold / italics markup, then a colon; `\b` keeps "answers:" and "reanswer:" out.
_ANSWER_MARKER = re.compile(r"\banswer\b[ \t*_]*:", re.IGNORECASE)
_HEADING = re.compile(r"\brelevant\s+memor(?:y|ies)\b[ \t*_]*:?", re.IGNORECASE)
_BULLET = re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)])\s+")
_BOLD = re.compile(r"\*\*|__")
# Stripped from both ends of an answer: whitespace, markdown, quotes (typographic ones too),
# sentence punctuation.
_ANSWER_EDGES = " \t*_`\"'\u201c\u201d\u2018\u2019\u00ab\u00bb.,;:!?"


@dataclass(frozen=True)
class AnswerParse:
    """The answer (one line, maybe empty), the memory lines the agent selected, and why the output
    was malformed (one of ANSWER_FORMAT_ERRORS) or None."""

    answer: str
    selected: list[str] = field(default_factory=list)
    format_error: str | None = None


class AnswerAgent:
    """Turns (question, memories per speaker) into messages, and the reply into an AnswerParse."""

    def __init__(self, distill: bool = True, max_answer_words: int = 6) -> None:
        if max_answer_words < 1:
            raise ValueError(f"max_answer_words must be at least 1, got {max_answer_words}")
        self.distill = distill
        self.max_answer_words = max_answer_words

    def build_messages(
        self, question: str, memories: Mapping[str, Sequence[MemoryEntry]]
    ) -> list[dict[str, str]]:
        """System + user messages; `memories` maps each speaker to their retrieved memories, listed
        in the mapping's order (the caller chooses how many: the paper uses 30 per speaker)."""
        if not question.strip():
            raise ValueError("question is empty")
        blocks = [
            SPEAKER_MEMORIES_TEMPLATE.format(
                speaker=one_line(speaker), memories=_memory_lines(entries)
            )
            for speaker, entries in memories.items()
        ]
        template = DISTILL_USER_TEMPLATE if self.distill else DIRECT_USER_TEMPLATE
        user = template.format(
            memories="\n\n".join(blocks) if blocks else NO_MEMORIES,
            question=one_line(question),
            time_instruction=TIME_INSTRUCTION,
            max_words=self.max_answer_words,
        )
        return [
            {"role": "system", "content": ANSWER_SYSTEM_PROMPT},
            {"role": "user", "content": user},
        ]

    def parse(self, text: str) -> AnswerParse:
        """The answer and selected memories in the model's `text`; see the module docstring."""
        if not isinstance(text, str) or not text.strip():
            return AnswerParse("", [], EMPTY_OUTPUT)
        lines = text.splitlines()
        marker = _last_marker(lines)
        if not self.distill:
            answer = _clean_answer(text) if marker is None else _answer_after(lines, marker)
            return AnswerParse(answer, [], None if answer else EMPTY_ANSWER)
        if marker is None:
            fallback = _last_answer_line(lines)
            selected = _selected(lines, fallback)
            return AnswerParse(_clean_answer(lines[fallback]), selected, MISSING_ANSWER_MARKER)
        answer = _answer_after(lines, marker)
        selected = _selected(lines, marker[0])
        if not answer:
            return AnswerParse(answer, selected, EMPTY_ANSWER)
        return AnswerParse(answer, selected, None if selected else MISSING_MEMORY_LIST)


def memory_line(entry: MemoryEntry) -> str:
    """One memory as the prompt shows it: `[timestamp] text`."""
    return MEMORY_LINE_TEMPLATE.format(timestamp=one_line(entry.timestamp) or NO_TIMESTAMP, text=one_line(entry.text))


def _memory_lines(entries: Sequence[MemoryEntry]) -> str:
    if not entries:
        return NO_MEMORIES
    return "\n".join(memory_line(entry) for entry in entries)


def _last_marker(lines: list[str]) -> tuple[int, int] | None:
    """(line index, column just past it) of the last answer marker, or None."""
    for index in range(len(lines) - 1, -1, -1):
        matches = list(_ANSWER_MARKER.finditer(lines[index]))
        if matches:
            return index, matches[-1].end()
    return None


def _answer_after(lines: list[str], marker: tuple[int, int]) -> str:
    """The first line after the marker that is not empty once cleaned ("" when there is none)."""
    index, end = marker
    for line in [lines[index][end:], *lines[index + 1 :]]:
        answer = _clean_answer(line)
        if answer:
            return answer
    return ""


def _last_answer_line(lines: list[str]) -> int:
    """Index of the last line with something left after cleaning; the last line when none has."""
    for index in range(len(lines) - 1, -1, -1):
        if _clean_answer(lines[index]):
            return index
    return len(lines) - 1


def _selected(lines: list[str], end: int) -> list[str]:
    """The memory lines after the heading (or from the start) and before the answer's line `end`."""
    section = lines[:end]
    for index, line in enumerate(section):
        heading = _HEADING.search(line)
        if heading:
            section = [line[heading.end() :], *section[index + 1 :]]
            break
    selected = []
    for line in section:
        memory = one_line(_BOLD.sub("", _BULLET.sub("", line))).strip(" *_")
        if memory:
            selected.append(memory)
    return selected


def _clean_answer(text: str) -> str:
    return one_line(_BOLD.sub("", text)).strip(_ANSWER_EDGES)
