"""Evaluation throughput: questions per minute of the answer pipeline (retrieve each speaker's memories
from the bank, then the Answer Agent generates) on LoCoMo's validation conversation (conv-30) with the
embedded SmolLM2-135M-Instruct, by answer batch size and memories per speaker.

Everything goes through the pipeline's own code: the agent is loaded frozen (`frozen_policy`) as
`evaluate.py` loads it; `load_split` / `select_questions` pick the first N validation questions (the
same ones in every setting); the conversation's ADD-all bank of LoCoMo
observations is opened where `python evaluate.py banks=add_all` keeps it (`build_banks` builds it
there the first time, in seconds: ADD-all is one bulk write; in a temp dir when another process holds
that file); every setting runs `answer_questions` with greedy decoding, as `evaluate.py` does.

Baselines measured in the same run: batch size 1 (sequential generation; always measured, and the
"speed-up" column divides by it at the same k) and "search only", `answer_questions` with the answer
stage skipped (an engine that returns empty answers), which shows the share of the time retrieval takes.
"search ms/question" is embedding the question plus both speakers' searches; "answer s/question" is
generation wall time divided by the questions served. Each setting re-embeds its questions (the
embedder's cache holds one text, so the two speakers of a question share one embedding, as in a run).

    .venv/bin/python benchmarks/eval_throughput.py --quick         # 4 questions, batch 1 and 4, k 5, 16 tokens
    .venv/bin/python benchmarks/eval_throughput.py --out tp.json   # 24 questions, batch 1/4/8, k 5/10, 64 tokens
    .venv/bin/python benchmarks/eval_throughput.py --batch-sizes 1 16 --k-per-speaker 30 --max-new-tokens 256
    .venv/bin/python benchmarks/eval_throughput.py --precisions fp32 auto   # bf16 where the CPU has the units

With several `--precisions` every setting runs in each (the `precision` key: auto is bf16 autocast where
the CPU has bf16 units); "vs fp32" divides by the fp32 row of the same k and batch, and the answers
identical to fp32's are counted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import DictConfig  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from memr1.apps import CONFIG_DIR  # noqa: E402
from memr1.agents.answer import AnswerAgent  # noqa: E402
from memr1.embed import Embedder  # noqa: E402
from memr1.llm.engines import Generation, GenerationEngine, Prompt  # noqa: E402
from memr1.factories import build_engine, frozen_policy  # noqa: E402
from memr1.llm.precision import choose_precision  # noqa: E402
from memr1.llm.sampling import SamplingConfig  # noqa: E402
from memr1.memory import BankLockedError, MemoryBank  # noqa: E402
from memr1.pipeline.answering import answer_questions  # noqa: E402
from memr1.banks.build import memory_items  # noqa: E402
from memr1.pipeline.evaluation import load_split, select_questions  # noqa: E402
from memr1.banks.recipe import bank_recipe, open_or_build_banks  # noqa: E402
from memr1.banks.policies import AddAllPolicy  # noqa: E402
from memr1.timing import StageTimer  # noqa: E402
from memr1.types import Conversation, Question  # noqa: E402
from machine import machine_info, print_machine  # noqa: E402  (benchmarks/machine.py, beside this script)

SPLIT = "validation"
# Encoded between settings: with a one-text embedder cache it evicts the previous setting's last question.
CACHE_FLUSH_TEXT = "(benchmark: flush the embedder cache)"


@dataclasses.dataclass(frozen=True)
class Grid:
    questions: int
    batch_sizes: tuple[int, ...]
    k_per_speaker: tuple[int, ...]
    max_new_tokens: int


FULL = Grid(questions=24, batch_sizes=(1, 4, 8), k_per_speaker=(5, 10), max_new_tokens=64)
QUICK = Grid(questions=4, batch_sizes=(1, 4), k_per_speaker=(5,), max_new_tokens=16)


class SkipAnswer:
    """An engine that returns an empty answer to every prompt at once: `answer_questions` then times
    retrieval (and prompt building) alone."""

    def __init__(self, tokenizer: object) -> None:
        self.tokenizer = tokenizer

    records_trunk = False

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig, trunk_depth: int = 0) -> list[list[Generation]]:
        empty = Generation(text="", prompt_ids=[], response_ids=[], logprobs=[], finish_reason="length")
        return [[empty] for _ in prompts]


def evaluation_config() -> DictConfig:
    """memr1/conf/evaluate.yaml as `python evaluate.py` composes it (data=locomo, memory=facts, banks=add_all)."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="evaluate")


