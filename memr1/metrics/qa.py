"""`QAMetrics`: EM / F1 / BLEU-1 over a question set, overall and per LoCoMo category, DDP-ready."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torchmetrics import Metric

from memr1.metrics.lexical import Answer, bleu1, exact_match, token_f1

_SCORES = {"em": exact_match, "f1": token_f1, "bleu1": bleu1}


class QAMetrics(Metric):
    """Accumulates the Mem0 lexical scores per question category and reports them in 0..100.

    The states are fixed-size sums and counts indexed by category ``0..max_category``, reduced with
    ``sum``, so every rank holds the same shapes and DDP synchronisation is a plain all-reduce.
    LoCoMo's categories are 1 single-hop, 2 temporal, 3 multi-hop, 4 open-domain (5, adversarial, is
    usually excluded upstream but is accepted here).

    `compute` returns, as percentages (×100, like the paper's tables):
    ``em``, ``f1``, ``bleu1`` (means over all questions, NaN before any update), ``count``, and for
    every category that has questions ``em/cat{c}``, ``f1/cat{c}``, ``bleu1/cat{c}``, ``count/cat{c}``
    (counts are plain numbers of questions).
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, max_category: int = 5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if max_category < 0:
            raise ValueError(f"max_category: must be >= 0, got {max_category}")
        self.max_category = max_category
        # float64 sums: thousands of scores in [0, 1] accumulate without float32 rounding drift.
        for name in _SCORES:
            self.add_state(f"{name}_sum", torch.zeros(max_category + 1, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros(max_category + 1, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, preds: Sequence[Answer], golds: Sequence[Answer], categories: Sequence[int]) -> None:
        """Score each (pred, gold) pair and add it to its category. All three sequences align."""
        if not (len(preds) == len(golds) == len(categories)):
            raise ValueError(
                f"QAMetrics.update: preds, golds and categories must have equal lengths, "
                f"got {len(preds)}, {len(golds)}, {len(categories)}"
            )
        for position, category in enumerate(categories):
            if isinstance(category, bool) or not isinstance(category, int):
                raise TypeError(
                    f"QAMetrics.update: categories[{position}]: expected int, "
                    f"got {type(category).__name__}: {category!r}"
                )
            if not 0 <= category <= self.max_category:
                raise ValueError(
                    f"QAMetrics.update: categories[{position}]: {category} is outside "
                    f"0..max_category={self.max_category}; raise max_category in the metric's config"
                )
        rows = []
        for position, (pred, gold) in enumerate(zip(preds, golds)):
            try:
                rows.append([score(pred, gold) for score in _SCORES.values()])
            except TypeError as error:
                raise TypeError(f"QAMetrics.update: question {position}: {error}") from error
        # Scored in full before any state changes, so a rejected batch leaves the sums untouched.
        device = self.count.device
        index = torch.tensor(list(categories), dtype=torch.long, device=device)
        scores = torch.tensor(rows, dtype=torch.float64, device=device).reshape(len(rows), len(_SCORES))
        for column, name in enumerate(_SCORES):
            getattr(self, f"{name}_sum").index_add_(0, index, scores[:, column])
        self.count.index_add_(0, index, torch.ones_like(index, dtype=torch.float64))

    def compute(self) -> dict[str, float]:
        total = self.count.sum().item()
        report: dict[str, float] = {}
        for name in _SCORES:
            sums = getattr(self, f"{name}_sum")
            report[name] = 100.0 * sums.sum().item() / total if total else float("nan")
        report["count"] = total
        for category in torch.nonzero(self.count).flatten().tolist():
            questions = self.count[category].item()
            for name in _SCORES:
                report[f"{name}/cat{category}"] = 100.0 * getattr(self, f"{name}_sum")[category].item() / questions
            report[f"count/cat{category}"] = questions
        return report
