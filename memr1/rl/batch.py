"""From sampled responses to training tensors, and the forward passes the losses need.

Layout (verl's): prompts left-padded to P columns, responses right-padded to R columns, so

    input_ids = [pad pad p0 p1 p2 | r0 r1 r2 pad]      (bs, P + R)
    response_mask =              [  1  1  1  0 ]      (bs, R)

and the logits that predict response token t sit at column P - 1 + t.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields

import torch
from torch import nn
from transformers import DynamicCache

from memr1.llm.engines import cache_keyword
from memr1.llm.padding import left_pad, position_ids_from_attention_mask
from memr1.rl.core import entropy_from_logits, logprobs_from_logits

log = logging.getLogger(__name__)


@dataclass
class RolloutBatch:
    """Tensors of one rollout batch; every field's first dimension is the batch.

    input_ids, attention_mask: (bs, P + R); responses, response_mask: (bs, R);
    the rest (bs, R) float32 per-token quantities or (bs,) per-sequence ones, filled in as the
    algorithm computes them.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    responses: torch.Tensor
    response_mask: torch.Tensor
    scores: torch.Tensor  # (bs,) outcome rewards
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None

    @property
    def prompt_length(self) -> int:
        return self.input_ids.shape[1] - self.responses.shape[1]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: torch.Tensor | slice) -> RolloutBatch:
        """The rows `index` of every tensor field."""
        return RolloutBatch(
            **{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[index] for f in fields(self)}
        )

    def to(self, device: torch.device | str) -> RolloutBatch:
        return RolloutBatch(
            **{f.name: None if getattr(self, f.name) is None else getattr(self, f.name).to(device) for f in fields(self)}
        )

    def minibatches(self, size: int, generator: torch.Generator | None = None, group_size: int = 1) -> Iterator[RolloutBatch]:
        """Consecutive chunks of `size` rows, shuffled (when `generator` is given) by whole groups of
        `group_size` consecutive rows, so that every group stays together when `size` is a multiple."""
        groups = len(self) // group_size
        if groups * group_size != len(self):
            raise ValueError(f"minibatches: {len(self)} rows are not whole groups of {group_size}")
        group_order = torch.randperm(groups, generator=generator) if generator is not None else torch.arange(groups)
        order = (group_order[:, None] * group_size + torch.arange(group_size)).flatten()
        for start in range(0, len(self), size):
            yield self.select(order[start : start + size])


def pack_rollouts(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    scores: Sequence[float],
    pad_id: int,
    logprobs: Sequence[Sequence[float]] | None = None,
) -> RolloutBatch:
    """Left-pad the prompts, right-pad the responses and join them (see the module docstring).

    `logprobs`, the sampler's log-probs of each response token, become `old_logprobs` when given.
    A response of length 0 (the model stopped at once) keeps one masked column so shapes stay valid.
    """
    if not (len(prompt_ids) == len(response_ids) == len(scores)):
        raise ValueError(
            f"pack_rollouts: {len(prompt_ids)} prompts, {len(response_ids)} responses, {len(scores)} scores"
        )
    prompts, prompt_mask = left_pad(prompt_ids, pad_id)
    width = max(1, max(len(r) for r in response_ids))
    responses = torch.full((len(response_ids), width), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(response_ids), width), dtype=torch.long)
    for row, ids in enumerate(response_ids):
        responses[row, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.long)
        response_mask[row, : len(ids)] = 1
    old_logprobs = None
    if logprobs is not None:
        old_logprobs = torch.zeros((len(response_ids), width), dtype=torch.float32)
        for row, values in enumerate(logprobs):
            old_logprobs[row, : len(values)] = torch.as_tensor(list(values), dtype=torch.float32)
    return RolloutBatch(
        old_logprobs=old_logprobs,
        input_ids=torch.cat([prompts, responses], dim=1),
        attention_mask=torch.cat([prompt_mask, response_mask], dim=1),
        responses=responses,
        response_mask=response_mask,
        scores=torch.as_tensor(list(scores), dtype=torch.float32),
    )


