"""LLM fact extraction over whole conversations, cached so a rerun (or a killed run) redoes nothing.

Extraction does not depend on the bank, so every turn of every conversation is extracted in batches
up front; the facts of each turn are appended to a JSONL cache as soon as they exist.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from memr1.agents.extractor import FactExtractor, turn_pairs
from memr1.llm.engines import GenerationEngine
from memr1.llm.sampling import SamplingConfig
from memr1.timing import StageTimer
from memr1.types import Conversation, Fact


def _read_cache(path: Path) -> dict[tuple[str, str], list[Fact]]:
    cached: dict[tuple[str, str], list[Fact]] = {}
    if not path.exists():
        return cached
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
            facts = [Fact(f["text"], f["speaker"], tuple(f["dia_ids"]), f["session"], f["date_time"]) for f in row["facts"]]
            cached[(row["conversation_id"], row["dia_id"])] = facts
        except (json.JSONDecodeError, KeyError, TypeError):
            # A line cut short by a kill: that turn is extracted again.
            if number != len(lines):
                raise ValueError(f"{path}: line {number}: unreadable extraction cache entry; delete the file") from None
    return cached


def extract_facts(
    conversations: Sequence[Conversation],
    engine: GenerationEngine,
    cache_path: Path,
    extractor: FactExtractor | None = None,
    sampling: SamplingConfig | None = None,
    batch_size: int = 8,
    timer: StageTimer | None = None,
    on_advance: Callable[[int], None] | None = None,
) -> dict[str, list[Fact]]:
    """Facts per conversation id, in dialogue order, extracted by `engine` (greedy by default)."""
    extractor = extractor or FactExtractor()
    sampling = sampling or SamplingConfig(max_new_tokens=96, temperature=0.0)
    timer = timer or StageTimer()
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    cached = _read_cache(cache_path)
    todo = [
        (conversation.sample_id, turn, previous)
        for conversation in conversations
        for turn, previous in turn_pairs(list(conversation.turns()))
        if (conversation.sample_id, turn.dia_id) not in cached
    ]
    if on_advance:
        on_advance(sum(1 for c in conversations for _ in c.turns()) - len(todo))
    with cache_path.open("a") as out:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            with timer.time("fact_extraction", items=len(batch)):
                outputs = engine.generate([extractor.build_messages(turn, previous) for _, turn, previous in batch], sampling)
            for (conversation_id, turn, _), samples in zip(batch, outputs):
                facts = extractor.parse(samples[0].text, turn)
                cached[(conversation_id, turn.dia_id)] = facts
                out.write(json.dumps({
                    "conversation_id": conversation_id,
                    "dia_id": turn.dia_id,
                    "facts": [{"text": f.text, "speaker": f.speaker, "dia_ids": list(f.dia_ids), "session": f.session, "date_time": f.date_time} for f in facts],
                }) + "\n")
            out.flush()
            if on_advance:
                on_advance(len(batch))
    return {
        conversation.sample_id: [fact for turn in conversation.turns() for fact in cached[(conversation.sample_id, turn.dia_id)]]
        for conversation in conversations
    }
