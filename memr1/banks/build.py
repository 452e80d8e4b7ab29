"""Build one memory bank per conversation by walking its facts (or turns) in dialogue order.

For each item the speaker's most similar memories are retrieved, the memory policy decides one
operation, and the bank applies it. Banks are persisted (Milvus) and a small progress file records how
many items each bank has consumed, so a rerun skips finished banks and a killed build resumes where
it stopped.

Crash safety: the progress file is written after the bank, so the one window is "operation applied,
progress not yet written". Every ADD / UPDATE / DELETE advances the bank's persisted `step` by one,
so on resume a bank whose step is ahead of the recorded one has consumed that many more items, and
the build skips them instead of applying them twice.

What a build did (`bank_operations`): the writes are counted from the bank's own revisions, exact
across kills; the decisions that wrote nothing (a malformed model output, an operation the bank
refused: both NOOPs) are tallied in the progress file, saved with the items they were decided on, so an
item decided again after a kill is counted once. Each item's decision is also logged before it is
written, one JSON line (`DecisionLog`), so that two Managers' choices can be set side by side fact by
fact (`memr1.pipeline.decisions`); an item decided again after a kill is logged again, and the later
line wins.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from memr1.faults import fault_point
from memr1.memory import InvalidOpError, MemoryBank
from memr1.banks.policies import MemoryPolicy
from memr1.timing import StageTimer
from memr1.types import Conversation, Fact

log = logging.getLogger(__name__)

# Sources read from the dataset itself; LLM extraction is `memr1.pipeline.extraction`.
MEMORY_SOURCES = ("observation", "raw_turns")


def observation_facts(conversation: Conversation) -> list[Fact]:
    """The dataset's facts, in the order they become knowable (`Conversation.facts_in_dialogue_order`)."""
    return conversation.facts_in_dialogue_order()


def raw_turn_facts(conversation: Conversation) -> list[Fact]:
    """Every turn as a memory, "speaker: text" (LoCoMo-RAG); a shared image's caption is kept."""
    facts = []
    for turn in conversation.turns():
        text = f"{turn.speaker}: {turn.text}"
        if turn.image_caption:
            text += f" [shares an image: {turn.image_caption}]"
        facts.append(Fact(text, turn.speaker, (turn.dia_id,), turn.session, turn.date_time))
    return facts


def memory_items(conversation: Conversation, source: str) -> list[Fact]:
    """The facts a bank is built from, in dialogue order: the dataset's facts or its raw turns."""
    if source == "observation":
        if not conversation.facts:
            raise ValueError(
                f"conversation {conversation.sample_id} has no facts: memory.source=observation needs a "
                "dataset with per-turn facts (LoCoMo); use memory=raw_turns"
            )
        return observation_facts(conversation)
    if source == "raw_turns":
        return raw_turn_facts(conversation)
    raise ValueError(f"memory.source: unknown source {source!r}; choose one of {MEMORY_SOURCES}")


def bank_name(conversation_id: str) -> str:
    """The bank (its scope in the store) of a conversation id: letters, digits and underscores, as
    when each bank was a Milvus collection of that name (`MemoryBank.open` moves such a bank in)."""
    return "bank_" + re.sub(r"[^0-9A-Za-z_]", "_", conversation_id)


# Per bank in the progress file: items consumed, the bank step after them, and the NOOPs that were
# not the model's choice: `malformed` outputs (no operation parsed) and ops the bank `rejected`.
NOOP_TALLIES = ("malformed", "rejected")
# The Manager's operations, in the order reports show them: the writes, then NOOP.
WRITE_KINDS = ("ADD", "UPDATE", "DELETE")
OPERATION_KINDS = (*WRITE_KINDS, "NOOP")


