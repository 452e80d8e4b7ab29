"""The FSDP-aware paths, on CPU: the gradient norm over shards held by two real processes (gloo), the
names and state dicts an export or a vLLM push sees, FSDP's wrap classes read from the model, and the
merged checkpoint that vLLM serves for a LoRA export."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from memr1.llm.loading import load_policy, merged_checkpoint
from memr1.llm.lora import apply_lora
from memr1.llm.sharding import clip_grad_norm, model_name, submodule_state
from memr1.llm.testing import tiny_causal_lm
from memr1.training import wrap_classes
from tests.processes import free_port

# The full gradient [3, 4, 12] has norm 13; rank 0 holds [3, 4], rank 1 holds [12].
SHARDS = {0: [3.0, 4.0], 1: [12.0]}


def _clip_on_rank(rank: int, port: int, results: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        param = torch.nn.Parameter(torch.zeros(len(SHARDS[rank])))
        param.grad = torch.tensor(SHARDS[rank])
        norm = clip_grad_norm([param], max_norm=6.5, sharded=True)
        results[rank] = (float(norm), param.grad.tolist())
    finally:
        dist.destroy_process_group()


def test_the_norm_of_a_sharded_gradient_is_over_every_ranks_shard():
    results = mp.Manager().dict()
    # Forked, not spawned: the workers need nothing re-imported (a spawn re-imports torch and this module).
    mp.start_processes(_clip_on_rank, args=(free_port(), results), nprocs=2, join=True, start_method="fork")
    # Each rank alone would see norm 5 or 12; the total is sqrt(9 + 16 + 144) = 13, and 6.5 / 13 halves it.
    for rank in (0, 1):
        norm, grad = results[rank]
        assert norm == pytest.approx(13.0, rel=1e-5)
        assert grad == pytest.approx([g * 6.5 / (13.0 + 1e-6) for g in SHARDS[rank]], rel=1e-5)


def test_unsharded_clipping_is_torchs():
    param = torch.nn.Parameter(torch.zeros(3))
    param.grad = torch.tensor([3.0, 4.0, 12.0])
    assert float(clip_grad_norm([param], max_norm=100.0, sharded=False)) == pytest.approx(13.0)
    assert param.grad.tolist() == pytest.approx([3.0, 4.0, 12.0])  # under the bound: unchanged
    param.grad = torch.tensor([float("nan"), 1.0, 1.0])
    assert not math.isfinite(float(clip_grad_norm([param], max_norm=1.0, sharded=False)))


def test_fsdp_wrapper_names_are_stripped_to_the_models_own():
    assert model_name("_fsdp_wrapped_module.model.layers.0._fsdp_wrapped_module.self_attn.q_proj.weight") == (
        "model.layers.0.self_attn.q_proj.weight"
    )
    gathered = {
        "policy._fsdp_wrapped_module.lm_head.weight": torch.ones(1),
        "policy.model.norm.weight": torch.zeros(1),
        "critic.value_head.weight": torch.ones(2),
    }
    assert set(submodule_state(gathered, "policy.")) == {"lm_head.weight", "model.norm.weight"}


@pytest.fixture(scope="module")
def tokenizer():
    from memr1.llm.loading import load_tokenizer

    return load_tokenizer("embedded:smollm2-135m-instruct")


def test_fsdp_shards_the_decoder_layer_the_model_names(tokenizer):
    model = tiny_causal_lm(tokenizer)
    assert {cls.__name__ for cls in wrap_classes(model)} == {"LlamaDecoderLayer"}
    lora = apply_lora(model, 4, 8, 0.0, ["q_proj", "v_proj"])
    assert {cls.__name__ for cls in wrap_classes(lora)} == {"LlamaDecoderLayer"}  # through peft's wrapper
    with pytest.raises(ValueError, match="names no decoder layer class"):
        wrap_classes(torch.nn.Linear(2, 2))


def test_vllm_gets_one_merged_checkpoint_for_a_lora_export(tokenizer, tmp_path):
    base = tmp_path / "base"
    tiny_causal_lm(tokenizer).save_pretrained(base)
    tokenizer.save_pretrained(base)
    policy = apply_lora(load_policy(base)[0], 4, 8, 0.0, ["q_proj", "v_proj"])
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.add_(0.2)
    policy.save_pretrained(tmp_path / "export")
    merged = merged_checkpoint(base, tmp_path / "export", cache_dir=tmp_path / "cache")
    assert merged.parent == tmp_path / "cache" / "merged" and (merged / "config.json").is_file()
    assert merged_checkpoint(base, tmp_path / "export", cache_dir=tmp_path / "cache") == merged  # made once
    ids = torch.tensor([[3, 8, 1, 4]])
    served, _ = load_policy(merged)
    with torch.no_grad():
        assert torch.allclose(served(ids).logits, policy.eval()(ids).logits, atol=1e-4)
    assert merged_checkpoint(base, base, cache_dir=tmp_path / "cache") == base  # a full checkpoint as it is
