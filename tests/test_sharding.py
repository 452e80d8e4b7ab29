"""FSDP2 on CPU, two real processes (gloo): a sharded LoRA model's gradient norm, clipping, gathered
state dict and greedy decoding (ranks in lockstep) equal one process's; the wrap classes read from the
model; the merged checkpoint that vLLM serves for a LoRA export."""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torch.distributed.device_mesh import init_device_mesh

from memr1.llm.engines import HFEngine
from memr1.llm.loading import load_policy, load_tokenizer, merged_checkpoint
from memr1.llm.lora import apply_lora
from memr1.llm.sampling import SamplingConfig
from memr1.llm.sharding import clip_grad_norm, full_state_dict, is_sharded, shard, wrap_classes
from memr1.llm.testing import tiny_causal_lm
from memr1.llm.value import ValueModel
from tests.processes import free_port

PROMPTS = {0: ["a short one", "two"], 1: ["a much longer prompt that this rank decodes for longer than the other rank"]}


def _sharded_on_rank(rank: int, port: int, results: dict) -> None:
    """Rank `rank` of 2: a LoRA tiny Llama and its unsharded twin; the twin's numbers are one
    process's, the sharded model's come from both ranks' shards."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        tokenizer = load_tokenizer("embedded:smollm2-135m-instruct")
        twin = apply_lora(tiny_causal_lm(tokenizer, seed=1), 4, 8, 0.0, ["q_proj", "v_proj"])
        model = copy.deepcopy(twin)
        shard(model, init_device_mesh("cpu", (2,)))
        ids = torch.tensor([[3, 8, 1, 4, 9, 2]])
        for m in (model, twin):
            m(ids, labels=ids).loss.backward()
        trainable = [p for p in model.parameters() if p.requires_grad]
        norm = clip_grad_norm(trainable, max_norm=1e-3)
        want = torch.nn.utils.clip_grad_norm_([p for p in twin.parameters() if p.requires_grad], max_norm=1e-3)
        clipped = {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}
        state = full_state_dict(model)
        # Greedy decoding with each rank's own prompts, a batch each. Rank 0's rows end at their first
        # token (made an end token), rank 1's runs to 12: rank 0 keeps stepping (idle) until rank 1 is
        # done; rank 0 has two batches, rank 1 one: rank 1 decodes a stand-in batch.
        sampling = SamplingConfig.greedy_up_to(12)
        first = HFEngine(twin, tokenizer).generate(PROMPTS[rank], SamplingConfig.greedy_up_to(1))
        eos = {g[0].response_ids[0] for g in first} if rank == 0 else set()
        engine = HFEngine(model, tokenizer, batch_size=1, eos_token_ids=eos)
        engine.lockstep = True
        generations = [g[0] for g in engine.generate(PROMPTS[rank], sampling)]
        alone = [g[0] for g in HFEngine(twin, tokenizer, batch_size=1, eos_token_ids=eos).generate(PROMPTS[rank], sampling)]
        results[rank] = {
            "sharded": is_sharded(model) and not is_sharded(twin),
            "norm": (float(norm), float(want)),
            "grads": max((clipped[n] - p.grad).abs().max().item() for n, p in twin.named_parameters() if p.grad is not None),
            "state": state.keys() == twin.state_dict().keys()
            and max((state[k] - v).abs().max().item() for k, v in twin.state_dict().items()),
            "responses": ([g.response_ids for g in generations], [g.response_ids for g in alone]),
        }
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two processes
def test_fsdp2_shards_clips_gathers_and_decodes_as_one_process():
    results = mp.Manager().dict()
    # Spawned, not forked: a fork of a process whose OpenMP threads have run (the rest of the suite)
    # can hang in the child's first parallel op.
    mp.start_processes(_sharded_on_rank, args=(free_port(), results), nprocs=2, join=True, start_method="spawn")
    for rank in (0, 1):
        got = results[rank]
        assert got["sharded"]
        norm, want = got["norm"]
        assert norm > 1e-3 and norm == pytest.approx(want, rel=1e-5)  # over both shards, as one process
        assert got["grads"] < 1e-7  # clipped alike
        assert got["state"] is not False and got["state"] < 1e-7  # the full tensors, under the model's own names
        responses, alone = got["responses"]
        assert responses == alone
    assert [len(r) for r in results[0]["responses"][0]] == [1, 1]
    assert [len(r) for r in results[1]["responses"][0]] == [12]


def test_unsharded_clipping_is_torchs():
    param = torch.nn.Parameter(torch.zeros(3))
    param.grad = torch.tensor([3.0, 4.0, 12.0])
    assert float(clip_grad_norm([param], max_norm=100.0)) == pytest.approx(13.0)
    assert param.grad.tolist() == pytest.approx([3.0, 4.0, 12.0])  # under the bound: unchanged
    param.grad = torch.tensor([float("nan"), 1.0, 1.0])
    assert not math.isfinite(float(clip_grad_norm([param], max_norm=1.0)))


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("embedded:smollm2-135m-instruct")


def test_fsdp_shards_the_decoder_layer_the_model_names(tokenizer):
    """Through peft's wrapper and the value model's."""
    model = tiny_causal_lm(tokenizer)
    assert {cls.__name__ for cls in wrap_classes(model)} == {"LlamaDecoderLayer"}
    lora = apply_lora(model, 4, 8, 0.0, ["q_proj", "v_proj"])
    assert {cls.__name__ for cls in wrap_classes(lora)} == {"LlamaDecoderLayer"}  # through peft's wrapper
    assert {cls.__name__ for cls in wrap_classes(ValueModel(tiny_causal_lm(tokenizer)))} == {"LlamaDecoderLayer"}
    with pytest.raises(ValueError, match="names no decoder layer class"):
        wrap_classes(torch.nn.Linear(2, 2))


def test_vllm_gets_one_merged_checkpoint_for_a_lora_export(tokenizer, tmp_path):
    torch.manual_seed(0)  # the weights, hence the logits, would otherwise depend on the tests run before
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
        served_logits, policy_logits = served(ids).logits, policy.eval()(ids).logits
    # merging rounds each weight once: over 36 seeds the logits (~18 in size) differed by at most 8e-5
    assert (served_logits - policy_logits).abs().max() <= 1e-5 * policy_logits.abs().max()
    assert merged_checkpoint(base, base, cache_dir=tmp_path / "cache") == base  # a full checkpoint as it is
