"""The frozen trunk reused: with LoRA on the top layers, the layers below run once per token (recorded
by the rollout, or in one pass when another engine sampled) and the update's forwards run only the
adapted layers, with the log-probs and gradients of the full forward. A tiny random Llama (4 layers, adapters on the top 2, realistic 0.02 init) with the
real SmolLM2 tokenizer; ~15 s on 2 cores."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from torch.utils.data import DataLoader

from memr1.rl.algorithms import AlgoConfig
from memr1.envs.base import Reward
from memr1.llm.engines import HFEngine
from memr1.llm.loading import load_tokenizer
from memr1.llm.lora import apply_lora
from memr1.llm.sampling import SamplingConfig
from memr1.llm.testing import tiny_causal_lm
from memr1.llm.trunk import decoder_parts, frozen_trunk_depth
from memr1.modules.base import RLModule
from memr1.rl.batch import pack_rollouts, response_logprobs, trunk_hidden_states

PROMPTS = [[{"role": "user", "content": text}] for text in ("Name a dog.", "Count to three, please, slowly.")]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("embedded:smollm2-135m-instruct")


def top_two_lora(tokenizer, seed: int = 3):
    """4 layers, adapters on the top 2 with non-zero lora_B (so they change the logits), in train mode."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # peft draws lora_A from the global generator
        model = apply_lora(tiny_causal_lm(tokenizer, seed=seed, num_layers=4, init_std=0.02), 4, 8, 0.0, top_layers=2)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05, generator=torch.Generator().manual_seed(seed))
    return model.train()


def sampled_batch(tokenizer, model):
    """Two prompts of different lengths, 3 samples each, with the trunk states the engine recorded; a
    fifth of the vocabulary ends a response, so rows finish (and leave the decoding batch) at different steps."""
    engine = HFEngine(model, tokenizer, eos_token_ids=range(0, len(tokenizer), 5))
    outputs = engine.generate(PROMPTS, SamplingConfig(max_new_tokens=6, temperature=1.0, n=3, seed=4), trunk_depth=2)
    rows = [sample for samples in outputs for sample in samples]
    return pack_rollouts(
        [g.prompt_ids for g in rows],
        [g.response_ids for g in rows],
        [0.0] * len(rows),
        tokenizer.pad_token_id,
        logprobs=[g.logprobs for g in rows],
        trunk_hidden=[g.trunk_hidden for g in rows],
    ), rows


def logprobs_and_grads(model, batch, share: bool, depth: int):
    model.zero_grad()
    logprobs, entropy = response_logprobs(model, batch, with_entropy=True, temperature=0.7, share_prompt=share, trunk_depth=depth)
    ((logprobs * batch.response_mask).sum() + (entropy * batch.response_mask).sum()).backward()
    return logprobs.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_the_trunk_depth_is_the_layers_below_the_lowest_adapter(tokenizer):
    assert frozen_trunk_depth(top_two_lora(tokenizer)) == 2
    assert frozen_trunk_depth(apply_lora(tiny_causal_lm(tokenizer, num_layers=4), 4, 8, 0.0, top_layers=1)) == 3
    assert frozen_trunk_depth(apply_lora(tiny_causal_lm(tokenizer, num_layers=4), 4, 8, 0.0)) == 0  # every layer adapted
    assert frozen_trunk_depth(tiny_causal_lm(tokenizer, num_layers=4)) == 0  # full fine-tuning: nothing is frozen
    assert decoder_parts(torch.nn.Linear(2, 2)) is None and frozen_trunk_depth(torch.nn.Linear(2, 2)) == 0


