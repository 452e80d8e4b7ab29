"""The cheaper update: shared-prompt forwards, log-probs of the sampling distribution, no entropy
graph when the loss does not use it, non-finite gradients dropped, minibatches by whole groups.
A tiny random Llama (realistic 0.02 init, so float32 noise stays far below the tolerances) with the
real SmolLM2 tokenizer; ~15 s on 2 cores."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from torch import nn

from memr1.envs.base import Reward
from memr1.llm.engines import HFEngine
from memr1.llm.loading import load_tokenizer
from memr1.llm.lora import apply_lora
from memr1.llm.sampling import SamplingConfig
from memr1.llm.testing import tiny_causal_lm
from memr1.rl.algorithms import AlgoConfig
from memr1.modules.base import RLModule
from memr1.rl.batch import pack_rollouts, response_logprobs, shared_prompt_logits


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("embedded:smollm2-135m-instruct")


def grouped_batch(tokenizer, prompt_lengths=(7, 11), response_lengths=(1, 3, 5), seed=0):
    """Groups of rows sharing a prompt; prompts of different lengths (left padding), responses of
    different lengths within each group (right padding)."""
    generator = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for length in prompt_lengths:
        prompt = torch.randint(5, 1000, (length,), generator=generator).tolist()
        for response_length in response_lengths:
            prompts.append(prompt)
            responses.append(torch.randint(5, 1000, (response_length,), generator=generator).tolist())
    return pack_rollouts(prompts, responses, [0.0] * len(prompts), tokenizer.pad_token_id)


def logprobs_and_grads(model: nn.Module, batch, share: bool):
    model.zero_grad()
    logprobs, entropy = response_logprobs(model, batch, with_entropy=True, temperature=0.7, share_prompt=share)
    ((logprobs * batch.response_mask).sum() + (entropy * batch.response_mask).sum()).backward()
    return logprobs.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_shared_prompt_forward_equals_one_forward_per_row(tokenizer):
    model = apply_lora(tiny_causal_lm(tokenizer, seed=3, num_layers=3, init_std=0.02), 4, 8, 0.0, ["q_proj", "v_proj"], top_layers=2)
    model.train()
    batch = grouped_batch(tokenizer)
    plain, plain_grads = logprobs_and_grads(model, batch, share=False)
    shared, shared_grads = logprobs_and_grads(model, batch, share=True)
    mask = batch.response_mask.bool()
    assert (plain - shared)[mask].abs().max() <= 1e-5
    for name in plain_grads:  # adapters below and above the shared cache get the same gradient
        torch.testing.assert_close(shared_grads[name], plain_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def test_the_shared_path_forwards_each_distinct_prompt_once(tokenizer):
    model = tiny_causal_lm(tokenizer, seed=1, init_std=0.02)
    prompt_rows: list[int] = []
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: prompt_rows.append(kwargs["input_ids"].shape[0]) if kwargs["input_ids"].shape[1] > 5 else None,
        with_kwargs=True,
    )
    try:
        with torch.no_grad():
            shared_prompt_logits(model, grouped_batch(tokenizer, prompt_lengths=(9, 12), response_lengths=(2, 3, 4)))
    finally:
        handle.remove()
    assert prompt_rows == [2]  # 2 distinct prompts forwarded for 6 rows


class NoCacheModel(nn.Module):
    """A causal LM that takes no KV cache argument: the shared path must fall back."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, input_ids, attention_mask, position_ids, use_cache, logits_to_keep):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache, logits_to_keep=logits_to_keep)


def test_a_model_without_cache_support_falls_back_and_says_so_once(tokenizer, caplog):
    model = NoCacheModel(tiny_causal_lm(tokenizer, seed=2, init_std=0.02))
    batch = grouped_batch(tokenizer)
    with caplog.at_level(logging.WARNING), torch.no_grad():
        shared, _ = response_logprobs(model, batch, share_prompt=True)
        response_logprobs(model, batch, share_prompt=True)
        plain, _ = response_logprobs(model, batch, share_prompt=False)
    assert torch.equal(shared, plain)
    assert sum("cannot share prompt KV caches" in r.getMessage() for r in caplog.records) == 1
    assert shared_prompt_logits(model.inner, grouped_batch(tokenizer, prompt_lengths=(5, 6, 7), response_lengths=(2,))) is None  # nothing shared