def open_built_banks(
    cfg: DictConfig, conversations: Sequence[Conversation], embedder: Embedder, stack: ExitStack
) -> tuple[dict[str, MemoryBank], dict[str, object]]:
    """The ADD-all observation banks at the pipeline's cache path (built there if missing), or in a temp
    dir when another process holds that Milvus Lite file; returns them and where / how long the build took."""
    items = {c.sample_id: memory_items(c, cfg.memory.source) for c in conversations}
    start = time.perf_counter()

    def open_or_build() -> dict[str, MemoryBank]:
        # ADD-all's banks of the dataset's facts: no model writes them, so no precision names them.
        return open_or_build_banks(bank_recipe(cfg, precision="fp32"), conversations, embedder, stack, policy=AddAllPolicy(), items=items, banks_dir=cfg.banks.dir)

    try:
        banks = open_or_build()
    except BankLockedError:
        cfg.banks.dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="eval_throughput_"))
        banks = open_or_build()
    build_s = time.perf_counter() - start
    build = {"banks_dir": str(cfg.banks.dir), "build_s": build_s, "memories": sum(map(len, banks.values()))}
    return banks, build


@dataclasses.dataclass(frozen=True)
class Workload:
    """What every setting shares: the questions, their conversation's bank and the Answer Agent."""

    questions: Sequence[Question]
    banks: Mapping[str, MemoryBank]
    speakers: Mapping[str, Sequence[str]]
    agent: AnswerAgent
    sampling: SamplingConfig
    embedder: Embedder


def measure(work: Workload, engine: GenerationEngine, k_per_speaker: int, batch_size: int) -> dict:
    """One setting: wall time of `answer_questions` over the questions and its per-stage seconds."""
    work.embedder.encode([CACHE_FLUSH_TEXT])
    timer = StageTimer()
    start = time.perf_counter()
    predictions = answer_questions(
        work.questions, work.banks, work.speakers, work.agent, engine, work.sampling,
        k_per_speaker=k_per_speaker, batch_size=batch_size, timer=timer,
    )
    total_s = time.perf_counter() - start
    count = len(work.questions)
    return {
        "questions": count,
        "total_s": total_s,
        "questions_per_min": 60 * count / total_s,
        "search_ms_per_question": 1e3 * sum(timer.samples["memory_search"]) / count,
        # The timer records each batch's wall time split over its questions: the sum is the stage's total.
        "answer_s_per_question": sum(timer.samples["answer"]) / count,
        "outputs": [p.raw_output for p in predictions],
    }


def run_k(
    work: Workload, engines: Mapping[int, GenerationEngine], k_per_speaker: int, console: Console
) -> list[dict]:
    """Search only, then every batch size (1 first: the baseline), at one k; adds the speed-ups."""
    console.log(f"k={k_per_speaker}: search only ...")
    rows = [{"k": k_per_speaker, "batch": None, **measure(work, SkipAnswer(engines[1].tokenizer), k_per_speaker, 1)}]
    for batch_size, engine in engines.items():
        console.log(f"k={k_per_speaker}: batch {batch_size} ...")
        rows.append({"k": k_per_speaker, "batch": batch_size, **measure(work, engine, k_per_speaker, batch_size)})
    baseline = rows[1]  # engines come in increasing batch size, 1 first
    for row in rows:
        row["speedup_vs_batch_1"] = row["questions_per_min"] / baseline["questions_per_min"]
        if row["batch"] is not None:
            # Greedy batched generation should match sequential up to float rounding (left padding, masking).
            same = sum(a == b for a, b in zip(row["outputs"], baseline["outputs"]))
            row["same_output_as_batch_1"] = same / len(work.questions)
    return rows


def render(rows: list[dict], max_new_tokens: int) -> Table:
    table = Table(
        title=f"evaluation throughput: LoCoMo {SPLIT} (conv-30), SmolLM2-135M, greedy, ≤{max_new_tokens} new tokens"
    )
    columns = ("precision", "k", "batch", "questions", "total s", "questions/min", "search ms/question", "answer s/question")
    for column in (*columns, "speed-up vs batch 1", "vs fp32", "answers = fp32's"):
        table.add_column(column, justify="right")
    for row in rows:
        search_only = row["batch"] is None
        table.add_row(
            row["precision"],
            str(row["k"]),
            "search only" if search_only else str(row["batch"]),
            str(row["questions"]),
            f"{row['total_s']:.1f}",
            f"{row['questions_per_min']:.1f}",
            f"{row['search_ms_per_question']:.1f}",
            "—" if search_only else f"{row['answer_s_per_question']:.2f}",
            f"{row['speedup_vs_batch_1']:.2f}x",
            f"{row['speedup_vs_fp32']:.2f}x" if "speedup_vs_fp32" in row else "—",
            f"{row['same_output_as_fp32']:.0%}" if "same_output_as_fp32" in row else "—",
        )
    return table