@pytest.mark.parametrize("share", [False, True])
def test_the_head_from_recorded_trunk_states_gives_the_full_forwards_logprobs_and_gradients(tokenizer, share):
    model = top_two_lora(tokenizer)
    batch, rows = sampled_batch(tokenizer, model)
    assert len({len(g.response_ids) for g in rows}) > 1 and len({len(g.prompt_ids) for g in rows}) == 2  # padding both sides
    model.train()
    full, full_grads = logprobs_and_grads(model, batch, share=False, depth=0)
    head, head_grads = logprobs_and_grads(model, batch, share=share, depth=2)
    mask = batch.response_mask.bool()
    assert (head - full)[mask].abs().max() <= 1e-5
    assert set(head_grads) == set(full_grads) and len(head_grads) == 2 * 4 * 2  # 2 layers x q,k,v,o x A,B
    for name in full_grads:
        torch.testing.assert_close(head_grads[name], full_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    with model.disable_adapter(), torch.no_grad():  # the reference: the same trunk, the head without adapters
        reference_full, _ = response_logprobs(model, batch, share_prompt=share)
        reference_head, _ = response_logprobs(model, batch, share_prompt=share, trunk_depth=2)
    assert (reference_head - reference_full)[mask].abs().max() <= 1e-5
    assert (reference_head - head)[mask].abs().max() > 1e-3  # the adapters matter


@pytest.mark.parametrize("share", [False, True])
def test_the_rollouts_trunk_states_equal_the_ones_a_forward_computes(tokenizer, share):
    model = top_two_lora(tokenizer, seed=5)
    batch, rows = sampled_batch(tokenizer, model)
    computed = trunk_hidden_states(model, batch, 2, share_prompt=share)
    # The tokens the model read: real prompt tokens and each response token but the last of its row.
    real = torch.cat([batch.attention_mask[:, : batch.prompt_length], batch.response_mask[:, 1:]], dim=1).bool()
    assert computed.shape == batch.trunk_hidden.shape == (len(rows), batch.input_ids.shape[1] - 1, 64)
    assert (computed - batch.trunk_hidden)[real].abs().max() <= 1e-5
    assert (batch.trunk_hidden[~real] == 0).all()
    with pytest.raises(ValueError, match="row 0 has 1 trunk states"):
        pack_rollouts([[5, 6]], [[7, 8]], [0.0], tokenizer.pad_token_id, trunk_hidden=[torch.zeros(1, 64)])


class FirstOfGroupEnv:
    def prompt(self, state: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": state}]

    def score(self, states, responses) -> list[Reward]:
        return [Reward.of(1.0 if row % 3 == 0 else 0.0) for row in range(len(responses))]


def train_one_step(tokenizer, reuse: bool, separate_engine: bool) -> tuple[dict[str, torch.Tensor], dict, list[int]]:
    """One GRPO step with the KL on: the policy's gradients at the optimiser step, the step's metrics,
    and the rows of every run of layer 0 after the rollout. `separate_engine`: the rollout comes from an engine that is not
    the module's own (as vLLM's), so nothing is recorded and the old log-probs are recomputed."""
    model = top_two_lora(tokenizer, seed=7)
    algo = AlgoConfig(name="grpo", group_size=3, actor_lr=1e-2, kl_coef=0.1, micro_batch_size=3, reuse_frozen_trunk=reuse)
    engine = HFEngine(model, tokenizer, batch_size=8) if separate_engine else None
    module = RLModule(model, tokenizer, FirstOfGroupEnv(), algo, engine=engine, max_new_tokens=6, seed=2)
    bottom_rows: list[int] = []
    rollout = module.rollout

    def rollout_then_count(states):
        result = rollout(states)
        decoder_parts(model).layers[0].register_forward_hook(lambda m, args, out: bottom_rows.append(args[0].shape[0]))
        return result

    module.rollout = rollout_then_count
    gradients = Gradients()
    trainer = Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=[gradients])
    trainer.fit(module, train_dataloaders=DataLoader([state["content"] for state in (p[0] for p in PROMPTS)], batch_size=2, collate_fn=list))
    return gradients.seen, module.last_step.metrics, bottom_rows


class Gradients(Callback):
    """The policy's gradients as the optimiser step receives them."""

    def __init__(self) -> None:
        self.seen: dict[str, torch.Tensor] = {}

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: RLModule, optimizer: Any) -> None:
        self.seen = {n: p.grad.detach().clone() for n, p in pl_module.policy.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("separate_engine", [False, True])
def test_an_rl_step_reusing_the_trunk_trains_as_one_that_does_not_and_skips_the_bottom_layers(tokenizer, separate_engine):
    reused, reused_metrics, reused_bottom = train_one_step(tokenizer, True, separate_engine)
    plain, plain_metrics, plain_bottom = train_one_step(tokenizer, False, separate_engine)
    for name in ("actor/policy_loss", "actor/kl", "actor/grad_norm", "actor/entropy"):
        assert reused_metrics[name] == pytest.approx(plain_metrics[name], rel=1e-4, abs=1e-7), name
    assert plain_metrics["actor/kl"] > 0 and plain_metrics["actor/grad_norm"] > 0
    # The gradients, not the weights after the step: AdamW's first step, lr * g / (|g| + eps), turns a
    # float-rounding difference of 2e-8 in a gradient component of |g| ~ 4e-7 into ~1e-5 of weight.
    assert plain and reused.keys() == plain.keys()
    for name in plain:
        torch.testing.assert_close(reused[name], plain[name], rtol=1e-4, atol=1e-7, msg=name)
    # Two micro-batches of one group each; a shared-prompt pass runs the prompt (1 row), then its 3 responses.
    if separate_engine:
        assert reused_bottom == [1, 3] * 2  # one trunk pass before the update
        # reference, policy, each through every layer (a single-pass update takes the old log-probs
        # from the policy's own forward)
        assert plain_bottom == [1, 3] * 2 * 2
    else:
        assert reused_bottom == []  # the rollout recorded the trunk's states
        assert plain_bottom == [1, 3] * 2 * 2  # reference, policy
