"""FSDP2 (`torch.distributed.fsdp.fully_shard`), as `trainer=fsdp` uses it through Lightning's
`ModelParallelStrategy`: which modules are sharded, the gradient norm over every rank's shard, the
full parameters an export or a weight push needs, and decoding in step with the other ranks.

FSDP2 keeps the model's own classes and parameter names (its parameters become DTensors), so the same
code runs sharded or not, on GPUs (NCCL) or CPU processes (gloo); every function here is the plain
PyTorch operation when nothing is sharded (one process, DDP).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


def wrap_classes(model: nn.Module) -> set[type[nn.Module]]:
    """The classes sharded one by one: the `_no_split_modules` (decoder layer) that the Hugging Face
    models inside `model` name, as accelerate reads them, found among `model`'s modules (through peft's
    and the value model's wrappers)."""
    names = {name for module in model.modules() for name in (getattr(module, "_no_split_modules", None) or ())}
    classes = {type(module) for module in model.modules() if type(module).__name__ in names}
    if not classes:
        raise ValueError(
            f"trainer=fsdp: {type(model).__name__} names no decoder layer class in _no_split_modules "
            f"({sorted(names)}); FSDP needs one to shard by"
        )
    return classes


def shard(model: nn.Module, mesh: DeviceMesh, mixed_precision: MixedPrecisionPolicy | None = None) -> None:
    """Shard `model` in place over `mesh`: each decoder layer is one unit (its all-gather large, the
    memory peak one layer), the rest (embeddings, final norm, head, a value head) the root's. LoRA
    adapters are sharded with the layer that holds them; frozen and trainable parameters may share a
    unit (FSDP2 keeps `requires_grad` per parameter)."""
    options = {"mesh": mesh, "mp_policy": mixed_precision or MixedPrecisionPolicy()}
    classes = tuple(wrap_classes(model))
    for module in model.modules():
        if isinstance(module, classes):
            fully_shard(module, **options)
    fully_shard(model, **options)


def is_sharded(module: nn.Module) -> bool:
    """Whether FSDP2 shards `module` or any module inside it."""
    return any(isinstance(m, FSDPModule) for m in module.modules())


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> Tensor:
    """Clip the gradients of `parameters` to a total L2 norm of `max_norm`; return the norm before.

    Sharded gradients are DTensors, whose norm torch computes over every rank's shard (an all-reduce):
    the same clipping as one process with the whole gradient. A non-finite norm leaves the gradients
    unscaled (the caller skips that step)."""
    params = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def full_state_dict(module: nn.Module) -> dict[str, Tensor]:
    """`module.state_dict()` with every sharded tensor (DTensor) all-gathered into a plain tensor: what
    an export writes or a weight push sends. Every rank must call it (a collective per sharded tensor);
    nothing is gathered when nothing is sharded."""
    return {
        name: tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        for name, tensor in module.state_dict().items()
    }


def max_over_ranks(value: int, device: torch.device) -> int:
    """The largest `value` of every rank (an all-reduce; `value` itself outside a process group).

    A sharded forward all-gathers each unit's parameters from every rank, so the ranks must run the
    same forwards: the same number of decoding batches, and of steps in each (`all_ranks_done`)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    largest = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    return int(largest.item())


def all_ranks_done(done: bool, device: torch.device) -> bool:
    """Whether every rank is `done`: a rank whose rows have all ended keeps stepping until every
    rank's have."""
    return max_over_ranks(0 if done else 1, device) == 0
