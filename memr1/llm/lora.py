"""LoRA adapters (peft) on a policy or a value model."""

from __future__ import annotations

from collections.abc import Sequence

from peft import LoraConfig, PeftModel, TaskType, get_peft_model
from torch import nn
from transformers import PreTrainedModel


def apply_lora(
    model: nn.Module,
    r: int = 16,
    alpha: float = 32.0,
    dropout: float = 0.05,
    target_modules: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    modules_to_save: Sequence[str] = (),
    top_layers: int | None = None,
) -> PeftModel:
    """Wrap `model` with LoRA adapters on `target_modules` (module names, e.g. Llama's `q_proj`).

    Afterwards only the adapters' `lora_A` / `lora_B` (and any `modules_to_save`, e.g. a value head,
    trained in full) require grad; every base weight is frozen. `lora_B` starts at zero, so the wrapped
    model computes exactly what `model` did until it is trained. A causal LM keeps `generate` and its
    keyword arguments through peft's causal-LM wrapper; any other module (a `ValueModel`) gets the plain
    wrapper.

    `top_layers`: adapters on the last N decoder layers only (None: all). Nothing below them needs a
    gradient, so backward stops at the lowest adapted layer: the CPU presets' way to cheapen a step.
    """
    if r < 1:
        raise ValueError(f"apply_lora: r must be >= 1, got {r}")
    if not 0 <= dropout < 1:
        raise ValueError(f"apply_lora: dropout must be in [0, 1), got {dropout}")
    is_causal_lm = isinstance(model, PreTrainedModel) and model.can_generate()
    layers = None
    if top_layers is not None:
        total = _num_layers(model)
        if not 1 <= top_layers <= total:
            raise ValueError(f"apply_lora: top_layers must be in [1, {total}] (the model's layers), got {top_layers}")
        layers = list(range(total - top_layers, total))
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        modules_to_save=list(modules_to_save) or None,
        task_type=TaskType.CAUSAL_LM if is_causal_lm else None,
        layers_to_transform=layers,
    )
    return get_peft_model(model, config)


def _num_layers(model: nn.Module) -> int:
    config = model.config if isinstance(model, PreTrainedModel) else model.body.config  # a ValueModel
    return config.get_text_config().num_hidden_layers
