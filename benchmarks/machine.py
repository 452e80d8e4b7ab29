"""The machine a benchmark ran on, written into its JSON beside the numbers: the ratios are measured in
one run, but the load on the cores while it ran still colours them."""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

from memr1.llm.precision import BF16_CPU_FLAGS, cpu_flags

# The flags that decide a CPU's matmul speed by precision: printed beside every benchmark's numbers.
SPEED_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", *BF16_CPU_FLAGS, "amx_tile")


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def speed_flags() -> list[str]:
    """The CPU's flags among `SPEED_FLAGS`."""
    flags = cpu_flags()
    return [flag for flag in SPEED_FLAGS if flag in flags]


def print_machine() -> None:
    """One line a benchmark prints before its numbers: the CPU, its speed flags, the cores and the load."""
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, flags {' '.join(speed_flags()) or 'none of ' + ' '.join(SPEED_FLAGS)}, "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)


def machine_info(load_before: float, load_after: float | None = None, **extra: Any) -> dict[str, Any]:
    """Platform, CPUs, torch and its threads, OMP_NUM_THREADS and the 1-minute load average around the
    run; `extra` adds benchmark-specific versions (e.g. transformers)."""
    return {
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_speed_flags": speed_flags(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_average_1min_before": load_before,
        "load_average_1min_after": load_after,
        **extra,
    }
