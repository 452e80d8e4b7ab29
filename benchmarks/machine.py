"""The machine a benchmark ran on, written into its JSON beside the numbers: the ratios are measured in
one run, but the load on the cores while it ran still colours them."""

from __future__ import annotations

import os
import platform
from typing import Any

import torch


def machine_info(load_before: float, load_after: float | None = None, **extra: Any) -> dict[str, Any]:
    """Platform, CPUs, torch and its threads, OMP_NUM_THREADS and the 1-minute load average around the
    run; `extra` adds benchmark-specific versions (e.g. transformers)."""
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_average_1min_before": load_before,
        "load_average_1min_after": load_after,
        **extra,
    }
