"""What changes when the policy is sharded by FSDP: the gradient norm is over every rank's shard,
an export or a weight push needs the full parameters gathered first, and FSDP's wrapper names are not
the model's. Each function is the plain PyTorch operation when nothing is sharded (CPU, DDP, one GPU)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping

import torch
import torch.distributed as dist
from torch import Tensor, nn

FSDP_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def is_sharded(module: nn.Module) -> bool:
    """Whether FSDP wraps `module` or any module inside it."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return any(isinstance(m, FullyShardedDataParallel) for m in module.modules())


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float, sharded: bool) -> Tensor:
    """Clip the gradients of `parameters` to a total L2 norm of `max_norm`; return the norm before.

    sharded: each rank holds a disjoint shard of every parameter (FSDP FULL_SHARD), so the squared norm
    is summed over ranks before the root is taken, as FSDP's own `clip_grad_norm_` does; otherwise
    every rank holds the whole gradient and `torch.nn.utils.clip_grad_norm_` is exact.
    A non-finite norm leaves the gradients unscaled (the caller skips that step).
    """
    params = [p for p in parameters if p.grad is not None]
    if not sharded or not (dist.is_available() and dist.is_initialized()):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    device = params[0].grad.device if params else torch.device("cpu")
    squared = torch.zeros((), device=device, dtype=torch.float32)
    for p in params:
        squared += p.grad.detach().float().pow(2).sum()
    dist.all_reduce(squared)
    norm = squared.sqrt()
    if torch.isfinite(norm):
        scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for p in params:
            p.grad.detach().mul_(scale.to(p.grad.dtype))
    return norm


@contextlib.contextmanager
def full_parameters(root: nn.Module) -> Iterator[None]:
    """Inside, every FSDP unit under `root` holds its full, unsharded parameters (read-only: changes
    are not written back); a no-op when nothing is sharded. Every rank must enter it (a collective)."""
    if not is_sharded(root):
        yield
        return
    from torch.distributed.fsdp import FullyShardedDataParallel

    with FullyShardedDataParallel.summon_full_params(root, writeback=False, rank0_only=False):
        yield


def model_name(name: str) -> str:
    """A parameter's name as the unwrapped model calls it (FSDP's wrapper prefixes removed)."""
    for prefix in FSDP_PREFIXES:
        name = name.replace(prefix, "")
    return name


def named_model_parameters(module: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(model name, detached tensor) of every parameter, for a push to another engine; call it inside
    `full_parameters` when the module is sharded."""
    for name, param in module.named_parameters():
        yield model_name(name), param.detach()


def submodule_state(state: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The entries of a (gathered) state dict under `prefix` ("policy."), with the prefix and FSDP's
    wrapper names removed: the submodule's own `state_dict()` keys."""
    return {model_name(key)[len(prefix):]: value for key, value in state.items() if model_name(key).startswith(prefix)}
