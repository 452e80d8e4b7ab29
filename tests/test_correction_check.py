"""scripts/correction_check.py on a real `memr1.Memory` (Milvus Lite, the MiniLM embedder) whose two
agents are scripted: a Manager that UPDATEs the memory it is shown first with the new fact, and an
Answer Agent that answers with the first memory it reads. The scripted agents stand in for the
trained ones; under test are the script's case bookkeeping and its scoring rule."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from memr1.service.memory import Memory

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "correction_check.py"


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("correction_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class UpdatingManager:
    """UPDATEs the memory that names Denver with a new fact that names Portland; ADDs anything else."""

    name = "updating-manager"

    def complete(self, prompts, max_new_tokens):
        replies = []
        for prompt in prompts:
            memories, fact = prompt[-1]["content"].rsplit("New fact: ", 1)
            shown = [line.split(": ", 1) for line in memories.splitlines() if "Denver" in line]
            if "Portland" in fact and shown:
                replies.append('{"memory": [{"id": "%s", "text": "%s", "event": "UPDATE", "old_memory": "x"}]}' % (shown[0][0], fact.strip()))
            else:
                replies.append('{"memory": [{"id": "new", "text": "-", "event": "ADD"}]}')
        return replies


class FirstMemoryAnswerer:
    """Answers with the first of Portland, Denver, hiking that the memories it is shown name."""

    name = "first-memory-answerer"

    def complete(self, prompts, max_new_tokens):
        user = prompts[0][-1]["content"]
        return [next(city for city in ("Portland", "Denver", "hiking") if city in user)]


def test_the_scoring_rule_by_kind(check):
    replaced, accumulated, cancelled = (next(case for case in check.CASES if case.kind == kind) for kind in ("replaced", "accumulated", "cancelled"))
    assert check.answered_with_correction(replaced, replaced.new) and not check.answered_with_correction(replaced, f"{replaced.old} and {replaced.new}")
    assert not check.answered_with_correction(replaced, replaced.old)
    assert check.answered_with_correction(accumulated, f"{accumulated.new} and {accumulated.old}")
    assert not check.answered_with_correction(accumulated, accumulated.new)
    assert check.answered_with_correction(cancelled, "No") and not check.answered_with_correction(cancelled, "Yes, in June")


def test_a_case_records_the_update_its_history_and_both_answers(tmp_path, embedder, check):
    case = check.CASES[0]  # Marta: Denver, then Portland
    assert (case.old, case.new) == ("Denver", "Portland")
    with Memory(tmp_path / "memories", embedder=embedder, manager=UpdatingManager(), answerer=FirstMemoryAnswerer(), k=30, distill=False) as memory:
        row = check.run_case(memory, case, "case-0")
    assert row["correction_events"] == ["UPDATE"]
    ((memory_id, history),) = row["histories"].items()
    assert [(entry["event"], entry["new_memory"]) for entry in history] == [("ADD", case.fact), ("UPDATE", case.correction)]
    assert (row["answer_before_correction"], row["answer"]) == ("Denver", "Portland")
    assert row["answered_with_correction"] and not row["passed_before_correction"]
