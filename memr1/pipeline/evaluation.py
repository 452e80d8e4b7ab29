"""`python evaluate.py`: build (or reuse) the memory banks of a split, answer its questions, report.

Everything here is driven by the Hydra config of `conf/evaluate.yaml`; each step is a function of
the library (data → banks → answers → scores), so notebooks can call them one by one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from memr1.agents.answer import ANSWER_FORMAT_ERRORS
from memr1.agents.extractor import FactExtractor
from memr1.banks.build import DecisionLog, bank_operations, describe_operations, memory_items
from memr1.banks.recipe import bank_recipe, facts_cache_file, open_or_build_banks, store_location
from memr1.datasets.locomo_file import load_locomo_split
from memr1.datasets.registry import dataset_spec
from memr1.embed import Embedder
from memr1.factories import ModelCache, answer_agent, answer_config, banks_config, make_judge, memory_policy, run_precision
from memr1.faults import fault_point
from memr1.llm.sampling import SamplingConfig
from memr1.pipeline.answering import Prediction, answer_questions
from memr1.pipeline.compare import PREDICTIONS
from memr1.pipeline.decisions import DECISIONS
from memr1.pipeline.extraction import extract_facts
from memr1.pipeline.report import memory_listed_pct, score_predictions, write_report
from memr1.pipeline.report_file import MEMORY_LISTED
from memr1.progress import progress_bar
from memr1.provenance import code_version
from memr1.timing import StageTimer
from memr1.types import Conversation, Fact, Question

log = logging.getLogger(__name__)

RESUME_KEY = "predictions.key.json"  # what the answers in PREDICTIONS depend on: a rerun resumes only on the same


def keep_decisions(decision_log: DecisionLog, conversation_ids: set[str], run_dir: Path) -> None:
    """The banks' decisions on this run's conversations, beside its predictions (`memr1 decisions`)."""
    rows = decision_log.load()
    if rows is None:
        log.info("no decisions logged for these banks (built before decisions were kept, or in memory)")
        return
    kept = [row for row in rows if row["conversation"] in conversation_ids]
    (run_dir / DECISIONS).write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in kept))


def load_split(data: DictConfig, split: str, conversations: Sequence[str] | None = None) -> list[Conversation]:
    """The conversations of `split` (split by conversation id in LoCoMo's format; the zero-shot sets are
    test-only)."""
    spec = dataset_spec(data.kind)
    if spec.locomo_format:
        selected = load_locomo_split(
            data.path, split, sha256=data.sha256, download=data.get("download") or None, splits=data.splits,
            exclude_categories=data.exclude_categories,
        )
    else:
        if split != "test":
            raise ValueError(f"split={split}: {spec.title} (data.kind={data.kind}) is a zero-shot test set; use split=test")
        excluded = set(data.exclude_categories)
        selected = [
            dataclasses.replace(c, questions=tuple(q for q in c.questions if q.category not in excluded))
            for c in spec.load(data.path)
        ]
    if conversations:
        wanted = set(conversations)
        missing = wanted - {c.sample_id for c in selected}
        if missing:
            raise ValueError(f"conversations: {sorted(missing)} are not in split {split!r}")
        selected = [c for c in selected if c.sample_id in wanted]
    return selected


def select_questions(conversations: Sequence[Conversation], max_questions: int | None) -> list[Question]:
    questions = [q for c in conversations for q in c.questions]
    return questions if max_questions is None else questions[:max_questions]


def memory_items_for(
    cfg: DictConfig, conversations: Sequence[Conversation], models: ModelCache, facts_cache: Path, timer: StageTimer
) -> dict[str, list[Fact]]:
    """The facts each bank is built from: the dataset's (observation), its raw turns, or extracted by
    the backbone (memory=llm_facts, cached in `facts_cache` so reruns and resumed runs skip done turns)."""
    if cfg.memory.source != "llm":
        return {c.sample_id: memory_items(c, cfg.memory.source) for c in conversations}
    sampling = SamplingConfig.greedy_up_to(cfg.memory.max_new_tokens)
    with progress_bar() as bar:
        task = bar.add_task("extracting facts", total=sum(1 for c in conversations for _ in c.turns()))
        return extract_facts(
            conversations,
            models.engine(cfg.memory.ckpt),
            facts_cache,
            FactExtractor(cfg.memory.max_facts_per_turn),
            sampling,
            cfg.memory.batch_size,
            timer,
            on_advance=lambda n: bar.advance(task, n),
        )


def resume_predictions(run_dir: Path, key: dict[str, Any], batch_size: int) -> list[Prediction]:
    """The answers a stopped evaluation in `run_dir` already wrote, if it ran with the same `key` (the
    questions in order, the banks, the model, its precision and the answer settings); none otherwise.

    They are cut back to whole batches, so each question left is answered in the batch an unbroken
    run would have put it in (a batch's padding can move a greedy answer), and a line torn by a kill
    is dropped. The file is rewritten with what is kept and the key recorded, before any answering."""
    predictions_path, key_path = run_dir / PREDICTIONS, run_dir / RESUME_KEY
    kept: list[Prediction] = []
    if predictions_path.is_file() and key_path.is_file():
        if json.loads(key_path.read_text()) != key:
            log.warning("%s: answered with other settings (%s differs); answering again", predictions_path, key_path.name)
        else:
            for line, qid in zip(predictions_path.read_text().splitlines(), key["questions"]):
                try:
                    prediction = Prediction(**json.loads(line))
                except (json.JSONDecodeError, TypeError):
                    break
                if prediction.qid != qid:
                    break
                kept.append(prediction)
            kept = kept[: len(kept) - len(kept) % batch_size]
            log.info("resuming: %d of %d questions answered before, kept", len(kept), len(key["questions"]))
    key_path.write_text(json.dumps(key) + "\n")
    staged = predictions_path.with_suffix(".jsonl.tmp")
    staged.write_text("".join(json.dumps(p.to_json()) + "\n" for p in kept))
    staged.replace(predictions_path)
    return kept


def run_evaluation(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """The whole evaluation; returns the report's scores and latencies."""
    started = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    conversations = load_split(cfg.data, cfg.split, cfg.conversations)
    questions = select_questions(conversations, cfg.max_questions)
    if not questions:
        raise ValueError(f"split {cfg.split!r} with conversations={cfg.conversations} has no questions")
    # Only the conversations that the selected questions ask about need banks.
    asked = {q.conversation_id for q in questions}
    conversations = [c for c in conversations if c.sample_id in asked]
    log.info("%d questions over %d conversations (%s, split %s)", len(questions), len(conversations), cfg.data.kind, cfg.split)

    timer = StageTimer()
    answer = answer_config(cfg)
    precision = run_precision(cfg)
    recipe = bank_recipe(cfg, precision=precision.name)
    banks_cfg = banks_config(cfg)
    models = ModelCache(cfg.backbone, cfg.engine, answer.batch_size, precision)
    embedder = Embedder(recipe.embedder)
    facts_cache = facts_cache_file(recipe, banks_cfg.dir)
    items = memory_items_for(cfg, conversations, models, facts_cache, timer)
    with ExitStack() as stack:
        policy = memory_policy(recipe, cfg, models.engine, conversations)
        with progress_bar() as bar:
            task = bar.add_task("building banks", total=None)
            banks = open_or_build_banks(
                recipe,
                conversations,
                embedder,
                stack,
                policy=policy,
                items=items,
                banks_dir=banks_cfg.dir,
                uri=banks_cfg.uri,
                lock_wait_s=banks_cfg.lock_wait_s,
                timer=timer,
                on_total=lambda total: bar.update(task, total=total),
                on_advance=lambda n: bar.advance(task, n),
            )
        agent = answer_agent(answer)
        engine = models.engine(answer.ckpt)
        sampling = SamplingConfig.greedy_up_to(answer.max_new_tokens)
        key = {
            "questions": [q.qid for q in questions],
            "banks": recipe.signature(),
            "memory": cfg.memory.source,
            "backbone": cfg.backbone.name_or_path,
            "engine": cfg.engine,
            "precision": precision.name,
            "answer": dataclasses.asdict(answer),
        }
        answered = resume_predictions(run_dir, key, answer.batch_size)
        with (run_dir / PREDICTIONS).open("a") as out, progress_bar() as bar:
            task = bar.add_task("answering", total=len(questions), completed=len(answered))

            def save(batch: list[Prediction]) -> None:
                for prediction in batch:
                    out.write(json.dumps(prediction.to_json()) + "\n")
                out.flush()
                bar.advance(task, len(batch))
                fault_point("answer_batch")

            predictions = answered + answer_questions(
                questions[len(answered) :],
                banks,
                {c.sample_id: c.speakers for c in conversations},
                agent,
                engine,
                sampling,
                k_per_speaker=answer.k_per_speaker,
                batch_size=answer.batch_size,
                timer=timer,
                on_batch=save,
            )
        bank_sizes = {c.sample_id: len(banks[c.sample_id]) for c in conversations}
        progress_file = store_location(recipe, banks_cfg.dir, banks_cfg.uri)[1]
        operations = bank_operations(banks, items, progress_file)
        log.info("bank operations (%s): %s", recipe.policy, describe_operations(operations))
        keep_decisions(DecisionLog(DecisionLog.beside(progress_file)), set(banks), run_dir)

    judge = make_judge(cfg)
    verdicts = None
    if judge is not None:
        with timer.time("judge", items=len(predictions)):
            verdicts = judge([p.question for p in predictions], [p.gold for p in predictions], [p.prediction for p in predictions])
    scores = score_predictions(predictions, verdicts)
    scores["format_error_rate"] = 100.0 * sum(p.format_error is not None for p in predictions) / len(predictions)
    for kind in ANSWER_FORMAT_ERRORS:  # each kind's share: a reply without its memory list is one
        scores[f"format_error_rate/{kind}"] = 100.0 * sum(p.format_error == kind for p in predictions) / len(predictions)
    scores["mean_answer_words"] = sum(len(p.prediction.split()) for p in predictions) / len(predictions)
    if answer.distill:
        scores[MEMORY_LISTED] = memory_listed_pct([p.selected_memories for p in predictions])
    latency = timer.summary()
    spec = dataset_spec(cfg.data.kind)
    settings = {
        "data": cfg.data.kind,
        "split": cfg.split,
        # What `memr1 compare` and the tables call each category, and who says so.
        "categories": {str(category): name for category, name in spec.categories.items()},
        "categories_source": spec.categories_source,
        "banks": recipe.signature(),
        "bank_recipe": dataclasses.asdict(recipe),
        "memory": cfg.memory.source,
        "backbone": cfg.backbone.name_or_path,
        "precision": precision.name,  # greedy answers can differ between precisions: a re-score uses this one
        "answer": dataclasses.asdict(answer),
        "bank_sizes": bank_sizes,
        "bank_operations": operations,  # what the banks' writer did with the facts (memr1.banks.build.bank_operations)
        "code": code_version(),  # the memr1 commit that scored it (None outside a git checkout)
        "resumed_predictions": len(answered),  # answered by a stopped run: latency and wall time leave them out
        "wall_time_s": round(time.perf_counter() - started, 1),
    }
    title = f"memr1 evaluation: {cfg.data.kind} {cfg.split}, banks={recipe.policy}, memory={cfg.memory.source}" + (
        f", answer.ckpt={answer.ckpt}" if answer.ckpt else ""
    )
    write_report(run_dir, scores, latency, spec.categories, settings, title)
    return {"scores": scores, "latency": latency, "settings": settings}
