"""Answer questions from memory banks: retrieve per speaker, prompt the Answer Agent, parse."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping, Sequence

from memr1.agents.answer import AnswerAgent
from memr1.llm.engines import GenerationEngine, SamplingConfig
from memr1.memory import MemoryView
from memr1.memory.retrieval import retrieve_memories
from memr1.metrics.distill import distillation_score
from memr1.metrics.lexical import answer_scores
from memr1.timing import StageTimer
from memr1.types import Question


@dataclass
class Prediction:
    """One answered question, as written to `predictions.jsonl`."""

    qid: str
    conversation_id: str
    question: str
    gold: str
    prediction: str
    category: int
    retrieved_ids: list[str]
    selected_memories: list[str]
    format_error: str | None
    raw_output: str
    latency_s: dict[str, float] = field(default_factory=dict)
    # Distillation against the question's evidence dia_ids (`memr1.metrics.distill`); None for an agent
    # that does not distil, or where there is nothing to measure (no evidence, no line selected).
    evidence: list[str] = field(default_factory=list)
    selected_ids: list[str | None] = field(default_factory=list)
    distill_recall: float | None = None
    distill_precision: float | None = None
    evidence_retrieved: float | None = None
    # F1 / BLEU-1 / EM x100 (`memr1.metrics.lexical.answer_scores`), scored once here and read by `memr1
    # compare` and the tables; empty in a file written before they were stored.
    scores: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def answer_questions(
    questions: Sequence[Question],
    banks: Mapping[str, MemoryView],
    speakers: Mapping[str, Sequence[str]],
    agent: AnswerAgent,
    engine: GenerationEngine,
    sampling: SamplingConfig,
    k_per_speaker: int = 30,
    batch_size: int = 8,
    timer: StageTimer | None = None,
    on_batch: Callable[[list[Prediction]], None] | None = None,
) -> list[Prediction]:
    """Answer `questions` in batches of `batch_size` prompts.

    `banks` and `speakers` are keyed by conversation id. `on_batch` sees each batch's predictions as
    soon as they exist (the evaluator appends them to its JSONL file, so a killed run loses one batch).
    """
    timer = timer or StageTimer()
    predictions: list[Prediction] = []
    for start in range(0, len(questions), batch_size):
        batch = questions[start : start + batch_size]
        retrieved, search_seconds = [], []
        for question in batch:
            with timer.time("memory_search"):
                memories = retrieve_memories(
                    banks[question.conversation_id],
                    question.question,
                    speakers[question.conversation_id],
                    k_per_speaker,
                )
            search_seconds.append(timer.samples["memory_search"][-1])
            retrieved.append(memories)
        prompts = [agent.build_messages(q.question, memories) for q, memories in zip(batch, retrieved)]
        with timer.time("answer", items=len(batch)):
            outputs = engine.generate(prompts, sampling)
        answer_seconds = timer.samples["answer"][-1]
        batch_predictions = []
        for question, memories, samples, search_s in zip(batch, retrieved, outputs, search_seconds):
            parsed = agent.parse(samples[0].text)
            flat = [entry for entries in memories.values() for entry in entries]
            distill = distillation_score(parsed.selected, flat, question.evidence) if agent.distill else None
            batch_predictions.append(
                Prediction(
                    qid=question.qid,
                    conversation_id=question.conversation_id,
                    question=question.question,
                    gold=question.answer,
                    prediction=parsed.answer,
                    category=question.category,
                    retrieved_ids=[entry.id for entry in flat],
                    selected_memories=parsed.selected,
                    format_error=parsed.format_error,
                    raw_output=samples[0].text,
                    latency_s={"memory_search": search_s, "answer": answer_seconds},
                    evidence=list(question.evidence),
                    selected_ids=list(distill.matched_ids) if distill else [],
                    distill_recall=distill.recall if distill else None,
                    distill_precision=distill.precision if distill else None,
                    evidence_retrieved=distill.retrieved if distill else None,
                    scores=answer_scores(parsed.answer, question.answer),
                )
            )
        predictions.extend(batch_predictions)
        if on_batch is not None:
            on_batch(batch_predictions)
    return predictions
