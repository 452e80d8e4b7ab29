"""From sampled responses to training tensors, and the forward passes the losses need.

Layout (verl's): prompts left-padded to P columns, responses right-padded to R columns, so

    input_ids = [pad pad p0 p1 p2 | r0 r1 r2 pad]      (bs, P + R)
    response_mask =              [  1  1  1  0 ]      (bs, R)

and the logits that predict response token t sit at column P - 1 + t.

With a frozen trunk (`memr1.llm.trunk`), `trunk_hidden` `(bs, P + R - 1, H)` holds the trunk's output at
every input column but the last (the last response token predicts nothing scored), and the forwards
below run only the head from it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache

from memr1.llm.engines import cache_keyword
from memr1.llm.padding import left_pad, position_ids_from_attention_mask
from memr1.llm.trunk import decoder_parts, head_hidden, trunk_states
from memr1.rl.core import entropy_from_logits, logprobs_from_logits

log = logging.getLogger(__name__)


@dataclass
class RolloutBatch:
    """Tensors of one rollout batch; every field's first dimension is the batch.

    input_ids, attention_mask: (bs, P + R); responses, response_mask: (bs, R); trunk_hidden:
    (bs, P + R - 1, H) the frozen trunk's states; the rest (bs, R) float32 per-token quantities or (bs,)
    per-sequence ones, filled in as the algorithm computes them.
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
    trunk_hidden: torch.Tensor | None = None
    weights: torch.Tensor | None = None  # (bs,) each row's weight in a supervised loss (algo.operation_weights)

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
    trunk_hidden: Sequence[torch.Tensor] | None = None,
) -> RolloutBatch:
    """Left-pad the prompts, right-pad the responses and join them (see the module docstring).

    `logprobs`, the sampler's log-probs of each response token, become `old_logprobs` when given.
    `trunk_hidden`, the rollout's trunk states of each row `(prompt + response - 1, H)`, are laid out as
    the tokens are (zeros in padding columns, which every forward masks).
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
    hidden = None
    if trunk_hidden is not None:
        prompt_width = prompts.shape[1]
        first = trunk_hidden[0]
        hidden = first.new_zeros((len(response_ids), prompt_width + width - 1, first.shape[-1]))
        for row, (states, prompt, response) in enumerate(zip(trunk_hidden, prompt_ids, response_ids, strict=True)):
            if len(states) != len(prompt) + max(len(response), 1) - 1:
                raise ValueError(f"pack_rollouts: row {row} has {len(states)} trunk states for "
                                 f"{len(prompt)} prompt and {len(response)} response tokens")
            hidden[row, prompt_width - len(prompt) : prompt_width + len(states) - len(prompt)] = states
    return RolloutBatch(
        trunk_hidden=hidden,
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
    trunk_depth: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π_T(response token) `(bs, R)` fp32 under softmax(logits / `temperature`), the distribution
    the rollout sampled from (verl's `dp_actor`, TRL), and its per-token entropy `(bs, R)` when asked
    (without a graph when `entropy_grad` is False: logged, not trained on).

    Position ids count real tokens only, as in generation, so a padded row scores as it would alone.
    `share_prompt`: rows with the same prompt (a GRPO group) run it once (`shared_prompt_logits`).
    `trunk_depth`: with `batch.trunk_hidden`, only the layers above the frozen trunk run (`head_response_logits`).
    """
    if trunk_depth and batch.trunk_hidden is not None:
        # Only the real response tokens reach the LM head: padding is ~40% of the columns when lengths vary.
        real = batch.response_mask.bool()
        logits = head_response_logits(model, batch, trunk_depth, share_prompt, real)  # (1, N, V)
        logprobs, entropy = _scored(logits, batch.responses[real][None], with_entropy, temperature, entropy_grad)
        return _unpack(logprobs, real), None if entropy is None else _unpack(entropy, real)
    logits = shared_prompt_logits(model, batch) if share_prompt else None
    if logits is None:
        logits = full_logits(model, batch)
    return _scored(logits, batch.responses, with_entropy, temperature, entropy_grad)


