"""Evaluation reports: the paper-style table (F1 / BLEU-1 / EM / J per category), JSON and a bar plot."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memr1.metrics.qa import QAMetrics
from memr1.metrics.judge import Verdict
from memr1.pipeline.answering import Prediction
from memr1.pipeline.report_file import DISTILL_COLUMNS, SCORE_COLUMNS, EvalReport



def score_predictions(
    predictions: Sequence[Prediction], verdicts: Sequence[Verdict] | None = None
) -> dict[str, float]:
    """QAMetrics' scores (0..100) plus J overall and per category when a judge ran."""
    max_category = max((p.category for p in predictions), default=0)
    metric = QAMetrics(max_category=max(max_category, 5))
    if predictions:
        metric.update([p.prediction for p in predictions], [p.gold for p in predictions], [p.category for p in predictions])
    scores = metric.compute()
    if verdicts is not None:
        by_category: dict[int, list[bool]] = {}
        for prediction, verdict in zip(predictions, verdicts):
            by_category.setdefault(prediction.category, []).append(verdict.correct)
        everything = [v.correct for v in verdicts]
        scores["j"] = 100.0 * sum(everything) / len(everything) if everything else float("nan")
        for category, labels in by_category.items():
            scores[f"j/cat{category}"] = 100.0 * sum(labels) / len(labels)
        scores["judge_unreadable"] = sum(not v.readable for v in verdicts)
    scores.update(distillation_scores(predictions))
    return scores


def memory_listed_pct(selected_memories: Sequence[Sequence[str]]) -> float:
    """The share (x100) of a distilling agent's replies, given the memories each listed, that list at
    least one."""
    return 100.0 * sum(bool(lines) for lines in selected_memories) / len(selected_memories)


def distillation_scores(predictions: Sequence[Prediction]) -> dict[str, float]:
    """Mean distillation recall / precision and evidence retrieved (x100), overall and per category,
    over the predictions that have each; nothing for an agent that does not distil."""
    scores: dict[str, float] = {}
    for key, _ in DISTILL_COLUMNS:
        values = [(p.category, getattr(p, key)) for p in predictions if getattr(p, key) is not None]
        if not values:
            continue
        scores[key] = 100.0 * sum(v for _, v in values) / len(values)
        for category in sorted({c for c, _ in values}):
            in_category = [v for c, v in values if c == category]
            scores[f"{key}/cat{category}"] = 100.0 * sum(in_category) / len(in_category)
    return scores


def markdown_table(scores: Mapping[str, float], category_names: Mapping[int, str]) -> str:
    """Rows: each category present, then Overall; columns: count and the scores that exist."""
    columns = [(key, title) for key, title in (*SCORE_COLUMNS, *DISTILL_COLUMNS) if key in scores]
    header = "| Category | n | " + " | ".join(title for _, title in columns) + " |"
    rule = "|---|---:|" + "---:|" * len(columns)
    rows = [header, rule]
    categories = sorted(int(key.split("cat")[1]) for key in scores if key.startswith("count/cat"))
    for category in categories:
        name = category_names.get(category, str(category))
        cells = " | ".join(f"{scores.get(f'{key}/cat{category}', float('nan')):.2f}" for key, _ in columns)
        rows.append(f"| {category} {name} | {int(scores[f'count/cat{category}'])} | {cells} |")
    overall = " | ".join(f"**{scores[key]:.2f}**" for key, _ in columns)
    rows.append(f"| **Overall** | {int(scores['count'])} | {overall} |")
    return "\n".join(rows)


def latency_table(latency: Mapping[str, Mapping[str, float]]) -> str:
    rows = ["| Stage | p50 (s) | p95 (s) | mean (s) | n |", "|---|---:|---:|---:|---:|"]
    for stage, stats in latency.items():
        rows.append(f"| {stage} | {stats['p50_s']:.4f} | {stats['p95_s']:.4f} | {stats['mean_s']:.4f} | {stats['count']} |")
    return "\n".join(rows)


def plot_scores(scores: Mapping[str, float], category_names: Mapping[int, str], path: Path, title: str) -> None:
    """`score_figure` saved as a PNG."""
    import matplotlib.pyplot as plt

    figure = score_figure(scores, category_names, title)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def score_figure(scores: Mapping[str, float], category_names: Mapping[int, str], title: str) -> Any:
    """Grouped bars: one group per category and Overall (each labelled with its n), one bar per score."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = [(key, name) for key, name in SCORE_COLUMNS if key in scores]
    categories = sorted(int(key.split("cat")[1]) for key in scores if key.startswith("count/cat"))
    groups = [
        (f"{category_names.get(c, str(c))}\n(n={int(scores[f'count/cat{c}'])})", {k: scores[f"{k}/cat{c}"] for k, _ in columns})
        for c in categories
    ]
    total = f"\n(n={int(scores['count'])})" if "count" in scores else ""
    groups.append((f"overall{total}", {k: scores[k] for k, _ in columns}))
    width = 0.8 / max(len(columns), 1)
    figure, axes = plt.subplots(figsize=(max(6, 1.6 * len(groups)), 4))
    for offset, (key, name) in enumerate(columns):
        xs = [i + offset * width for i in range(len(groups))]
        axes.bar(xs, [values[key] for _, values in groups], width, label=name)
    axes.set_xticks([i + width * (len(columns) - 1) / 2 for i in range(len(groups))])
    axes.set_xticklabels([name for name, _ in groups])
    axes.set_ylabel("score (0-100)")
    axes.set_ylim(0, 100)
    # Wrapped to the figure's width: a long title (run settings, a checkpoint path) is never cut off.
    axes.set_title("\n".join(textwrap.wrap(title, width=int(figure.get_figwidth() * 11))), fontsize=10)
    axes.legend()
    figure.tight_layout()
    return figure


def write_report(
    run_dir: Path,
    scores: Mapping[str, float],
    latency: Mapping[str, Mapping[str, float]],
    category_names: Mapping[int, str],
    settings: Mapping[str, object],
    title: str,
) -> None:
    """`report.json`, `report.md` and `scores.png` in `run_dir`."""
    EvalReport(title, scores, latency, settings).write(run_dir)
    markdown = [
        f"# {title}",
        "",
        markdown_table(scores, category_names),
        "",
        "Scores in 0-100 (Mem0 LoCoMo protocol: token-set F1, NLTK BLEU-1, lower-cased exact match, LLM judge J).",
        "Distill R / P: the selected memories' recall of the question's evidence turns and the share of them drawn "
        "from evidence; Evidence retrieved: the share of the evidence the retrieved memories held (recall's ceiling).",
        "",
        "## Latency per item",
        "",
        latency_table(latency),
        "",
        "## Settings",
        "",
        "```json",
        json.dumps(settings, indent=2, default=str),
        "```",
        "",
    ]
    (run_dir / "report.md").write_text("\n".join(markdown))
    plot_scores(scores, category_names, run_dir / "scores.png", title)
