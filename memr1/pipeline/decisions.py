"""Two Managers' decisions set side by side, fact by fact (`memr1 decisions REF RUN ...`).

An evaluation keeps what its banks' writer decided for each fact (`decisions.jsonl`, one row per
fact: conversation, item, event; `memr1.banks.build.DecisionLog`). Against a reference (the oracle,
whose every decision is the search's best with the split's questions), a Manager's agreement per
operation is the information-retrieval pair: of the facts it UPDATEd, how many the reference UPDATEd
too (precision), and of the facts the reference UPDATEd, how many it did (recall). Both Managers
decide each fact on their own banks as they stand, which differ once their decisions have: the pair
says whether a Manager acts on the facts that matter, not that it acts on the same memory.

`by_citation` counts one run's operations by what its facts are cited for: the categories of the
questions whose evidence holds the fact's turns, or "none" (chatter, a restatement, a value later
replaced), where an UPDATE can only overwrite what another question needs.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from memr1.banks.build import OPERATION_KINDS, memory_items
from memr1.types import Conversation, Question

DECISIONS = "decisions.jsonl"


@dataclass(frozen=True)
class Agreement:
    """One operation's agreement of a Manager with the reference over the facts both decided."""

    event: str
    reference: int  # facts the reference decided this way
    chosen: int  # facts the Manager decided this way
    agreed: int  # facts both decided this way

    @property
    def precision(self) -> float | None:
        return self.agreed / self.chosen if self.chosen else None

    @property
    def recall(self) -> float | None:
        return self.agreed / self.reference if self.reference else None

    def to_json(self) -> dict:
        return {"event": self.event, "reference": self.reference, "chosen": self.chosen, "agreed": self.agreed,
                "precision": self.precision, "recall": self.recall}


def read_decisions(run_dir: str | Path) -> dict[tuple[str, int], str]:
    """A run's decisions by (conversation, item): the event its banks' writer applied."""
    path = Path(run_dir) / DECISIONS
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no decisions kept (the run's banks were built before decisions were logged, or reused)")
    decisions = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
            event = row["event"]
            key = (row["conversation"], row["item"])
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ValueError(f"{path}:{number}: not a decision row ({error})") from None
        if event not in OPERATION_KINDS:
            raise ValueError(f"{path}:{number}: unknown event {event!r}; expected one of {OPERATION_KINDS}")
        decisions[key] = event
    return decisions


def agreement(reference: dict[tuple[str, int], str], decisions: dict[tuple[str, int], str]) -> tuple[list[Agreement], int]:
    """Per operation (ADD, UPDATE, DELETE, NOOP), the agreement of `decisions` with `reference` over the
    facts both decided; and how many facts only one of them decided (left out)."""
    shared = reference.keys() & decisions.keys()
    rows = [
        Agreement(
            event,
            reference=sum(reference[key] == event for key in shared),
            chosen=sum(decisions[key] == event for key in shared),
            agreed=sum(reference[key] == event == decisions[key] for key in shared),
        )
        for event in OPERATION_KINDS
    ]
    return rows, len(reference.keys() ^ decisions.keys())


def markdown(reference_name: str, name: str, rows: Sequence[Agreement], left_out: int) -> str:
    """A table: per operation, the reference's and the Manager's counts, both, precision and recall."""

    def share(value: float | None) -> str:
        return "-" if value is None else f"{100.0 * value:.1f}%"

    lines = [
        f"{name} against {reference_name}" + (f" ({left_out} facts decided by only one left out)" if left_out else ""),
        "",
        "| operation | reference | Manager | both | precision | recall |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {r.event} | {r.reference} | {r.chosen} | {r.agreed} | {share(r.precision)} | {share(r.recall)} |" for r in rows]
    return "\n".join(lines)


def by_citation(decisions: dict[tuple[str, int], str], conversations: Sequence[Conversation], source: str = "observation") -> dict[str, dict[str, int]]:
    """A run's operations counted by what cites each fact: the sorted categories of the questions whose
    evidence holds one of the fact's turns, joined by "+" ("1", "1+3"), or "none". Items are the banks'
    (`memory_items(conversation, source)`, the index `decisions.jsonl` keeps); a decided item that is no
    fact of `conversations` is refused."""
    facts = {conversation.sample_id: (conversation, memory_items(conversation, source)) for conversation in conversations}
    table: dict[str, Counter] = {}
    for (conversation_id, item), event in sorted(decisions.items()):
        if conversation_id not in facts or not 0 <= item < len(facts[conversation_id][1]):
            raise ValueError(f"decisions: conversation {conversation_id!r} item {item} is no fact of the data given")
        conversation, items = facts[conversation_id]
        table.setdefault(citation_key(conversation.questions, items[item].dia_ids), Counter())[event] += 1
    return {key: {event: counts.get(event, 0) for event in OPERATION_KINDS} for key, counts in sorted(table.items())}


def citation_key(questions: Iterable[Question], turns: Iterable[str]) -> str:
    """The sorted categories of the `questions` whose evidence holds one of `turns`, joined by "+"
    ("1", "1+3"), or "none"."""
    turns = set(turns)
    return "+".join(map(str, sorted({question.category for question in questions if turns & set(question.evidence)}))) or "none"


def citation_markdown(name: str, table: dict[str, dict[str, int]]) -> str:
    """A table: per kind of citation, the run's facts and each operation's count."""
    lines = [f"{name}: operations by the categories of the questions citing the fact", "",
             "| cited by | facts | " + " | ".join(OPERATION_KINDS) + " |", "|---|---:|" + "---:|" * len(OPERATION_KINDS)]
    lines += [f"| {key} | {sum(counts.values())} | " + " | ".join(str(counts[event]) for event in OPERATION_KINDS) + " |" for key, counts in table.items()]
    return "\n".join(lines)