def _unpack(packed: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Packed values `(1, N)` back to the `(bs, R)` layout of `mask` (N true entries), 0 elsewhere."""
    return packed.new_zeros(mask.shape).masked_scatter(mask, packed[0])


def _scored(
    logits: torch.Tensor, labels: torch.Tensor, with_entropy: bool, temperature: float, entropy_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `labels` `(bs, L)` and the entropy under softmax(`logits` `(bs, L, V)` / T)."""
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logprobs = logprobs_from_logits(logits, labels)
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


def prompt_groups(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rows sharing a prompt: `(first, rows)`, the first row `(n,)` of each of the n distinct prompts
    and each row's prompt `(bs,)` in 0..n-1; None when every row's prompt is its own."""
    prompt_length = batch.prompt_length
    prompt_key = torch.cat([batch.input_ids[:, :prompt_length], batch.attention_mask[:, :prompt_length]], dim=1)
    distinct, rows = torch.unique(prompt_key, dim=0, return_inverse=True)
    if len(distinct) == len(batch):
        return None
    order = torch.arange(len(batch), device=rows.device)
    first = torch.full((len(distinct),), len(batch), dtype=torch.long, device=rows.device)
    return first.scatter_reduce(0, rows, order, reduce="amin"), rows


def shared_prompt_logits(model: nn.Module, batch: RolloutBatch) -> torch.Tensor | None:
    """`full_logits`, with each distinct prompt forwarded once: its KV cache (with its graph, so
    adapters below and above get their gradients) is copied to the rows that share it, and only the
    responses run per row. A GRPO group of G rows whose prompts are most of their tokens costs about
    one prompt plus G responses instead of G prompts plus G responses.

    None when no two rows share a prompt (nothing to gain) or the model cannot take a KV cache this
    way (said once per model class); the caller then runs `full_logits`.
    """
    groups = prompt_groups(batch)
    if groups is None:
        return None
    try:
        return _once_per_prompt(model, batch, groups, lambda **inputs: model(**inputs).logits)
    except (TypeError, AttributeError, NotImplementedError) as error:
        name = type(model).__name__
        if name not in _warned_no_sharing:
            _warned_no_sharing.add(name)
            log.warning("%s cannot share prompt KV caches (%s): using one forward per row", name, error)
        return None


def _once_per_prompt(
    model: nn.Module, batch: RolloutBatch, groups: tuple[torch.Tensor, torch.Tensor], forward: Callable[..., torch.Tensor]
) -> torch.Tensor:
    """`forward(**model_inputs)` run on each distinct prompt once (keeping the logit of its last token
    only), its KV cache copied to the rows that share it, then on every row's response tokens but the
    last (the last predicts nothing scored); the two outputs joined along the sequence."""
    first, rows = groups
    prompt_length, response_length = batch.prompt_length, batch.responses.shape[1]
    mask = batch.attention_mask[:, : prompt_length + response_length - 1]
    positions = position_ids_from_attention_mask(mask)
    keyword = cache_keyword(model)
    cache = DynamicCache(config=model.config)
    prompt = forward(
        input_ids=batch.input_ids[first, :prompt_length],
        attention_mask=mask[first, :prompt_length],
        position_ids=positions[first, :prompt_length],
        use_cache=True,
        logits_to_keep=1,
        **{keyword: cache},
    )[rows]
    if response_length == 1:
        return prompt
    cache.reorder_cache(rows)
    rest = forward(
        input_ids=batch.responses[:, :-1],
        attention_mask=mask,
        position_ids=positions[:, prompt_length:],
        use_cache=True,
        **{keyword: cache},
    )
    return torch.cat([prompt, rest], dim=1)


def trunk_hidden_states(model: nn.Module, batch: RolloutBatch, depth: int, share_prompt: bool = False) -> torch.Tensor:
    """The frozen trunk's states `(bs, P + R - 1, H)` of `batch` (no graph), for when the rollout did not
    record them; with `share_prompt`, each distinct prompt runs once, as in `shared_prompt_logits`."""
    def forward(**inputs: Any) -> torch.Tensor:
        return trunk_states(model, depth, lambda: model(**inputs))

    groups = prompt_groups(batch) if share_prompt else None
    with torch.no_grad():
        if groups is not None:
            return _once_per_prompt(model, batch, groups, forward)
        mask = batch.attention_mask[:, :-1]
        return forward(
            input_ids=batch.input_ids[:, :-1],
            attention_mask=mask,
            position_ids=position_ids_from_attention_mask(mask),
            use_cache=False,
        )


def head_response_logits(
    model: nn.Module, batch: RolloutBatch, depth: int, share_prompt: bool = False, select: torch.Tensor | None = None
) -> torch.Tensor:
    """`full_logits` `(bs, R, V)` from `batch.trunk_hidden`: only the layers above the trunk run (with
    their graph); with `share_prompt`, each distinct prompt runs once and its head KV cache is copied to
    its rows. `select` `(bs, R)` bool: only those positions' logits, packed `(1, N, V)`."""
    parts = decoder_parts(model)
    if parts is None:
        raise ValueError(f"head_response_logits: {type(model).__name__} has no decoder layout memr1 knows")
    prompt_length, response_length = batch.prompt_length, batch.responses.shape[1]
    hidden = batch.trunk_hidden
    mask = batch.attention_mask[:, : prompt_length + response_length - 1]
    positions = position_ids_from_attention_mask(mask)
    groups = prompt_groups(batch) if share_prompt else None
    if groups is None:
        final = head_hidden(parts, depth, hidden, mask, positions, keep_last=response_length)
    else:
        first, rows = groups
        cache = DynamicCache(config=parts.config)
        prompt = (hidden[first, :prompt_length], mask[first, :prompt_length], positions[first, :prompt_length])
        final = head_hidden(parts, depth, *prompt, cache=cache, keep_last=1)[rows]
        if response_length > 1:
            cache.reorder_cache(rows)
            rest = head_hidden(parts, depth, hidden[:, prompt_length:], mask, positions[:, prompt_length:], cache=cache)
            final = torch.cat([final, rest], dim=1)
    return parts.lm_head(final if select is None else final[select][None])


def response_values(critic: nn.Module, batch: RolloutBatch) -> torch.Tensor:
    """V(state before response token t) `(bs, R)` fp32: the critic's value after the previous token."""
    values = critic(batch.input_ids, batch.attention_mask)
    start = batch.prompt_length - 1
    return values[:, start : start + batch.responses.shape[1]] * batch.response_mask
