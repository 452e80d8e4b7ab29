"""Distillation recall / precision against the evidence turns, on the fixture conversation
(tests/fixtures/locomo_mini.json): its facts as the retrieved memories (with their dia_id provenance),
its questions' evidence, and replies whose selections are counted by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from memr1.agents.answer import AnswerAgent
from memr1.banks.build import memory_items
from memr1.datasets.locomo import load_locomo
from memr1.metrics.distill import distillation_score, match_selected
from memr1.pipeline.answering import Prediction
from memr1.pipeline.report import distillation_scores
from memr1.types import MemoryEntry

FIXTURE = Path(__file__).parent / "fixtures" / "locomo_mini.json"


@pytest.fixture(scope="module")
def conversation():
    return load_locomo(FIXTURE)[0]


@pytest.fixture(scope="module")
def memories(conversation) -> list[MemoryEntry]:
    """The conversation's facts as a bank holds them: Ana adopted a dog named Rex (D1:1); Ben started
    running in 2022 (D1:2); Ana took Rex to the park (D1:1, D1:3); Rex learned to fetch (D2:2); ..."""
    return [
        MemoryEntry(f"m{i}", fact.text, fact.speaker, fact.date_time, fact.dia_ids)
        for i, fact in enumerate(memory_items(conversation, "observation"))
    ]


def question(conversation, text: str):
    return next(q for q in conversation.questions if q.question == text)


def test_recall_and_precision_of_the_selected_memories_by_hand(conversation, memories):
    dog = question(conversation, "What is the name of Ana's dog?")
    assert set(dog.evidence) == {"D1:1", "D1:3"}
    reply = (
        "**Relevant memories:**\n"
        "- [8 May, 2023] Ana adopted a dog named Rex.\n"   # D1:1: evidence
        "- Ben started running in 2022\n"                   # D1:2: not evidence
        "- The moon is made of cheese.\n"                   # copies no memory
        "**Answer:** Rex"
    )
    parsed = AnswerAgent().parse(reply)
    score = distillation_score(parsed.selected, memories, dog.evidence)
    # Covered: D1:1 of {D1:1, D1:3} -> recall 1/2. Lines from evidence: 1 of 3 -> precision 1/3.
    assert score.recall == pytest.approx(0.5)
    assert score.precision == pytest.approx(1 / 3)
    assert score.retrieved == 1.0  # every memory was retrieved: the evidence was all there
    texts = {entry.id: entry.text for entry in memories}
    assert [texts.get(i) for i in score.matched_ids] == ["Ana adopted a dog named Rex.", "Ben started running in 2022.", None]

    # Selecting the park memory (D1:1, D1:3) too covers all the evidence: recall 1, precision 2/2.
    both = distillation_score(["Ana adopted a dog named Rex.", "Ana took Rex to the park"], memories, dog.evidence)
    assert (both.recall, both.precision) == (1.0, 1.0)


def test_no_memory_listed_is_recall_zero_and_no_precision(conversation, memories):
    dog = question(conversation, "What is the name of Ana's dog?")
    parsed = AnswerAgent().parse("**Answer:** Rex")
    assert parsed.format_error == "missing_memory_list"
    score = distillation_score(parsed.selected, memories, dog.evidence)
    assert (score.recall, score.precision) == (0.0, None)
    # Retrieval that held only Ben's memories could not have covered the dog question's evidence.
    bens = [m for m in memories if m.speaker == "Ben"]
    assert distillation_score([], bens, dog.evidence).retrieved == 0.0


def test_a_paraphrase_matches_its_memory_and_an_unrelated_line_does_not(memories):
    matched = match_selected(["Ana took her dog Rex to the park", "Rex is a cat"], memories)
    assert matched[0] is not None and matched[0].text == "Ana took Rex to the park." and matched[1] is None


def test_the_report_averages_per_category_over_the_predictions_that_have_a_value():
    def prediction(category: int, recall: float | None, precision: float | None) -> Prediction:
        return Prediction("q", "c", "?", "g", "p", category, [], [], None, "", distill_recall=recall, distill_precision=precision)

    scores = distillation_scores([prediction(1, 1.0, 0.5), prediction(1, 0.0, None), prediction(2, 0.5, 1.0)])
    assert scores["distill_recall"] == pytest.approx(50.0)          # (1 + 0 + 0.5) / 3
    assert scores["distill_precision"] == pytest.approx(75.0)       # (0.5 + 1) / 2: None left out
    assert scores["distill_recall/cat1"] == pytest.approx(50.0) and scores["distill_precision/cat1"] == pytest.approx(50.0)
    assert "evidence_retrieved" not in scores
