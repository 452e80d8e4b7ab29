"""Fact extraction by an LLM: the memory pipeline's first step when a dataset ships no facts.

The model sees one dialogue turn (with the turn before it, for context) and lists the facts it states
about its speaker, one per line, or NONE. The parser never raises: whatever lines it finds are facts,
minus bullets, numbering and chatter; an empty or NONE output yields no facts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memr1.agents.text import one_line
from memr1.types import Fact, Turn

EXTRACTOR_SYSTEM_PROMPT = """\
You extract facts for a personal memory. From the last message, list the facts it states about its \
speaker (events, plans, preferences, people, dates), one short sentence per line, each naming the \
speaker. Turn relative times into dates using the message date. If there is nothing worth \
remembering, reply NONE."""

EXTRACTOR_USER_TEMPLATE = """\
{context}[{date_time}] {speaker}: {text}

Facts:"""

CONTEXT_TEMPLATE = "Previous message: {speaker}: {text}\n"

_BULLET = re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)])\s*")
_NONE = re.compile(r"^\W*none\W*$", re.IGNORECASE)
_CHATTER = re.compile(r"^(?:facts?|here are|sure|the facts?)\b.*:\s*$", re.IGNORECASE)
MIN_FACT_CHARS = 8


class FactExtractor:
    """Builds the extraction prompt for a turn and parses the model's reply into `Fact`s."""

    def __init__(self, max_facts_per_turn: int = 5) -> None:
        self.max_facts_per_turn = max_facts_per_turn

    def build_messages(self, turn: Turn, previous: Turn | None = None) -> list[dict[str, str]]:
        context = CONTEXT_TEMPLATE.format(speaker=previous.speaker, text=one_line(previous.text)) if previous else ""
        text = one_line(turn.text) + (f" [shares an image: {one_line(turn.image_caption)}]" if turn.image_caption else "")
        user = EXTRACTOR_USER_TEMPLATE.format(context=context, date_time=turn.date_time, speaker=turn.speaker, text=text)
        return [{"role": "system", "content": EXTRACTOR_SYSTEM_PROMPT}, {"role": "user", "content": user}]

    def parse(self, text: str, turn: Turn) -> list[Fact]:
        facts: list[Fact] = []
        for line in text.splitlines() if isinstance(text, str) else ():
            candidate = _BULLET.sub("", line).strip().strip('"').strip()
            if not candidate or _CHATTER.match(candidate):
                continue
            if _NONE.match(candidate):
                break
            if len(candidate) >= MIN_FACT_CHARS:
                facts.append(Fact(candidate, turn.speaker, (turn.dia_id,), turn.session, turn.date_time))
            if len(facts) == self.max_facts_per_turn:
                break
        return facts


def turn_pairs(turns: Sequence[Turn]) -> list[tuple[Turn, Turn | None]]:
    """Each turn with the one before it in the same session (None at a session's start)."""
    pairs: list[tuple[Turn, Turn | None]] = []
    for index, turn in enumerate(turns):
        previous = turns[index - 1] if index and turns[index - 1].session == turn.session else None
        pairs.append((turn, previous))
    return pairs
