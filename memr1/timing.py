"""Per-stage latency bookkeeping for the pipeline's reports."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator

import numpy as np


class StageTimer:
    """Collects seconds per item for named stages and summarises them as p50 / p95.

    A batched call that serves n items records its wall time divided by n for each of them, so a
    stage's percentiles read as "seconds per item" whatever the batch size.
    """

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = defaultdict(list)

    @contextmanager
    def time(self, stage: str, items: int = 1) -> Iterator[None]:
        start = time.perf_counter()
        yield
        per_item = (time.perf_counter() - start) / max(items, 1)
        self.samples[stage].extend([per_item] * max(items, 1))

    def summary(self) -> dict[str, dict[str, float]]:
        return {
            stage: {
                "p50_s": float(np.percentile(values, 50)),
                "p95_s": float(np.percentile(values, 95)),
                "mean_s": float(np.mean(values)),
                "count": len(values),
            }
            for stage, values in self.samples.items()
            if values
        }
