"""Left padding of token sequences, and the position ids that give each padded sequence the positions
it has alone."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack token sequences, padding on the left.

    Returns `(input_ids, attention_mask)`, both `(len(sequences), max_len)` int64, the mask 1 on real
    tokens. Left padding keeps every sequence's last token in the last column, where generation reads
    the next-token logits.
    """
    if not sequences:
        raise ValueError("left_pad: no sequences")
    width = max(len(sequence) for sequence in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        if sequence:
            input_ids[row, width - len(sequence) :] = torch.as_tensor(list(sequence), dtype=torch.long)
            attention_mask[row, width - len(sequence) :] = 1
    return input_ids, attention_mask


def position_ids_from_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that count real tokens only: `(bs, L)` mask -> `(bs, L)` int64.

    A plain forward numbers columns 0..L-1, so a left-padded sequence would start at a shifted
    position. Counting real tokens gives each sequence the positions it has alone, as Hugging Face's
    `generate` does. Rotary attention depends only on position differences, so for RoPE models
    (Llama, Qwen) the shift would change logits by float rounding only; models with absolute
    position embeddings need this exactly. Pad columns get 0 (they are masked out anyway).
    Example: mask [0, 0, 1, 1, 1] -> positions [0, 0, 0, 1, 2].
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)