def test_on_policy_the_ratio_is_one_at_the_rollout_temperature(tokenizer):
    model = tiny_causal_lm(tokenizer, seed=4, init_std=0.02)
    prompts = [[{"role": "user", "content": text}] for text in ("Name a dog.", "Count to three, please.")]
    for temperature in (0.7, 1.3):
        outputs = HFEngine(model, tokenizer).generate(prompts, SamplingConfig(max_new_tokens=8, temperature=temperature, n=3, seed=5))
        rows = [sample for samples in outputs for sample in samples]
        batch = pack_rollouts([g.prompt_ids for g in rows], [g.response_ids for g in rows], [0.0] * len(rows), tokenizer.pad_token_id, logprobs=[g.logprobs for g in rows])
        with torch.no_grad():
            new, _ = response_logprobs(model, batch, temperature=temperature, share_prompt=True)
            untempered, _ = response_logprobs(model, batch, temperature=1.0)
        mask = batch.response_mask.bool()
        ratio = (new - batch.old_logprobs).exp()[mask]
        assert (ratio - 1).abs().max() <= 1e-4
        assert (untempered - batch.old_logprobs)[mask].abs().max() > 1e-2  # the T = 1 policy is another one


class ConstantEnv:
    def prompt(self, state: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": state}]

    def score(self, states, responses) -> list[Reward]:
        return [Reward.of(0.0) for _ in responses]


def test_entropy_keeps_no_graph_unless_the_loss_uses_it(tokenizer):
    model = tiny_causal_lm(tokenizer, seed=5, init_std=0.02).train()
    batch = grouped_batch(tokenizer)
    for coef, graph in ((0.0, False), (0.01, True)):
        module = RLModule(model, tokenizer, ConstantEnv(), AlgoConfig(name="grpo", group_size=3, entropy_coef=coef))
        logprobs, entropy = module._logprobs(model, batch, with_entropy=True)
        assert logprobs.requires_grad and entropy.requires_grad is graph


def test_a_non_finite_gradient_is_dropped_and_counted(tokenizer):
    model = tiny_causal_lm(tokenizer, seed=6, init_std=0.02).train()
    module = RLModule(model, tokenizer, ConstantEnv(), AlgoConfig(name="grpo", group_size=2, actor_lr=1e-2))
    (optimizer,) = module.configure_optimizers()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for param in model.parameters():
        param.grad = torch.full_like(param, float("nan"))
    assert math.isnan(module._step(optimizer, model))  # the norm is returned, the step is not taken
    assert module.skipped_steps == 1
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert not optimizer.state  # stepped without gradients (so that Lightning counts it): no moment moved
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    module._step(optimizer, model)
    assert module.skipped_steps == 1 and any(not torch.equal(before[n], p) for n, p in model.named_parameters())


def test_minibatches_shuffle_whole_groups(tokenizer):
    batch = grouped_batch(tokenizer, prompt_lengths=(5, 6, 7, 8), response_lengths=(1, 2))  # 4 groups of 2
    order = torch.cat([mb.input_ids for mb in batch.minibatches(4, torch.Generator().manual_seed(0), group_size=2)])
    rows = [next(i for i in range(len(batch)) if torch.equal(batch.input_ids[i], row)) for row in order]
    assert sorted(rows) == list(range(8)) and rows != list(range(8))
    assert all(rows[i] // 2 == rows[i + 1] // 2 and rows[i] % 2 == 0 for i in range(0, 8, 2))  # pairs stay whole
    with pytest.raises(ValueError, match="not whole groups of 3"):
        list(batch.minibatches(4, group_size=3))
