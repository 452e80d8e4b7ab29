"""`python evaluate.py`: build (or reuse) the memory banks of a split, answer its questions, report.

Everything here is driven by the Hydra config of `conf/evaluate.yaml`; each step is a function of
the library (data → banks → answers → scores), so notebooks can call them one by one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from memr1.agents.answer import AnswerAgent
from memr1.agents.extractor import FactExtractor
from memr1.datasets.registry import category_names, load_dataset
from memr1.embed import Embedder
from memr1.llm.engines import GenerationEngine, build_engine
from memr1.llm.loading import load_policy
from memr1.llm.sampling import SamplingConfig
from memr1.memory import BankLockedError, MemoryBank
from memr1.metrics.judge import EngineJudge, Judge, OpenAICompatibleJudge
from memr1.pipeline.answering import Prediction, answer_questions
from memr1.pipeline.banks import bank_name, build_banks, memory_items
from memr1.pipeline.extraction import extract_facts
from memr1.pipeline.managers import AddAllPolicy, MemoryPolicy, ModelPolicy
from memr1.pipeline.report import score_predictions, write_report
from memr1.pipeline.timing import StageTimer
from memr1.types import Conversation, Fact, Question

log = logging.getLogger(__name__)


class LoggedProgress(Progress):
    """A rich progress bar that, when the output is not a terminal (redirected to a file, CI), logs a
    line per advance at most every `every_s` seconds instead: a bar there would print only at the end."""

    every_s = 30.0

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        if self.console.is_terminal:
            return
        task = self._tasks[task_id]
        now = time.monotonic()
        if task.finished or now - getattr(task, "_last_logged", 0.0) >= self.every_s:
            task._last_logged = now  # type: ignore[attr-defined]
            log.info("%s: %d/%s (%.0f s)", task.description, task.completed, int(task.total or 0), task.elapsed or 0.0)


def progress_bar() -> Progress:
    bar = LoggedProgress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    bar.disable = not bar.console.is_terminal  # its log lines stand in for it; no bar dumped at the end
    return bar


def load_split(data: DictConfig, split: str, conversations: Sequence[str] | None = None) -> list[Conversation]:
    """The conversations of `split` (LoCoMo's conversation split; the zero-shot sets are test-only)."""
    if data.kind == "locomo":
        from data_modules.locomo import LoCoMoDataModule

        module = LoCoMoDataModule(
            path=data.path,
            sha256=data.sha256,
            download=data.get("download") or None,
            splits=data.splits,
            exclude_categories=data.exclude_categories,
        )
        module.prepare_data()
        module.setup()
        selected = module.conversations(split)
    else:
        if split != "test":
            raise ValueError(f"split={split}: {data.kind} is a zero-shot test set; use split=test")
        excluded = set(data.exclude_categories)
        selected = [
            dataclasses.replace(c, questions=tuple(q for q in c.questions if q.category not in excluded))
            for c in load_dataset(data.kind, data.path)
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


def manager_uses_model(cfg: DictConfig) -> bool:
    """Whether a model decides the memory operations (raw turns are always ADDed)."""
    return cfg.memory.source != "raw_turns" and cfg.manager.kind != "add_all"


def bank_signature(cfg: DictConfig) -> str:
    """Names the banks a config builds: runs that would build identical banks share them."""
    recipe: dict[str, Any] = {"data": cfg.data.kind, "path": str(cfg.data.path), "memory": OmegaConf.to_container(cfg.memory)}
    if cfg.memory.source == "llm":
        recipe["extractor"] = cfg.backbone.name_or_path
    if manager_uses_model(cfg):
        recipe["manager"] = OmegaConf.to_container(cfg.manager)
        recipe["backbone"] = cfg.backbone.name_or_path
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:10]
    manager = "model" if manager_uses_model(cfg) else "add_all"
    return f"{cfg.data.kind}-{cfg.memory.source}-{manager}-{digest}"


class ModelCache:
    """Loads each (backbone, checkpoint) once, so a prompted manager and the answer agent share it."""

    def __init__(self, backbone: DictConfig, engine_kind: str, batch_size: int) -> None:
        self.backbone = backbone
        self.engine_kind = engine_kind
        self.batch_size = batch_size
        self._engines: dict[str | None, GenerationEngine] = {}

    def engine(self, ckpt: str | None) -> GenerationEngine:
        if ckpt not in self._engines:
            started = time.perf_counter()
            if self.engine_kind == "vllm":
                self._engines[ckpt] = build_engine("vllm", name_or_path=ckpt or self.backbone.name_or_path)
            else:
                model, tokenizer = load_policy(self.backbone.name_or_path, dtype=self.backbone.dtype, adapter=ckpt)
                self._engines[ckpt] = build_engine("hf", model=model, tokenizer=tokenizer, batch_size=self.batch_size)
            log.info("loaded %s%s in %.1fs", self.backbone.name_or_path, f" + {ckpt}" if ckpt else "", time.perf_counter() - started)
        return self._engines[ckpt]


def memory_policy(cfg: DictConfig, models: ModelCache) -> MemoryPolicy:
    if not manager_uses_model(cfg):
        return AddAllPolicy()
    if cfg.manager.kind == "model":
        return ModelPolicy(
            models.engine(cfg.manager.ckpt),
            sampling=SamplingConfig(max_new_tokens=cfg.manager.max_new_tokens, temperature=0.0),
            num_candidates=cfg.manager.num_candidates,
        )
    raise ValueError(f"manager.kind: unknown kind {cfg.manager.kind!r}; expected add_all or model")


def make_judge(cfg: DictConfig) -> Judge | None:
    """The configured judge (`judge` group), or None for judge=none."""
    kind = cfg.judge.kind
    if kind == "none":
        return None
    if kind == "hf":
        judge_models = ModelCache(OmegaConf.create({"name_or_path": cfg.judge.model, "dtype": cfg.backbone.dtype}), "hf", cfg.judge.batch_size)
        return EngineJudge(judge_models.engine(None), cfg.judge.max_new_tokens, cfg.judge.batch_size)
    if kind == "openai_compatible":
        return OpenAICompatibleJudge(cfg.judge.url, cfg.judge.model, cfg.judge.api_key_env, cfg.judge.timeout_s)
    raise ValueError(f"judge.kind: unknown kind {kind!r}; expected none, hf or openai_compatible")


def open_banks(cfg: DictConfig, conversations: Sequence[Conversation], embedder: Embedder, stack: ExitStack) -> tuple[dict[str, MemoryBank], Path]:
    """Every conversation's bank, opened at `banks.uri` or a Milvus Lite file named by the signature.

    A Lite file held by another process (an evaluation building or loading the same banks; each
    releases it once its banks are loaded) is waited for, up to `banks.lock_wait_s` seconds."""
    signature = bank_signature(cfg)
    banks_dir = Path(cfg.banks.dir)
    banks_dir.mkdir(parents=True, exist_ok=True)
    uri = cfg.banks.uri or str(banks_dir / f"{signature}.db")
    deadline = time.monotonic() + cfg.banks.lock_wait_s
    while True:
        try:
            banks = {c.sample_id: stack.enter_context(MemoryBank.open(uri, bank_name(c.sample_id), embedder)) for c in conversations}
            return banks, banks_dir / f"{signature}.progress.json"
        except BankLockedError as error:
            stack.close()  # banks opened before the locked one
            if time.monotonic() >= deadline:
                raise BankLockedError(
                    error.path,
                    hint=f"wait for it, or give this run its own banks with banks.dir=DIR (now {cfg.banks.dir}; "
                    f"waited banks.lock_wait_s={cfg.banks.lock_wait_s} s)",
                ) from None
            log.info("waiting for %s: another process is building or loading these banks", uri)
            time.sleep(2.0)


def memory_items_for(
    cfg: DictConfig, conversations: Sequence[Conversation], models: ModelCache, facts_cache: Path, timer: StageTimer
) -> dict[str, list[Fact]]:
    """The facts each bank is built from: the dataset's (observation), its raw turns, or extracted by
    the backbone (memory=llm_facts, cached in `facts_cache` so reruns and resumed runs skip done turns)."""
    if cfg.memory.source != "llm":
        return {c.sample_id: memory_items(c, cfg.memory.source) for c in conversations}
    sampling = SamplingConfig(max_new_tokens=cfg.memory.max_new_tokens, temperature=0.0)
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
    models = ModelCache(cfg.backbone, cfg.engine, cfg.answer.batch_size)
    embedder = Embedder()
    with ExitStack() as stack:
        banks, progress_file = open_banks(cfg, conversations, embedder, stack)
        policy = memory_policy(cfg, models)
        items = memory_items_for(cfg, conversations, models, progress_file.with_suffix(".facts.jsonl"), timer)
        with progress_bar() as bar:
            task = bar.add_task("building banks", total=sum(len(facts) for facts in items.values()))
            build_banks(items, banks, policy, progress_file, timer, on_advance=lambda n: bar.advance(task, n))
        for bank in banks.values():  # built: searches are served in-process, the file is free for others
            bank.release_store()
        agent = AnswerAgent(distill=cfg.answer.distill, max_answer_words=cfg.answer.max_answer_words)
        engine = models.engine(cfg.ckpt)
        sampling = SamplingConfig(max_new_tokens=cfg.answer.max_new_tokens, temperature=0.0)
        predictions_path = run_dir / "predictions.jsonl"
        with predictions_path.open("w") as out, progress_bar() as bar:
            task = bar.add_task("answering", total=len(questions))

            def save(batch: list[Prediction]) -> None:
                for prediction in batch:
                    out.write(json.dumps(prediction.to_json()) + "\n")
                out.flush()
                bar.advance(task, len(batch))

            predictions = answer_questions(
                questions,
                banks,
                {c.sample_id: c.speakers for c in conversations},
                agent,
                engine,
                sampling,
                k_per_speaker=cfg.answer.k_per_speaker,
                batch_size=cfg.answer.batch_size,
                timer=timer,
                on_batch=save,
            )
        bank_sizes = {c.sample_id: len(banks[c.sample_id]) for c in conversations}

    judge = make_judge(cfg)
    verdicts = None
    if judge is not None:
        with timer.time("judge", items=len(predictions)):
            verdicts = judge([p.question for p in predictions], [p.gold for p in predictions], [p.prediction for p in predictions])
    scores = score_predictions(predictions, verdicts)
    scores["format_error_rate"] = 100.0 * sum(p.format_error is not None for p in predictions) / len(predictions)
    scores["mean_answer_words"] = sum(len(p.prediction.split()) for p in predictions) / len(predictions)
    latency = timer.summary()
    settings = {
        "data": cfg.data.kind,
        "split": cfg.split,
        "manager": OmegaConf.to_container(cfg.manager),
        "memory": cfg.memory.source,
        "backbone": cfg.backbone.name_or_path,
        "ckpt": cfg.ckpt,
        "answer": OmegaConf.to_container(cfg.answer),
        "bank_sizes": bank_sizes,
        "manager_format_errors": getattr(policy, "format_errors", 0),
        "wall_time_s": round(time.perf_counter() - started, 1),
    }
    title = f"memr1 evaluation: {cfg.data.kind} {cfg.split}, manager={cfg.manager.kind}, memory={cfg.memory.source}" + (
        f", ckpt={cfg.ckpt}" if cfg.ckpt else ""
    )
    write_report(run_dir, scores, latency, category_names(cfg.data.kind), settings, title)
    return {"scores": scores, "latency": latency, "settings": settings}
