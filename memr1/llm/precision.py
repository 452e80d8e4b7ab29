"""The compute precision of memr1's forwards, chosen at run time from what the machine can do.

CPUs differ: with AVX512-BF16 (or AMX) a bf16 matmul runs ~4x faster than fp32; without them bf16 is
emulated and slower. So `precision=auto` (the default) reads the CPU's flags (or asks CUDA) and picks
bf16 autocast where the units exist, fp32 elsewhere. Under autocast the weights, the log-softmax, the
losses and the optimiser state stay fp32; the matmuls run in bf16.

Measured on a 2-core EPYC with avx512_bf16 (SmolLM2-135M, docs/performance.md): a 16 x 450-token
prefill 19.2 s -> 8.5 s, one decoding step at batch 16 5.9 -> 5.2 s per 32 tokens, a forward + backward
of 8 x 464 tokens 42.0 -> 21.8 s. Every stage gains, so the rollout, the scoring forwards, the update and
evaluation all run in the one precision chosen. The fp32 weights stay the masters; the frozen ones
compute with bf16 copies made once (`FrozenLinearCopies`), the very numbers autocast's casts give.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "fp32", "bf16")
# The x86 flags (Linux /proc/cpuinfo names) of native bf16 matmul units.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class Precision:
    """The dtype memr1's forwards compute in (`torch.float32` or `torch.bfloat16`) and why it was chosen."""

    dtype: torch.dtype
    reason: str

    @property
    def is_fp32(self) -> bool:
        return self.dtype == torch.float32

    @property
    def name(self) -> str:
        return "fp32" if self.is_fp32 else "bf16"

    @contextlib.contextmanager
    def autocast(self, device: torch.device | str) -> Iterator[None]:
        """bf16 autocast on `device` (a no-op in fp32)."""
        device_type = torch.device(device).type
        if self.is_fp32 or device_type not in ("cpu", "cuda"):
            yield
            return
        with torch.autocast(device_type, dtype=self.dtype):
            yield


FP32 = Precision(torch.float32, "fp32 (the default of library calls)")


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (empty where there is no /proc/cpuinfo)."""
    path = Path(cpuinfo)
    if not path.is_file():
        return frozenset()
    for line in path.read_text().splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def bf16_units(device: torch.device | str, flags: frozenset[str] | None = None) -> list[str]:
    """What on `device` computes bf16 natively: the CPU's flags among `BF16_CPU_FLAGS`, or the GPU's
    name when CUDA reports bf16 support; empty where bf16 would be emulated."""
    device = torch.device(device)
    if device.type == "cuda":
        return [torch.cuda.get_device_name(device)] if torch.cuda.is_bf16_supported() else []
    flags = cpu_flags() if flags is None else flags
    return [flag for flag in BF16_CPU_FLAGS if flag in flags]


def choose_precision(setting: str, device: torch.device | str, flags: frozenset[str] | None = None) -> Precision:
    """`setting` (`auto`, `fp32` or `bf16`, the `precision` config key) resolved for `device`; `flags`
    stands in for the CPU's (tests). The choice and its reason are logged once per call."""
    if setting not in PRECISIONS:
        raise ValueError(f"precision: {setting!r} is not one of {PRECISIONS}")
    units = bf16_units(device, flags)
    if setting == "fp32":
        chosen = Precision(torch.float32, "fp32: set by precision=fp32")
    elif setting == "bf16":
        reason = f"bf16: set by precision=bf16 ({', '.join(units)})" if units else (
            "bf16: set by precision=bf16, though this machine has no bf16 units (emulated: slower than fp32)"
        )
        chosen = Precision(torch.bfloat16, reason)
    elif units:
        chosen = Precision(torch.bfloat16, f"bf16: precision=auto and this machine has bf16 units ({', '.join(units)})")
    else:
        chosen = Precision(torch.float32, f"fp32: precision=auto and this machine has none of {', '.join(BF16_CPU_FLAGS)}")
    log.info("precision %s", chosen.reason)
    return chosen


class FrozenLinearCopies:
    """The frozen `nn.Linear` weights of a model, held once in the compute dtype.

    Autocast caches its casts only for weights that require grad: a frozen fp32 weight (the base under
    LoRA, an evaluated agent) is cast to bf16 at every call. That is thousands of copies per update
    (0.2 s of a 2.7 s top-10 update on the EPYC above) and every weight at every decoded token (the
    overfit check's rollout, 32 rows of up to 32 tokens: 14.2 s -> 11.1 s a step). The weights it
    would make are the same each time, so `swapped` hands each frozen Linear a bf16 copy made once and
    gives the fp32 weight back on exit: the forward computes exactly what autocast computes (the bf16
    matmul casts its input as before), minus the casts. A copy is made again when its weight was
    replaced or changed in place (its version counter moved). The fp32 weights stay the masters; the
    copies cost 2 bytes per frozen weight. A head tied to the input embedding gets its copy too, the
    embedding keeps its fp32 weight (a bf16 lookup would put the residual stream in bf16). No-op in
    fp32; not for sharded (FSDP) modules, whose weights the strategy owns.
    """

    def __init__(self, precision: Precision) -> None:
        self.precision = precision
        # Per Linear: the fp32 weight a copy was made from, that weight's version then, and the copy.
        self._copies: dict[nn.Linear, tuple[nn.Parameter, int, nn.Parameter]] = {}

    def _copy_of(self, module: nn.Linear, master: nn.Parameter) -> nn.Parameter:
        cached = self._copies.get(module)
        if cached is not None and cached[0] is master and cached[1] == master._version:
            return cached[2]
        # Made as a normal tensor whatever the caller's mode: Lightning validates under inference mode,
        # and a copy first made there (validation before training) would be an inference tensor, which
        # the update's forward may not save for backward.
        with torch.inference_mode(False), torch.no_grad():
            copy = nn.Parameter(master.detach().to(self.precision.dtype), requires_grad=False)
        self._copies[module] = (master, master._version, copy)
        return copy

    @contextlib.contextmanager
    def swapped(self, model: nn.Module) -> Iterator[None]:
        """Every frozen fp32 `nn.Linear` of `model` computing with its cached copy in the compute dtype."""
        if self.precision.is_fp32:
            yield
            return
        masters: list[tuple[nn.Linear, nn.Parameter]] = []
        try:
            for module in model.modules():
                if not isinstance(module, nn.Linear) or module.weight.requires_grad or module.weight.dtype != torch.float32:
                    continue
                master = module.weight
                masters.append((module, master))
                module.weight = self._copy_of(module, master)
            yield
        finally:
            for module, master in masters:
                module.weight = master