@dataclass
class BuildProgress:
    """Items consumed per bank, the bank step after the last recorded one and the NOOP tallies, kept in
    a JSON file (`path` None: banks in memory, which a later process rebuilds from the first item)."""

    path: Path | None

    def load(self) -> dict[str, dict[str, int]]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            return json.loads(self.path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{self.path}: unreadable build progress ({error}); delete it to rebuild") from None

    def save(self, state: dict[str, dict[str, int]]) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
        os.replace(tmp, self.path)


@dataclass
class DecisionLog:
    """Each item's decision, appended as a JSON line beside the progress file (`path` None: banks in
    memory, nothing kept): {"conversation", "item" (its index in the bank's items), "event" (ADD, UPDATE,
    DELETE or NOOP), "malformed" (the model's reply did not parse: a NOOP), "rejected" (the bank refused
    the operation: a second line, a NOOP)}. The fact's text stays out: it is the dataset's, and the dataset
    gives it back by index."""

    path: Path | None

    @staticmethod
    def beside(progress_file: Path | None) -> Path | None:
        """`X.progress.json` -> `X.decisions.jsonl`."""
        if progress_file is None:
            return None
        return progress_file.with_name(progress_file.name.removesuffix(".progress.json") + ".decisions.jsonl")

    def append(self, rows: Sequence[dict]) -> None:
        if self.path is None or not rows:
            return
        with self.path.open("a") as out:
            out.writelines(json.dumps(row, sort_keys=True) + "\n" for row in rows)

    def load(self) -> list[dict] | None:
        """The latest decision of each item, in (conversation, item) order; None without a log."""
        if self.path is None or not self.path.exists():
            return None
        latest: dict[tuple[str, int], dict] = {}
        for number, line in enumerate(self.path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                latest[(row["conversation"], row["item"])] = row
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                # A line cut by a kill mid-write is the last one; its item is decided again on resume.
                log.warning("%s:%d: unreadable decision (%s), skipped", self.path, number, error)
        return [latest[key] for key in sorted(latest)]


def build_banks(
    items: Mapping[str, Sequence[Fact]],
    banks: Mapping[str, MemoryBank],
    policy: MemoryPolicy,
    progress_file: Path | None,
    timer: StageTimer | None = None,
    on_advance: Callable[[int], None] | None = None,
) -> dict[str, int]:
    """Bring every bank (keyed by conversation id) up to date over its `items` (facts in dialogue order,
    see `memory_items`); return the number of items per bank.

    Conversations advance in lockstep, one item each per round, so a model policy decides one batch
    per round (banks are independent; items within a bank stay sequential). `on_advance(n)` reports
    items consumed, for progress bars.
    """
    timer = timer or StageTimer()
    tracker = BuildProgress(progress_file)
    decisions = DecisionLog(DecisionLog.beside(progress_file))
    state = tracker.load()
    cursor: dict[str, int] = {}
    # A progress file written before the tallies were kept leaves them unknown (None) for its banks.
    tallies: dict[str, dict[str, int | None]] = {}
    for conversation_id, bank in banks.items():
        recorded = state.get(bank.name, {"items": 0, "step": 0, **dict.fromkeys(NOOP_TALLIES, 0)})
        tallies[conversation_id] = {key: recorded.get(key) for key in NOOP_TALLIES}
        if bank.step < recorded["step"]:
            raise ValueError(
                f"{progress_file}: bank {bank.name!r} is at step {bank.step} but its build was recorded at "
                f"step {recorded['step']}: the bank was replaced; delete the progress file to rebuild"
            )
        # Ops applied after the last save: each advanced the step once and consumed one item.
        cursor[conversation_id] = recorded["items"] + (bank.step - recorded["step"])
        if on_advance:
            on_advance(cursor[conversation_id])

    def record(conversation_id: str) -> None:
        bank = banks[conversation_id]
        known = {key: value for key, value in tallies[conversation_id].items() if value is not None}
        state[bank.name] = {"items": cursor[conversation_id], "step": bank.step, **known}

    def tally(conversation_id: str, key: str) -> None:
        if tallies[conversation_id][key] is not None:
            tallies[conversation_id][key] += 1

    if policy.num_candidates == 0:  # no retrieval, no model: ADD everything left in one bulk write
        for conversation_id, bank in banks.items():
            remaining = items[conversation_id][cursor[conversation_id] :]
            if remaining:
                with timer.time("manager", items=len(remaining)):
                    ops = policy.decide([conversation_id] * len(remaining), remaining, [()] * len(remaining), [bank] * len(remaining))
                    decisions.append([_decision(conversation_id, cursor[conversation_id] + n, "ADD") for n in range(len(remaining))])
                    bank.add_many(ops)
                fault_point("bank_write")
                cursor[conversation_id] += len(remaining)
                if on_advance:
                    on_advance(len(remaining))
            record(conversation_id)
        tracker.save(state)
        return {cid: len(items[cid]) for cid in banks}

    rejected: list[str] = []
    while True:
        active = [cid for cid in banks if cursor[cid] < len(items[cid])]
        if not active:
            break
        facts = [items[cid][cursor[cid]] for cid in active]
        candidates = []
        for cid, fact in zip(active, facts):
            with timer.time("fact_retrieval"):
                candidates.append(banks[cid].search(fact.text, speaker=fact.speaker, k=policy.num_candidates))
        with timer.time("manager", items=len(facts)):
            ops = policy.decide(active, facts, candidates, [banks[cid] for cid in active])
        # Logged before the writes: an item written, but not yet recorded when a kill comes, is skipped
        # on resume, and its decision is in the log already.
        decisions.append([_decision(cid, cursor[cid], op.kind.value, malformed=op.format_error is not None) for cid, op in zip(active, ops)])
        for cid, op in zip(active, ops):
            if op.format_error is not None:
                tally(cid, "malformed")
            try:
                banks[cid].apply(op)
            except InvalidOpError as error:  # a well-parsed op the bank refuses (say, an oversized text)
                rejected.append(f"{cid}: {error}")
                tally(cid, "rejected")
                decisions.append([_decision(cid, cursor[cid], "NOOP", rejected=True)])
            cursor[cid] += 1
            record(cid)
        fault_point("bank_write")
        tracker.save(state)
        if on_advance:
            on_advance(len(active))
    tracker.save(state)
    for message in rejected:
        log.warning("memory op rejected, treated as NOOP: %s", message)
    return {cid: len(items[cid]) for cid in banks}


def _decision(conversation_id: str, item: int, event: str, malformed: bool = False, rejected: bool = False) -> dict:
    return {"conversation": conversation_id, "item": item, "event": event, "malformed": malformed, "rejected": rejected}


def bank_operations(banks: Mapping[str, MemoryBank], items: Mapping[str, Sequence[Fact]], progress_file: Path | None) -> dict[str, int | None]:
    """What the finished build of `banks` did with their `items`, summed over the banks: the writes
    (ADD / UPDATE / DELETE) from the banks' revisions, NOOP the items that wrote nothing, and of those
    the `malformed` and `rejected` ones from the progress file (None where it does not know them: banks
    in memory, or a file written before they were tallied, unless the banks hold no NOOP). Counted the
    same whichever process built them."""
    ledger = BuildProgress(progress_file).load()
    totals: dict[str, int | None] = dict.fromkeys((*OPERATION_KINDS, *NOOP_TALLIES), 0)
    for conversation_id, bank in banks.items():
        writes = bank.revision_counts()
        counts: dict[str, int | None] = {kind: writes[kind] for kind in WRITE_KINDS}
        counts["NOOP"] = len(items[conversation_id]) - sum(writes[kind] for kind in WRITE_KINDS)
        recorded = ledger.get(bank.name, {})
        # A bank without NOOPs has neither kind, whatever its progress file knows.
        counts.update({key: 0 if counts["NOOP"] == 0 else recorded.get(key) for key in NOOP_TALLIES})
        for key, value in counts.items():
            totals[key] = None if value is None or totals[key] is None else totals[key] + value
    return totals


def describe_operations(operations: Mapping[str, int | None]) -> str:
    """'ADD 2710 (90.1%), UPDATE 30 (1.0%), DELETE 2 (0.1%), NOOP 265 (8.8%; malformed 12, rejected 0)'."""
    total = max(sum(operations[kind] or 0 for kind in OPERATION_KINDS), 1)
    writes = [f"{kind} {operations[kind]} ({100.0 * operations[kind] / total:.1f}%)" for kind in WRITE_KINDS]
    causes = ", ".join(f"{key} {'unknown' if operations[key] is None else operations[key]}" for key in NOOP_TALLIES)
    return ", ".join(writes) + f", NOOP {operations['NOOP']} ({100.0 * operations['NOOP'] / total:.1f}%; {causes})"
