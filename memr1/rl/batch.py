"""From sampled responses to training tensors, and the forward passes the losses need.

Layout (verl's): prompts left-padded to P columns, responses right-padded to R columns, so

    input_ids = [pad pad p0 p1 p2 | r0 r1 r2 pad]      (bs, P + R)
    response_mask =              [  1  1  1  0 ]      (bs, R)

and the logits that predict response token t sit at column P - 1 + t.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields

import torch
from torch import nn

from memr1.llm.padding import left_pad, position_ids_from_attention_mask
from memr1.rl.core import entropy_from_logits, logprobs_from_logits


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

    def minibatches(self, size: int, generator: torch.Generator | None = None) -> Iterator[RolloutBatch]:
        """Shuffled (when `generator` is given) consecutive chunks of `size` rows."""
        order = torch.randperm(len(self), generator=generator) if generator is not None else torch.arange(len(self))
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
    model: nn.Module, batch: RolloutBatch, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(response token) `(bs, R)` fp32 (and the per-token entropy `(bs, R)` when asked).

    Position ids count real tokens only, as in generation, so a padded row scores as it would alone.
    """
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
    response_logits = logits[:, :response_length]
    logprobs = logprobs_from_logits(response_logits, batch.responses)
    entropy = entropy_from_logits(response_logits) if with_entropy else None
    return logprobs, entropy


def response_values(critic: nn.Module, batch: RolloutBatch) -> torch.Tensor:
    """V(state before response token t) `(bs, R)` fp32: the critic's value after the previous token."""
    values = critic(batch.input_ids, batch.attention_mask)
    start = batch.prompt_length - 1
    return values[:, start : start + batch.responses.shape[1]] * batch.response_mask
