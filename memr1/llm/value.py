"""The PPO critic: a causal LM's transformer body with a scalar value head."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from memr1.llm.padding import position_ids_from_attention_mask


class ValueModel(nn.Module):
    """Per-token values `V(s_t)` from a causal-LM backbone.

    The LM head is dropped (a critic needs hidden states, not a vocabulary's worth of logits); the body
    keeps the backbone's weights and dtype. The head is `nn.Linear(hidden, 1)` in fp32, initialised to
    zero so the first values are 0 and inject no random bias into the first advantages.
    """

    def __init__(self, causal_lm: PreTrainedModel) -> None:
        super().__init__()
        self.body = causal_lm.base_model
        hidden_size = causal_lm.config.get_text_config().hidden_size
        self.value_head = nn.Linear(hidden_size, 1, dtype=torch.float32)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask: `(bs, L)`, padding on either side -> values `(bs, L)` fp32.

        `values[b, t]` is the value of the state after token t. Position ids count real tokens only and
        pads are masked out of attention, so padding does not change the values of real tokens;
        padded positions get 0.
        """
        hidden = self.body(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_attention_mask(attention_mask),
            use_cache=False,
        ).last_hidden_state
        values = self.value_head(hidden.float()).squeeze(-1)
        return values.masked_fill(attention_mask == 0, 0.0)
