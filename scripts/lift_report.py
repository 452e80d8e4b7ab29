"""The CPU lift report: evaluation rows, base-vs-trained comparison and training summaries, read from
finished run directories (no model is loaded).

Inputs:

- `--eval LABEL=DIR` (repeatable, order kept): a `python evaluate.py` run dir holding `report.json`
  (scores, latency, settings) and `predictions.jsonl` (one prediction per question).
- `--train LABEL=DIR` (repeatable): a `python train.py` run dir holding `curves.json` (reward/mean per
  step, validation scores per check), `csv/metrics.csv` (per-step logged metrics) and `train.log`.
- `--base` / `--trained`: the two `--eval` labels whose predictions are compared (paired differences
  with their 95% bootstrap intervals, `memr1 compare`'s, and a seeded choice of sample questions, the
  same ids for both).
- `--versus B=A` (repeatable, labels): more pairs scored the same way, e.g. each RL row against the SFT
  row it started from.
- `--commands FILE`: optional `label<TAB>command` lines, the command behind each run.
- `--pipeline NAME`: all of the above read from `memr1 pipeline NAME`'s schedule instead: each finished
  evaluation stage with a `report` label is an `--eval` row, each finished RL training stage a
  `--train` run, each `versus` a pair (the first one is `--base` / `--trained`), and the commands are
  the stages' own. Unfinished stages are left out and named; options given as well add to it.

Outputs: `--json` (everything), `--markdown-out` (the tables: first every row against its starting
point, then the scores, each pair by category, lengths, samples, training; written between the two
marker lines of the page, docs/cpu_lift.md by default, its prose kept; a new file is just the tables) and
`--figure` (one panel per training run: reward/mean and the probe reward by step on the left axis,
val/f1 or val/reward on the right). Scores are 0-100 as in report.json; the samples' token F1 is
rescaled to 0-100 too.

    .venv/bin/python scripts/lift_report.py --pipeline cpu_lift     # the lift's finished stages into docs/cpu_lift*
    .venv/bin/python scripts/lift_report.py \\
        --eval "Answer Agent, base=runs/cpu_lift/eval-base" \\
        --eval "Answer Agent, GRPO=runs/cpu_lift/eval-answer-grpo" \\
        --train "answer GRPO=runs/cpu_lift/answer-grpo" --train "manager GRPO=runs/cpu_lift/manager-grpo" \\
        --base "Answer Agent, base" --trained "Answer Agent, GRPO" --commands runs/cpu_lift/commands.tsv \\
        --versus "Answer Agent, GRPO=Answer Agent, SFT"
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from statistics import mean

from rich.console import Console
from rich.table import Table

from memr1.banks.build import OPERATION_KINDS
from memr1.datasets.registry import category_names
from memr1.metrics.lexical import token_f1
from memr1.pipeline.compare import markdown as comparison_markdown
from memr1.pipeline.report_file import DISTILL_COLUMNS, LEXICAL_COLUMNS, MEMORY_LISTED, EvalReport
from memr1.pipeline.tables import ScoredRun, cell, compare_labelled, markdown_table, number
from memr1.stage_archive import DONE, read_done

SCORES = LEXICAL_COLUMNS
LENGTH_BUCKETS = ("0", "1", "2", "3", "4", "5", "6", "7-10", "11-20", ">20")
# train.log lines start with Hydra's "[2026-11-30 04:49:31,335][logger][LEVEL] - ..."
LOG_TIMESTAMP = re.compile(r"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3})\]")
# Each start of train.py logs this (memr1.training) within milliseconds of its first line.
RUN_START = "[memr1.training][INFO] - torch uses "
START_LINES_S = 5.0
# Validation keys in the order that picks a run's headline score (Answer runs log F1, Manager runs reward).
PRIMARY_VAL_KEYS = ("val/f1", "val/reward")
SAMPLE_CELL_CHARS = 120
# Pipeline order for the s/step columns; stages not named here follow alphabetically.
STAGE_ORDER = ("rollout", "reward", "update")


@dataclass(frozen=True)
class RunSpec:
    label: str
    path: Path


def parse_spec(text: str) -> RunSpec:
    """`LABEL=DIR`; the label may hold commas and spaces, so the split is on the last '='."""
    label, sep, path = text.rpartition("=")
    if not sep or not label.strip() or not path.strip():
        raise argparse.ArgumentTypeError(f"expected LABEL=DIR, got {text!r}")
    return RunSpec(label.strip(), Path(path.strip()))


def require(path: Path, what: str) -> Path:
    if not path.is_file():
        raise SystemExit(f"error: {what}: missing file {path}")
    return path


def read_json(path: Path, what: str) -> dict:
    try:
        return json.loads(require(path, what).read_text())
    except json.JSONDecodeError as error:
        raise SystemExit(f"error: {what}: {path} is not valid JSON ({error})") from error


def read_predictions(path: Path, what: str) -> list[dict]:
    rows = []
    for line_number, line in enumerate(require(path, what).read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise SystemExit(f"error: {what}: {path}:{line_number} is not valid JSON ({error})") from error
    if not rows:
        raise SystemExit(f"error: {what}: {path} holds no predictions")
    return rows


def read_commands(path: Path | None) -> dict[str, str]:
    if path is None:
        return {}
    commands = {}
    for line_number, line in enumerate(require(path, "--commands").read_text().splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        label, sep, command = line.partition("\t")
        if not sep:
            raise SystemExit(f"error: --commands: {path}:{line_number} has no TAB between label and command")
        commands[label.strip()] = command.strip()
    return commands


def pipeline_runs(name: str, console: Console) -> tuple[list[RunSpec], list[RunSpec], list[tuple[str, str]], dict[str, str]]:
    """From the schedule of `memr1 pipeline NAME`: its finished evaluation stages with a report label
    (in order), its finished RL training stages, the (trained, base) label pairs of its `versus` keys
    whose both rows are finished, and the command of each. Unfinished stages are named on `console`."""
    from memr1.schedule import load_schedule, stage_arguments

    schedule = load_schedule(name)
    evals: list[RunSpec] = []
    trains: list[RunSpec] = []
    pairs: list[tuple[str, str]] = []
    commands: dict[str, str] = {}
    waiting = []
    for stage in schedule.stages:
        directory = schedule.root / stage.name
        if not (directory / DONE).is_file():
            waiting.append(stage.name)
            continue
        # The stage's command as scheduled: a resumed run's ckpt_path=last is how it was run, not what.
        args = [arg for arg in stage_arguments(schedule, stage) if arg != "ckpt_path=last"]
        command = shlex.join(["python", stage.script, *args])
        if stage.script == "evaluate.py" and stage.report:
            if stage.versus in [spec.label for spec in evals]:
                pairs.append((stage.report, stage.versus))
            evals.append(RunSpec(stage.report, directory))
            commands[stage.report] = command
        elif stage.script == "train.py" and not (directory / "curves.json").is_file():
            # a stage whose record kept its export but not its curves (STAGE_DONE says why)
            console.print(f"pipeline {name}: {stage.name} has no curves: {read_done(directory).get('note', 'none kept')}")
        elif stage.script == "train.py" and read_json(directory / "curves.json", stage.name)["train"].get("reward/mean"):
            trains.append(RunSpec(stage.name, directory))
            commands[stage.name] = command
    if waiting:
        console.print(f"pipeline {name}: not finished yet, left out: {', '.join(waiting)}")
    return evals, trains, pairs, commands


def word_count(prediction: object) -> int:
    return len(str(prediction).split())


def length_bucket(words: int) -> str:
    if words <= 6:
        return str(words)
    return "7-10" if words <= 10 else "11-20" if words <= 20 else ">20"


def length_distribution(predictions: Sequence[dict]) -> dict[str, dict[str, float]]:
    counts = dict.fromkeys(LENGTH_BUCKETS, 0)
    for row in predictions:
        counts[length_bucket(word_count(row["prediction"]))] += 1
    return {"counts": counts, "percent": {bucket: 100.0 * n / len(predictions) for bucket, n in counts.items()}}


# --- evaluation rows ---------------------------------------------------------------------------


def bank_writer(settings: Mapping) -> tuple[str, str | None]:
    """(bank policy, the writing Manager's checkpoint; None for ADD-all or the prompted Manager)."""
    recipe = settings["bank_recipe"]
    return recipe["policy"], recipe["writer"].get("manager", {}).get("ckpt")


def eval_row(spec: RunSpec, command: str | None) -> tuple[dict, list[dict]]:
    """The report row of one evaluation run dir, and its predictions."""
    what = f"--eval {spec.label!r}"
    report = EvalReport.read(spec.path)
    predictions = read_predictions(spec.path / "predictions.jsonl", what)
    scores, settings = report.scores, report.settings
    names = category_names(settings["data"])
    categories = report.categories()
    answer_latency = report.latency["answer"]
    answer = settings["answer"]
    banks, manager_ckpt = bank_writer(settings)
    row = {
        "label": spec.label,
        "dir": str(spec.path),
        "count": int(scores["count"]),
        **{key: scores[key] for key, _ in SCORES},
        "per_category": {
            str(category): {
                "name": names.get(category, str(category)),
                "count": int(scores[f"count/cat{category}"]),
                **{key: scores[f"{key}/cat{category}"] for key, _ in SCORES},
                **{key: scores.get(f"{key}/cat{category}") for key, _ in DISTILL_COLUMNS},
            }
            for category in categories
        },
        "format_error_rate": scores["format_error_rate"],
        # Did the distilling agent keep its memory list, and were the memories it chose the evidence?
        "memory_listed_pct": scores[MEMORY_LISTED] if answer["distill"] else None,
        **{key: scores.get(key) for key, _ in DISTILL_COLUMNS},
        "mean_answer_words": scores["mean_answer_words"],
        "wall_time_s": settings["wall_time_s"],
        "answer_latency_s": {"p50": answer_latency["p50_s"], "p95": answer_latency["p95_s"]},
        "settings": {
            "ckpt": answer["ckpt"],
            "k_per_speaker": answer["k_per_speaker"],
            "max_new_tokens": answer["max_new_tokens"],
            "distill": answer["distill"],
            "banks": banks,
            "manager_ckpt": manager_ckpt,
            "memory": settings["memory"],
            "split": settings["split"],
        },
        # What the banks' writer did with the facts (None in reports written before evaluate.py counted
        # it), and the memories it left in the banks.
        "bank_operations": settings.get("bank_operations"),
        "bank_size": sum(settings["bank_sizes"].values()),
        "length_distribution": length_distribution(predictions),
    }
    if command is not None:
        row["command"] = command
    return row, predictions


def parse_pair(text: str) -> tuple[str, str]:
    """`B=A` (two --eval labels): B compared against A; split on the last '=' as LABEL=DIR is."""
    trained, sep, base = text.rpartition("=")
    if not sep or not trained.strip() or not base.strip():
        raise argparse.ArgumentTypeError(f"expected TRAINED=BASE (two --eval labels), got {text!r}")
    return trained.strip(), base.strip()


def compare_labels(base: str, trained: str, paths: Mapping[str, Path], seed: int) -> tuple[dict, str]:
    """`trained` against `base`, paired over the questions both answered (`memr1 compare`): its JSON
    (labels for run names) and its markdown table with the verdict."""
    base_run = ScoredRun.read(base, paths[base])
    comparison = compare_labelled(base_run, ScoredRun.read(trained, paths[trained]), seed=seed)
    names = category_names(base_run.report.settings["data"])
    return comparison.to_json() | {"verdict": comparison.verdict()}, comparison_markdown(comparison, names)


def sample_predictions(base: Sequence[dict], trained: Sequence[dict], count: int, seed: int) -> list[dict]:
    """`count` question ids drawn with `seed` from those both runs answered, in id order of the draw."""
    base_by_id = {row["qid"]: row for row in base}
    trained_by_id = {row["qid"]: row for row in trained}
    shared = sorted(base_by_id.keys() & trained_by_id.keys())
    if not shared:
        raise SystemExit("error: --base and --trained predictions share no question id (qid)")
    chosen = random.Random(seed).sample(shared, min(count, len(shared)))
    samples = []
    for qid in chosen:
        before, after = base_by_id[qid], trained_by_id[qid]
        samples.append(
            {
                "qid": qid,
                "category": before.get("category"),
                "question": before["question"],
                "gold": before["gold"],
                "base": before["prediction"],
                "trained": after["prediction"],
                "base_f1": 100.0 * token_f1(before["prediction"], before["gold"]),
                "trained_f1": 100.0 * token_f1(after["prediction"], after["gold"]),
            }
        )
    return samples


# --- training runs -----------------------------------------------------------------------------


def read_metrics_csv(path: Path, what: str) -> list[dict[str, float]]:
    """Rows of Lightning's CSVLogger with the empty cells dropped and the rest as floats."""
    with require(path, what).open(newline="") as handle:
        return [{key: float(value) for key, value in row.items() if value not in ("", None)} for row in csv.DictReader(handle)]


def log_wall_time_s(path: Path) -> float | None:
    """Seconds train.log's processes ran, summed: a run resumed across sessions has one segment per
    start of train.py (its `torch uses` line and the lines logged in the seconds just before it), and
    the time between the last line of one and the start of the next is not the run's. None with fewer
    than two timestamped lines."""
    if not path.is_file():
        return None
    lines = [(datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f"), line)
             for line in path.read_text().splitlines() if (match := LOG_TIMESTAMP.match(line))]
    if len(lines) < 2:
        return None
    starts = [0]
    for index, (stamp, line) in enumerate(lines):
        if RUN_START in line:
            first = index
            while first > starts[-1] and (stamp - lines[first - 1][0]).total_seconds() <= START_LINES_S:
                first -= 1
            if first > starts[-1]:  # not the first process's own start
                starts.append(first)
    ends = [*starts[1:], len(lines)]
    return sum((lines[end - 1][0] - lines[start][0]).total_seconds() for start, end in zip(starts, ends) if end > start)


def quarter_means(values: Sequence[float], scale: float = 1.0) -> dict[str, float | None]:
    """Means (times `scale`) over the first and last quarter (at least one value each) of `values`."""
    if not values:
        return {"first_quarter": None, "last_quarter": None}
    size = max(1, math.ceil(len(values) / 4))
    return {"first_quarter": scale * mean(values[:size]), "last_quarter": scale * mean(values[-size:])}


def stage_key(stage: str) -> tuple[int, str]:
    return (STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER), stage)


def train_summary(spec: RunSpec, command: str | None) -> dict:
    what = f"--train {spec.label!r}"
    curves = read_json(spec.path / "curves.json", what)
    # Rows with reward/mean are the training steps; the others are lr or validation rows.
    step_rows = [row for row in read_metrics_csv(spec.path / "csv" / "metrics.csv", what) if "reward/mean" in row]
    reward_by_step = curves["train"].get("reward/mean", [])
    steps = len(reward_by_step) or len(step_rows)
    # time/rollout_tokens_per_s also ends in _s but is a rate, not a stage's seconds.
    stage_columns = sorted(
        {key for row in step_rows for key in row if key.startswith("time/") and key.endswith("_s") and not key.endswith("_per_s")}
    )
    seconds_per_step = {
        column.removeprefix("time/").removesuffix("_s"): mean(row[column] for row in step_rows if column in row)
        for column in stage_columns
    }
    wall_time_s = log_wall_time_s(spec.path / "train.log")
    wall_time_source = "train.log"
    if wall_time_s is None:
        wall_time_s = sum(row.get(column, 0.0) for row in step_rows for column in stage_columns)
        wall_time_source = "csv (sum of time/*_s, excludes validation)"
    val = curves["val"]
    primary = next((key for key in PRIMARY_VAL_KEYS if val.get(key)), None)
    best = max(val[primary], key=lambda point: point[1]) if primary else None

    def column(name: str) -> list[float]:
        return [row[name] for row in step_rows if name in row]

    summary = {
        "label": spec.label,
        "dir": str(spec.path),
        "steps": steps,
        "wall_time_s": wall_time_s,
        "wall_time_source": wall_time_source,
        "seconds_per_step": seconds_per_step,
        "reward_mean_by_step": reward_by_step,
        # The same fixed training states at every probe: the curve that compares like with like.
        "probe_reward_by_step": [[int(row["step"]), row["train/probe_reward"]] for row in step_rows if "train/probe_reward" in row],
        "val_by_step": val,
        "primary_val": primary,
        "best_val": {"key": primary, "value": best[1], "step": best[0]} if best else None,
        "reward_mean": quarter_means([value for _, value in reward_by_step]),
        # Logged as fractions; percent here, like the evaluation rows' format_error_rate.
        "zero_std_group_pct": quarter_means(column("reward/zero_std_group_frac"), 100.0),
        "format_error_pct": quarter_means(column("response/format_error_rate"), 100.0),
        # A Manager run's sampled operations (ops/<kind>_frac): which actions RL explored at all.
        "sampled_operation_pct": {kind: quarter_means(column(f"ops/{kind.lower()}_frac"), 100.0) for kind in OPERATION_KINDS}
        if column("ops/add_frac") else None,
    }
    if command is not None:
        summary["command"] = command
    return summary


# --- markdown ----------------------------------------------------------------------------------


def operation_shares(operations: dict | None) -> str:
    """'90.1 / 1.0 / 0.1 / 8.8 (malformed 12)': each operation's share of the facts the banks were built from."""
    if operations is None:
        return ""
    total = max(sum(operations[kind] for kind in OPERATION_KINDS), 1)
    shares = " / ".join(f"{100.0 * operations[kind] / total:.1f}" for kind in OPERATION_KINDS)
    return shares if not operations.get("malformed") else f"{shares} (malformed {operations['malformed']})"


def scores_table(rows: Sequence[dict]) -> str:
    header = ["Run", "n", *(title for _, title in SCORES), "Format errors %", "Memory listed %", *(title for _, title in DISTILL_COLUMNS),
              "Mean words", "Banks", "Writes ADD / UPDATE / DELETE / NOOP %", "Memories in the banks", "Wall time (min)"]
    body = [
        [
            cell(row["label"]),
            str(row["count"]),
            *(number(row[key]) for key, _ in SCORES),
            number(row["format_error_rate"], 1),
            number(row["memory_listed_pct"], 1),
            *(number(row[key], 1) for key, _ in DISTILL_COLUMNS),
            number(row["mean_answer_words"], 1),
            row["settings"]["banks"],
            operation_shares(row["bank_operations"]),
            str(row["bank_size"]),
            number(row["wall_time_s"] / 60, 1),
        ]
        for row in rows
    ]
    return markdown_table(header, ["---", "---:", *["---:"] * (len(SCORES) + len(DISTILL_COLUMNS) + 3), "---", *["---:"] * 3], body)


# A comparison's verdict (B is the row, A its starting point) as the closing table words it.
VERDICT_AGAINST_START = {"B better": "better", "A better": "worse", "within noise": "within noise"}


def closing_table(rows: Sequence[dict], comparisons: Sequence[dict]) -> str:
    """One line a row: its scores and, where it has a starting point, the paired F1 difference from
    it with the 95% interval and how many answers changed."""
    against = {pair["b"]: pair for pair in comparisons}
    header = ["Run", *(title for _, title in SCORES), "Against", "ΔF1 [95% CI]", "Answers changed"]
    body = []
    for row in rows:
        pair = against.get(row["label"])
        f1 = pair["overall"]["f1"] if pair else None
        body.append([
            cell(row["label"]),
            *(number(row[key]) for key, _ in SCORES),
            cell(pair["a"]) if pair else "",
            f"{f1['delta']:+.2f} [{f1['low']:+.2f}, {f1['high']:+.2f}] ({VERDICT_AGAINST_START[f1['verdict']]})" if f1 else "",
            f"{pair['changed']} of {pair['common']}" if pair else "",
        ])
    return markdown_table(header, ["---", *["---:"] * len(SCORES), "---", "---", "---:"], body)


def category_table(rows: Sequence[dict]) -> str:
    categories = sorted({int(c) for row in rows for c in row["per_category"]})
    names = {}
    for row in rows:
        for category, entry in row["per_category"].items():
            names.setdefault(int(category), f"{category} {entry['name']} (n={entry['count']})")
    body = [
        [cell(row["label"]), *(number(row["per_category"].get(str(c), {}).get("f1")) for c in categories), number(row["f1"])]
        for row in rows
    ]
    return markdown_table(["Run (F1)", *(names[c] for c in categories), "Overall"], ["---", *["---:"] * (len(categories) + 1)], body)


def length_table(rows: Sequence[dict]) -> str:
    body = [[cell(row["label"]), *(number(row["length_distribution"]["percent"][b], 1) for b in LENGTH_BUCKETS)] for row in rows]
    return markdown_table(["Run (% of answers by word count)", *LENGTH_BUCKETS], ["---", *["---:"] * len(LENGTH_BUCKETS)], body)


def samples_table(samples: Sequence[dict]) -> str:
    body = [
        [
            cell(s["question"], SAMPLE_CELL_CHARS),
            cell(s["gold"], SAMPLE_CELL_CHARS),
            f"{cell(s['base'], SAMPLE_CELL_CHARS)} (F1 {s['base_f1']:.0f})",
            f"{cell(s['trained'], SAMPLE_CELL_CHARS)} (F1 {s['trained_f1']:.0f})",
        ]
        for s in samples
    ]
    return markdown_table(["Question", "Gold", "Base", "Trained"], ["---"] * 4, body)


def operation_quarters(shares: Mapping[str, Mapping[str, float | None]] | None) -> str:
    """'84/0/0/16 → 88/0/0/12': a Manager run's sampled operations, first and last quarter; '–' for others."""
    if shares is None:
        return "–"
    return " → ".join("/".join(number(shares[kind][quarter], 0) for kind in OPERATION_KINDS) for quarter in ("first_quarter", "last_quarter"))


def training_table(runs: Sequence[dict]) -> str:
    stages = sorted({stage for run in runs for stage in run["seconds_per_step"]}, key=stage_key)

    def quarters(entry: Mapping[str, float | None], digits: int) -> str:
        return f"{number(entry['first_quarter'], digits)} → {number(entry['last_quarter'], digits)}"

    body = []
    for run in runs:
        best = run["best_val"]
        body.append(
            [
                cell(run["label"]),
                str(run["steps"]),
                number(run["wall_time_s"] / 60, 1),
                *(number(run["seconds_per_step"].get(stage), 1) for stage in stages),
                quarters(run["reward_mean"], digits=3),
                quarters(run["zero_std_group_pct"], 0),
                quarters(run["format_error_pct"], 0),
                operation_quarters(run["sampled_operation_pct"]),
                f"{best['key']} {best['value']:.2f} @ {best['step']}" if best else "–",
            ]
        )
    header = [
        "Run",
        "Steps",
        "Wall time (min)",
        *(f"{stage} s/step" for stage in stages),
        "reward/mean (first → last ¼)",
        "zero-std groups % (first → last ¼)",
        "format errors % (first → last ¼)",
        "sampled ADD / UPDATE / DELETE / NOOP % (first → last ¼)",
        "Best val @ step",
    ]
    return markdown_table(header, ["---", *["---:"] * (len(header) - 1)], body)


def markdown(report: dict) -> str:
    base, trained = report["comparison"]["base"], report["comparison"]["trained"]
    sections = [
        ("Every row against its starting point (paired, 95% bootstrap interval)", closing_table(report["eval"], report["comparisons"])),
        ("Scores (0-100)", scores_table(report["eval"])),
        *((f"{pair['b']} against {pair['a']} (paired, 95% bootstrap interval)", pair["markdown"]) for pair in report["comparisons"]),
        ("F1 by category", category_table(report["eval"])),
        ("Answer length", length_table(report["eval"])),
        (f"Samples: {base} vs {trained} (seed {report['comparison']['seed']})", samples_table(report["comparison"]["samples"])),
        ("Training", training_table(report["train"])),
    ]
    return "\n\n".join(f"### {title}\n\n{body}" for title, body in sections) + "\n"


# A page that holds the tables between these two lines (docs/cpu_lift.md) keeps its prose around them.
TABLES_BEGIN = "<!-- lift_report tables: begin (generated by scripts/lift_report.py; edits here are overwritten) -->"
TABLES_END = "<!-- lift_report tables: end -->"


def write_markdown(path: Path, tables: str) -> None:
    """Write `tables` between `path`'s TABLES_BEGIN / TABLES_END lines, keeping what is around them; a
    new file is the tables between the two lines. A file without them is refused: it is prose."""
    block = f"{TABLES_BEGIN}\n\n{tables}\n{TABLES_END}"
    if not path.exists():
        path.write_text(block + "\n")
        return
    text = path.read_text()
    begin, end = text.find(TABLES_BEGIN), text.find(TABLES_END)
    if begin < 0 or end < begin:
        raise SystemExit(f"error: --markdown-out {path}: no {TABLES_BEGIN!r} line before a {TABLES_END!r} line; "
                         f"the tables go between them (add both where they belong, or name a new file)")
    path.write_text(text[:begin] + block + text[end + len(TABLES_END):])


# --- figure ------------------------------------------------------------------------------------


def plot_training(runs: Sequence[dict], path: Path) -> None:
    """One panel per run: reward/mean and train/probe_reward by step (left axis), the primary val score
    (markers, right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    columns = min(len(runs), 3)
    rows = math.ceil(len(runs) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 3.8 * rows), squeeze=False)
    for axis, run in zip(axes.flat, runs):
        if run["reward_mean_by_step"]:
            steps, rewards = zip(*run["reward_mean_by_step"])
            axis.plot(steps, rewards, color="tab:blue", label="reward/mean")
        if run["probe_reward_by_step"]:
            steps, probes = zip(*run["probe_reward_by_step"])
            axis.plot(steps, probes, color="tab:green", marker="s", label="train/probe_reward")
            axis.legend(loc="upper left", fontsize="small")
        axis.set_xlabel("step")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_ylabel("reward/mean", color="tab:blue")
        axis.set_title(run["label"])
        if run["primary_val"]:
            steps, values = zip(*run["val_by_step"][run["primary_val"]])
            right = axis.twinx()
            right.plot(steps, values, color="tab:orange", marker="o", linestyle="--", label=run["primary_val"])
            right.set_ylabel(run["primary_val"], color="tab:orange")
    for axis in list(axes.flat)[len(runs) :]:
        axis.set_visible(False)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


# --- main --------------------------------------------------------------------------------------


def print_summary(console: Console, rows: Sequence[dict], comparisons: Sequence[dict]) -> None:
    summary = Table(title="CPU lift: evaluation rows")
    for name in ("run", "n", *(title for _, title in SCORES), "format err %", "mean words", "wall min"):
        summary.add_column(name, justify="left" if name == "run" else "right")
    for row in rows:
        summary.add_row(
            row["label"],
            str(row["count"]),
            *(f"{row[key]:.2f}" for key, _ in SCORES),
            f"{row['format_error_rate']:.1f}",
            f"{row['mean_answer_words']:.1f}",
            f"{row['wall_time_s'] / 60:.1f}",
        )
    console.print(summary)
    for pair in comparisons:
        console.print(pair["verdict"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run_dir = {"type": parse_spec, "action": "append", "default": [], "metavar": "LABEL=DIR"}
    parser.add_argument("--pipeline", help="read the runs, pairs and commands from this `memr1 pipeline` schedule")
    parser.add_argument("--eval", help="an evaluate.py run dir (repeatable, order kept)", **run_dir)
    parser.add_argument("--train", help="a train.py run dir (repeatable)", **run_dir)
    parser.add_argument("--base", help="the --eval label compared against (with --pipeline: its first versus)")
    parser.add_argument("--trained", help="the --eval label compared with --base")
    parser.add_argument("--versus", type=parse_pair, action="append", default=[], metavar="TRAINED=BASE",
                        help="another pair of --eval labels to compare (repeatable)")
    parser.add_argument("--commands", type=Path, help="label<TAB>command lines: the command behind each run")
    parser.add_argument("--samples", type=int, default=20, help="sample questions shown for --base vs --trained")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample question draw")
    parser.add_argument("--json", type=Path, default=Path("docs/cpu_lift.json"))
    parser.add_argument("--markdown-out", type=Path, default=Path("docs/cpu_lift.md"))
    parser.add_argument("--figure", type=Path, default=Path("docs/cpu_lift_curves.png"))
    args = parser.parse_args()
    console = Console(width=150)
    commands = read_commands(args.commands)
    if args.pipeline:
        evals, trains, pairs, scheduled = pipeline_runs(args.pipeline, console)
        args.eval, args.train, commands = evals + args.eval, trains + args.train, scheduled | commands
        if pairs and args.base is None and args.trained is None:
            (args.trained, args.base), pairs = pairs[0], pairs[1:]
        args.versus = pairs + args.versus
    for option in ("eval", "train", "base", "trained"):
        if not getattr(args, option):
            parser.error(f"--{option} is required (or --pipeline, once a stage of that kind has finished)")

    labels = [spec.label for spec in args.eval + args.train]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        parser.error(f"labels must be unique across --eval and --train: {duplicates}")
    eval_labels = [spec.label for spec in args.eval]
    pairs = [(args.trained, args.base), *args.versus]
    for option, label in (("--base", args.base), ("--trained", args.trained), *(("--versus", label) for pair in args.versus for label in pair)):
        if label not in eval_labels:
            parser.error(f"{option} {label!r} is not an --eval label; expected one of {eval_labels}")
    for label in sorted(commands.keys() - set(labels)):
        console.print(f"[yellow]warning: --commands label {label!r} matches no --eval or --train label")

    evaluated = [eval_row(spec, commands.get(spec.label)) for spec in args.eval]
    rows = [row for row, _ in evaluated]
    predictions = {row["label"]: rows_predictions for row, rows_predictions in evaluated}
    paths = {spec.label: spec.path for spec in args.eval}
    comparisons = []
    for trained, base in pairs:
        result, table_markdown = compare_labels(base, trained, paths, args.seed)
        comparisons.append(result | {"markdown": table_markdown})
    report = {
        "generated_by": shlex.join([sys.executable, *sys.argv]),
        "eval": rows,
        "comparisons": comparisons,
        "comparison": {
            "base": args.base,
            "trained": args.trained,
            "seed": args.seed,
            "samples": sample_predictions(predictions[args.base], predictions[args.trained], args.samples, args.seed),
        },
        "train": [train_summary(spec, commands.get(spec.label)) for spec in args.train],
    }

    for path in (args.json, args.markdown_out):
        path.parent.mkdir(parents=True, exist_ok=True)
    write_markdown(args.markdown_out, markdown(report))  # first: a page it refuses leaves nothing half-written
    args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    plot_training(report["train"], args.figure)
    print_summary(console, rows, comparisons)
    console.print(f"wrote {args.json}, {args.markdown_out}, {args.figure}")


if __name__ == "__main__":
    main()
