"""Markdown tables of evaluation runs, shared by the schedule's closing table (`memr1 pipeline`) and
the lift report (`scripts/lift_report.py`): cells, numbers, and the table of runs scored against a
base, each with its paired F1 difference and 95% interval (`memr1 compare`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from memr1.pipeline.compare import Comparison, compare_runs
from memr1.pipeline.report_file import LEXICAL_COLUMNS, EvalReport

SCORED_COLUMNS = (*LEXICAL_COLUMNS, ("format_error_rate", "format errors %"), ("mean_answer_words", "mean words"))


def cell(value: object, limit: int | None = None) -> str:
    """`value` as one markdown table cell: no newlines, pipes escaped, optionally shortened."""
    text = " ".join(str(value).split())
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("|", "\\|")


def number(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def markdown_table(header: Sequence[str], align: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table; `align` holds each column's `---` / `---:` marker."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass(frozen=True)
class ScoredRun:
    """An evaluation run by its label: its directory and report.json."""

    label: str
    directory: Path
    report: EvalReport

    @classmethod
    def read(cls, label: str, directory: Path) -> ScoredRun:
        return cls(label, directory, EvalReport.read(directory))


def compare_labelled(base: ScoredRun, trained: ScoredRun, seed: int = 0) -> Comparison:
    """`trained` against `base`, paired over the questions both answered, its runs named by label."""
    comparison = compare_runs(base.directory, trained.directory, seed=seed)
    comparison.run_a, comparison.run_b = base.label, trained.label
    return comparison


def scores_against_base(runs: Sequence[ScoredRun]) -> tuple[str, list[Comparison]]:
    """The table of `runs` (the first the base): each row's scores, its F1 against the base's paired
    over the same questions with its 95% interval, and its wall time; with each row's comparison."""
    base = runs[0]
    comparisons = [compare_labelled(base, run) for run in runs[1:]]
    deltas = ["base", *(c.overall["f1"].interval.text() for c in comparisons)]
    body = [
        [cell(run.label), *(f"{float(run.report.scores.get(key, float('nan'))):.2f}" for key, _ in SCORED_COLUMNS), delta,
         "" if run.report.wall_time_s is None else str(run.report.wall_time_s)]
        for run, delta in zip(runs, deltas)
    ]
    header = ["agent", *(title for _, title in SCORED_COLUMNS), f"ΔF1 vs {base.label} [95% CI]", "wall s"]
    return markdown_table(header, ["---"] * len(header), body), comparisons