def add_precision_ratios(rows: list[dict]) -> None:
    """Each non-fp32 row against the fp32 row of the same k and batch: speed-up and identical answers."""
    fp32 = {(row["k"], row["batch"]): row for row in rows if row["precision"] == "fp32"}
    for row in rows:
        base = fp32.get((row["k"], row["batch"]))
        if base is None or row is base:
            continue
        row["speedup_vs_fp32"] = row["questions_per_min"] / base["questions_per_min"]
        if row["batch"] is not None:
            row["same_output_as_fp32"] = sum(a == b for a, b in zip(row["outputs"], base["outputs"])) / len(row["outputs"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, help=f"the first N validation questions (default {FULL.questions})")
    parser.add_argument(
        "--batch-sizes", type=int, nargs="+", help=f"answer batch sizes; 1 is always added (default {FULL.batch_sizes})"
    )
    parser.add_argument(
        "--k-per-speaker", type=int, nargs="+", help=f"memories retrieved per speaker (default {FULL.k_per_speaker})"
    )
    parser.add_argument("--max-new-tokens", type=int, help=f"answer length cap (default {FULL.max_new_tokens})")
    parser.add_argument("--precisions", nargs="+", choices=("auto", "fp32", "bf16"), default=["auto"],
                        help="the precision key: auto is bf16 where the CPU has bf16 units (compare with fp32)")
    parser.add_argument("--quick", action="store_true", help=f"defaults {QUICK}; explicit flags still win")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    grid = QUICK if args.quick else FULL
    num_questions = grid.questions if args.questions is None else args.questions
    batch_sizes = sorted({1, *(args.batch_sizes or grid.batch_sizes)})
    ks = args.k_per_speaker or list(grid.k_per_speaker)
    max_new_tokens = grid.max_new_tokens if args.max_new_tokens is None else args.max_new_tokens
    if min([num_questions, *batch_sizes, *ks, max_new_tokens]) < 1:
        parser.error("--questions, --batch-sizes, --k-per-speaker and --max-new-tokens must be positive")

    console = Console(width=150)
    print_machine()
    load_before = os.getloadavg()[0]  # timings on a shared machine move with its load: keep it beside them
    cfg = evaluation_config()
    conversations = load_split(cfg.data, SPLIT, cfg.conversations)
    # Frozen, as evaluate.py loads an agent (`ModelCache`): autocast caches no cast of a frozen weight.
    model, tokenizer = frozen_policy(cfg.backbone.name_or_path, cfg.backbone.dtype, None)
    # Engines differ only in their precision and how many prompts they decode together; they share the model.
    precisions = {setting: choose_precision(setting, "cpu") for setting in dict.fromkeys(args.precisions)}
    engines_by_precision = {
        setting: {size: build_engine("hf", model=model, tokenizer=tokenizer, batch_size=size, precision=precision) for size in batch_sizes}
        for setting, precision in precisions.items()
    }
    embedder = Embedder(cache_size=1)  # one text: a question's two speaker searches share its embedding

    rows = []
    with ExitStack() as stack:
        banks, build = open_built_banks(cfg, conversations, embedder, stack)
        work = Workload(
            questions=select_questions(conversations, num_questions),
            banks=banks,
            speakers={c.sample_id: c.speakers for c in conversations},
            agent=AnswerAgent(distill=cfg.answer.distill, max_answer_words=cfg.answer.max_answer_words),
            sampling=SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0),
            embedder=embedder,
        )
        console.log(
            f"{len(work.questions)} questions; bank of {build['memories']} memories in {build['banks_dir']} "
            f"({build['build_s']:.1f} s to build or find built)"
        )
        # Warm-up outside the timings: loads MiniLM (lazily, on first encode) and runs the model once.
        warm_up = dataclasses.replace(
            work, questions=work.questions[:1], sampling=SamplingConfig(max_new_tokens=2, temperature=0.0)
        )
        for setting, engines in engines_by_precision.items():
            chosen = precisions[setting].name
            label = setting if setting == chosen else f"{setting} ({chosen})"
            measure(warm_up, engines[1], min(ks), 1)
            for k in ks:
                rows.extend({"precision": label, **row} for row in run_k(work, engines, k, console))
    load_after = os.getloadavg()[0]
    add_precision_ratios(rows)

    console.print(render(rows, max_new_tokens))
    agreement = [
        f"{row['precision']} k={row['k']} batch {row['batch']}: {row['same_output_as_batch_1']:.0%}"
        for row in rows
        if (row["batch"] or 1) > 1
    ]
    if agreement:
        console.print("answers identical to batch 1: " + ", ".join(agreement))
    console.print(
        f"{os.cpu_count()} CPUs, torch {torch.__version__} with {torch.get_num_threads()} threads, "
        f"1-min load average {load_before:.2f} at start, {load_after:.2f} at end"
    )
    if args.out:
        machine = machine_info(load_before, load_after)
        settings = {
            "split": SPLIT,
            "backbone": cfg.backbone.name_or_path,
            "max_new_tokens": max_new_tokens,
            "answer_distill": cfg.answer.distill,
            "precisions": {setting: precision.reason for setting, precision in precisions.items()},
            "bank": build,
        }
        results = [{key: value for key, value in row.items() if key != "outputs"} for row in rows]
        args.out.write_text(json.dumps({"machine": machine, "settings": settings, "results": results}, indent=2))
        console.log(f"wrote {args.out}")

if __name__ == "__main__":
    main()
