"""Tiny, randomly initialised models over real tokenizers, for fast tests and the GPU smoke run: a causal
LM (the policy's backbone) and a sentence embedder (the banks' vectors)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase


def tiny_causal_lm(
    tokenizer: PreTrainedTokenizerBase,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    head_dim: int = 16,
    init_std: float = 0.5,
) -> LlamaForCausalLM:
    """A Llama-architecture model (default: 2 layers, hidden 64, 4 heads of 16) with `tokenizer`'s
    vocabulary and special tokens, built in about a tenth of a second, fp32, eval mode.

    The same seed gives the same weights, drawn from a private RNG (the global one is left as it was).
    `init_std` is far above a real model's 0.02 on purpose: it spreads the logits, so greedy choices are
    never near-ties that float noise could flip, and sampled texts differ. Use head_dim >= 64 for vLLM.
    """
    vocab_size = len(tokenizer)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
        initializer_range=init_std,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval()


def save_tiny_checkpoint(target: str | Path, tokenizer: PreTrainedTokenizerBase, *, seed: int = 0) -> Path:
    """`tiny_causal_lm` saved with its tokenizer as a Hugging Face directory: a backbone that
    `backbone.name_or_path=DIR` loads in well under a second, for end-to-end runs of train.py."""
    target = Path(target)
    tiny_causal_lm(tokenizer, seed=seed).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def save_lora_export(
    backbone: str | Path, target: str | Path, *, seed: int = 3, init: str | Path | None = None, trained: bool = True
) -> Path:
    """A LoRA policy export as a training run writes one: adapters (q_proj, v_proj, r 4) on `backbone`
    (after the warm start `init`, recorded in its warm_start.json, when given) with non-zero,
    trained-looking weights drawn from `seed`, saved with the tokenizer. `trained=False`: lora_B left at
    peft's zeros, as a run exports its policy before the first optimiser step."""
    from memr1.llm.loading import load_policy, write_warm_start
    from memr1.llm.lora import apply_lora

    target = Path(target)
    model, tokenizer = load_policy(backbone, ckpt=init)
    model = apply_lora(model, 4, 8, 0.0, ["q_proj", "v_proj"])
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name and trained:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    if init is not None:
        write_warm_start(target, init)
    return target


def save_tiny_embedder(target: str | Path, *, seed: int = 0, hidden_size: int = 32, num_layers: int = 1) -> Path:
    """A sentence-transformers directory with all-MiniLM-L6-v2's tokenizer and a random BERT of
    `num_layers` x `hidden_size` (mean pooling, unit vectors; ~1 MB against MiniLM's 90), for runs
    that must not carry MiniLM: `banks.embedder=DIR`."""
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, BertConfig, BertModel

    from memr1.embed import default_model_path

    target = Path(target)
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=2, intermediate_size=2 * hidden_size, max_position_embeddings=512,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        encoder = BertModel(config)
    with tempfile.TemporaryDirectory() as encoder_dir:
        encoder.save_pretrained(encoder_dir)
        tokenizer.save_pretrained(encoder_dir)
        transformer = models.Transformer(encoder_dir, max_seq_length=256)
        pooling = models.Pooling(hidden_size, pooling_mode="mean")
        SentenceTransformer(modules=[transformer, pooling, models.Normalize()]).save(str(target))
    return target