def response_logprobs(
    model: nn.Module,
    batch: RolloutBatch,
    with_entropy: bool = False,
    temperature: float = 1.0,
    share_prompt: bool = False,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π_T(response token) `(bs, R)` fp32 under softmax(logits / `temperature`), the distribution
    the rollout sampled from (verl's `dp_actor`, TRL), and its per-token entropy `(bs, R)` when asked
    (without a graph when `entropy_grad` is False: logged, not trained on).

    Position ids count real tokens only, as in generation, so a padded row scores as it would alone.
    `share_prompt`: rows with the same prompt (a GRPO group) run it once (`shared_prompt_logits`).
    """
    logits = shared_prompt_logits(model, batch) if share_prompt else None
    if logits is None:
        logits = full_logits(model, batch)
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logprobs = logprobs_from_logits(logits, batch.responses)
    entropy = None
    if with_entropy:
        entropy = entropy_from_logits(logits if entropy_grad else logits.detach())
    return logprobs, entropy


def full_logits(model: nn.Module, batch: RolloutBatch) -> torch.Tensor:
    """The logits that predict each response token `(bs, R, V)`, one forward over prompt + response."""
    response_length = batch.responses.shape[1]
    # Only the logits that predict response tokens (positions P-1 .. P+R-2, the last R+1 of P+R): the
    # LM head over the prompt would cost a fifth of the forward pass and bs x P x vocab floats.
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=position_ids_from_attention_mask(batch.attention_mask),
        use_cache=False,
        logits_to_keep=response_length + 1,
    ).logits
    return logits[:, :response_length]


_warned_no_sharing: set[str] = set()


def shared_prompt_logits(model: nn.Module, batch: RolloutBatch) -> torch.Tensor | None:
    """`full_logits`, with each distinct prompt forwarded once: its KV cache (with its graph, so
    adapters below and above get their gradients) is copied to the rows that share it, and only the
    responses run per row. A GRPO group of G rows whose prompts are most of their tokens costs about
    one prompt plus G responses instead of G prompts plus G responses.

    None when no two rows share a prompt (nothing to gain) or the model cannot take a KV cache this
    way (said once per model class); the caller then runs `full_logits`.
    """
    prompt_length, response_length = batch.prompt_length, batch.responses.shape[1]
    prompt_key = torch.cat([batch.input_ids[:, :prompt_length], batch.attention_mask[:, :prompt_length]], dim=1)
    distinct, rows = torch.unique(prompt_key, dim=0, return_inverse=True)
    if len(distinct) == len(batch):
        return None
    prompt_ids, prompt_mask = distinct[:, :prompt_length], distinct[:, prompt_length:]
    try:
        cache = DynamicCache(config=model.config)
        keyword = cache_keyword(model)
        first = model(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=position_ids_from_attention_mask(prompt_mask),
            use_cache=True,
            logits_to_keep=1,
            **{keyword: cache},
        ).logits[rows]  # (bs, 1, V): predicts response token 0
        if response_length == 1:
            return first
        cache.reorder_cache(rows)
        # Response tokens 0..R-2 predict tokens 1..R-1; the last token predicts nothing we score.
        mask = batch.attention_mask[:, : prompt_length + response_length - 1]
        rest = model(
            input_ids=batch.responses[:, :-1],
            attention_mask=mask,
            position_ids=position_ids_from_attention_mask(mask)[:, prompt_length:],
            use_cache=True,
            **{keyword: cache},
        ).logits
    except (TypeError, AttributeError, NotImplementedError) as error:
        name = type(model).__name__
        if name not in _warned_no_sharing:
            _warned_no_sharing.add(name)
            log.warning("%s cannot share prompt KV caches (%s): using one forward per row", name, error)
        return None
    return torch.cat([first, rest], dim=1)


def response_values(critic: nn.Module, batch: RolloutBatch) -> torch.Tensor:
    """V(state before response token t) `(bs, R)` fp32: the critic's value after the previous token."""
    values = critic(batch.input_ids, batch.attention_mask)
    start = batch.prompt_length - 1
    return values[:, start : start + batch.responses.shape[1]] * batch.response_mask
