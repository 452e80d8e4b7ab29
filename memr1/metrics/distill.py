"""Distillation scored against evidence: did the memories the Answer Agent selected come from the turns
the question's answer rests on?

Each selected line (`AnswerParse.selected`) is matched to the retrieved memory it copies: equal text once
the `[timestamp]` prefix, case, punctuation and spacing are set aside, else the retrieved memory with the
highest token F1 against it when that is at least `MIN_MATCH_F1` (the model paraphrases a little); a line
that matches none was not copied from the prompt. With E the question's evidence dia_ids and a memory's
provenance the dia_ids it was taken from:

- recall = |E covered by the provenance of the matched memories| / |E|  (None when E is empty);
- precision = matched lines whose provenance meets E / all selected lines  (None when none were selected);
- retrieved = |E covered by the provenance of every retrieved memory| / |E|: recall's ceiling, set by retrieval.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from memr1.metrics.lexical import token_f1
from memr1.types import MemoryEntry

MIN_MATCH_F1 = 0.6
_TIMESTAMP = re.compile(r"^\s*\[[^\]]*\]\s*")
_NON_WORD = re.compile(r"[^\w\s]")


@dataclass(frozen=True)
class DistillScore:
    recall: float | None
    precision: float | None
    retrieved: float | None
    matched_ids: tuple[str | None, ...]  # per selected line: the memory it copies, None if none


def _normal(text: str) -> str:
    return " ".join(_NON_WORD.sub(" ", _TIMESTAMP.sub("", text).lower()).split())


def match_selected(selected: Sequence[str], retrieved: Sequence[MemoryEntry]) -> list[MemoryEntry | None]:
    """The retrieved memory each selected line copies (see the module docstring), or None."""
    by_text = {_normal(entry.text): entry for entry in retrieved}
    matches: list[MemoryEntry | None] = []
    for line in selected:
        text = _normal(line)
        entry = by_text.get(text)
        if entry is None and text:
            scored = [(token_f1(text, _normal(candidate.text)), candidate) for candidate in retrieved]
            best = max(scored, key=lambda pair: pair[0], default=(0.0, None))
            entry = best[1] if best[0] >= MIN_MATCH_F1 else None
        matches.append(entry)
    return matches


def _coverage(evidence: set[str], provenances: Iterable[Sequence[str]]) -> float | None:
    if not evidence:
        return None
    covered = set().union(*[set(p) for p in provenances]) & evidence
    return len(covered) / len(evidence)


def distillation_score(selected: Sequence[str], retrieved: Sequence[MemoryEntry], evidence: Sequence[str]) -> DistillScore:
    """Recall and precision of the `selected` lines against `evidence` (dia_ids), and the share of the
    evidence that `retrieved` held at all."""
    wanted = set(evidence)
    matches = match_selected(selected, retrieved)
    precision = None
    if selected:
        precision = sum(entry is not None and bool(set(entry.provenance) & wanted) for entry in matches) / len(selected)
    return DistillScore(
        recall=_coverage(wanted, [entry.provenance for entry in matches if entry is not None]),
        precision=precision,
        retrieved=_coverage(wanted, [entry.provenance for entry in retrieved]),
        matched_ids=tuple(entry.id if entry is not None else None for entry in matches),
    )
