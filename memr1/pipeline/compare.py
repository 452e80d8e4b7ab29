"""Paired comparison of evaluation runs (`memr1 compare RUN_A RUN_B ...`): over the questions both runs
answered, the mean difference B - A of each question's F1, BLEU-1 and EM (the Mem0 protocol's scores,
x100) with a 95% percentile-bootstrap interval, overall and per LoCoMo category, and a verdict in
words: "B better" when the interval lies above 0, "A better" when below, "within noise" otherwise.

Paired, because the two runs answered the same questions: the question-to-question spread (some are
hard for every agent) cancels in the differences, so the interval is far narrower than two separate
intervals would be. Questions only one run answered are left out and counted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memr1.metrics.lexical import LEXICAL_METRICS, answer_scores

PREDICTIONS = "predictions.jsonl"
METRICS = LEXICAL_METRICS
TITLES = {"f1": "F1", "bleu1": "BLEU-1", "em": "EM"}


@dataclass(frozen=True)
class Interval:
    """The mean paired difference B - A and its percentile-bootstrap interval at `level`."""

    delta: float
    low: float
    high: float
    level: float = 0.95

    def verdict(self) -> str:
        if self.low > 0:
            return "B better"
        if self.high < 0:
            return "A better"
        return "within noise"

    def text(self) -> str:
        return f"{self.delta:+.2f} [{self.low:+.2f}, {self.high:+.2f}]"


def paired_bootstrap(differences: Sequence[float] | np.ndarray, resamples: int = 10_000, seed: int = 0, level: float = 0.95) -> Interval:
    """The mean of `differences` (n,) and the `level` percentile interval of the mean over `resamples`
    resamples of the n questions with replacement (numpy's default generator seeded with `seed`)."""
    values = np.asarray(differences, dtype=np.float64)
    if values.ndim != 1 or len(values) == 0:
        raise ValueError(f"paired_bootstrap: need a non-empty 1-D array of differences, got shape {values.shape}")
    if resamples < 1 or not 0 < level < 1:
        raise ValueError(f"paired_bootstrap: resamples must be >= 1 and level in (0, 1), got {resamples}, {level}")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return Interval(float(values.mean()), float(low), float(high), level)


@dataclass(frozen=True)
class MetricRow:
    """One score of one question set: A's and B's means (0..100) and the paired difference."""

    mean_a: float
    mean_b: float
    interval: Interval


@dataclass
class Comparison:
    run_a: str
    run_b: str
    common: int
    only_a: int
    only_b: int
    changed: int = 0  # common questions whose predicted answer differs
    overall: dict[str, MetricRow] = field(default_factory=dict)
    by_category: dict[int, tuple[int, dict[str, MetricRow]]] = field(default_factory=dict)

    def verdict(self, metric: str = "f1") -> str:
        """One sentence naming the runs: B beats A, is worse than A, or is within noise of A ("beats"
        only when the paired interval excludes 0), the difference with its interval, and how many of
        the common answers changed (how far B moved)."""
        interval = self.overall[metric].interval
        verb = {"B better": "beats", "A better": "is worse than"}.get(interval.verdict(), "is within noise of")
        return f"{self.run_b} {verb} {self.run_a}: {TITLES[metric]} {interval.text()}; {self.changed} of {self.common} answers differ."

    def to_json(self) -> dict[str, Any]:
        def rows(metrics: Mapping[str, MetricRow]) -> dict[str, Any]:
            return {
                name: {"a": r.mean_a, "b": r.mean_b, "delta": r.interval.delta, "low": r.interval.low,
                       "high": r.interval.high, "verdict": r.interval.verdict()}
                for name, r in metrics.items()
            }

        return {
            "a": self.run_a, "b": self.run_b, "common": self.common, "only_a": self.only_a, "only_b": self.only_b,
            "changed": self.changed,
            "overall": rows(self.overall),
            "by_category": {str(c): {"n": n, **rows(metrics)} for c, (n, metrics) in self.by_category.items()},
        }


def read_predictions(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """qid -> prediction row of a run directory's `predictions.jsonl` (evaluate.py's), each checked for
    the fields a comparison reads; a bad line is an error naming the file and line."""
    path = Path(run_dir) / PREDICTIONS
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; pass an evaluation run directory (evaluate.py's hydra.run.dir)")
    rows: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error.msg})") from None
        missing = [key for key in ("qid", "gold", "prediction", "category") if key not in row]
        if missing:
            raise ValueError(f"{path}:{number}: missing {', '.join(missing)}")
        rows[str(row["qid"])] = row
    return rows


def question_scores(row: Mapping[str, Any]) -> dict[str, float]:
    """F1, BLEU-1 and EM of one prediction, x100 (QAMetrics' scale): as evaluation stored them with the
    answer, or scored here for a file written before evaluations stored them."""
    stored = row.get("scores")
    if isinstance(stored, Mapping) and all(name in stored for name in METRICS):
        return {name: float(stored[name]) for name in METRICS}
    return answer_scores(row["prediction"], row["gold"])


def _metric_rows(a: list[dict[str, float]], b: list[dict[str, float]], resamples: int, seed: int) -> dict[str, MetricRow]:
    rows = {}
    for name in METRICS:
        first = np.array([scores[name] for scores in a])
        second = np.array([scores[name] for scores in b])
        rows[name] = MetricRow(float(first.mean()), float(second.mean()), paired_bootstrap(second - first, resamples, seed))
    return rows


def compare_runs(run_a: str | Path, run_b: str | Path, resamples: int = 10_000, seed: int = 0) -> Comparison:
    """B against A over the questions both answered, overall and per category (`Comparison`)."""
    a, b = read_predictions(run_a), read_predictions(run_b)
    common = [qid for qid in a if qid in b]
    if not common:
        raise ValueError(f"{run_a} and {run_b} answered no question in common: nothing to compare")
    changed = sum(a[qid]["prediction"] != b[qid]["prediction"] for qid in common)
    comparison = Comparison(str(run_a), str(run_b), len(common), len(a) - len(common), len(b) - len(common), changed)
    scores_a = {qid: question_scores(a[qid]) for qid in common}
    scores_b = {qid: question_scores(b[qid]) for qid in common}
    comparison.overall = _metric_rows([scores_a[q] for q in common], [scores_b[q] for q in common], resamples, seed)
    for category in sorted({int(a[qid]["category"]) for qid in common}):
        qids = [qid for qid in common if int(a[qid]["category"]) == category]
        metrics = _metric_rows([scores_a[q] for q in qids], [scores_b[q] for q in qids], resamples, seed)
        comparison.by_category[category] = (len(qids), metrics)
    return comparison


def markdown(comparison: Comparison, category_names: Mapping[int, str] | None = None) -> str:
    """The comparison as a table: a row per category and Overall, each score's A, B and Δ [95% CI]."""
    names = category_names or {}
    header = "| questions | n | " + " | ".join(f"{TITLES[m]} A | {TITLES[m]} B | Δ{TITLES[m]} [95% CI]" for m in METRICS) + " |"
    lines = [header, "|---|---:|" + "---:|---:|---|" * len(METRICS)]

    def cells(metrics: Mapping[str, MetricRow]) -> str:
        return " | ".join(f"{r.mean_a:.2f} | {r.mean_b:.2f} | {r.interval.text()} ({r.interval.verdict()})" for r in metrics.values())

    for category, (count, metrics) in comparison.by_category.items():
        lines.append(f"| {category} {names.get(category, '')}".rstrip() + f" | {count} | {cells(metrics)} |")
    lines.append(f"| **Overall** | {comparison.common} | {cells(comparison.overall)} |")
    left_out = ""
    if comparison.only_a or comparison.only_b:
        left_out = f" Left out: {comparison.only_a} questions only A answered, {comparison.only_b} only B."
    return f"A = {comparison.run_a}, B = {comparison.run_b}.{left_out}\n\n" + "\n".join(lines) + f"\n\n{comparison.verdict()}"
