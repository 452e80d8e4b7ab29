"""The RL LightningModule on a tiny random model with the real SmolLM2 tokenizer.

The environments here are test doubles for the *environment* (they reward fixed positions in each
group), so what is tested is the module: rollout → advantages → update, PPO and GRPO, on a real
Lightning Trainer.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import pytest
import torch
from lightning.pytorch import LightningDataModule, Trainer
from torch.utils.data import DataLoader

from memr1.agents.answer import AnswerAgent
from memr1.callbacks import ExportPolicy, MetricsCSV, TrainingCurves
from memr1.envs.answer import AnswerEnv, AnswerState
from memr1.envs.base import Reward
from memr1.llm.loading import load_tokenizer
from memr1.llm.lora import apply_lora
from memr1.llm.precision import choose_precision
from memr1.llm.testing import tiny_causal_lm
from memr1.llm.value import ValueModel
from memr1.modules.answer import AnswerRLModule
from memr1.rl.algorithms import AlgoConfig
from memr1.modules.base import RLModule
from memr1.rl.batch import response_logprobs
from memr1.training import fit
from memr1.types import MemoryEntry, Question

EMBEDDED = "embedded:smollm2-135m-instruct"


class FirstOfGroupEnv:
    """Rewards the first response of every group of `group_size` rows with 1, the others with 0."""

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def prompt(self, state: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": state}]

    def score(self, states: Sequence[str], responses: Sequence[str]) -> list[Reward]:
        return [Reward.of(1.0 if row % self.group_size == 0 else 0.0) for row in range(len(responses))]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(EMBEDDED)


def fit_one_step(module: RLModule, states: list, steps: int = 1) -> Trainer:
    trainer = Trainer(
        accelerator="cpu",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = DataLoader(states, batch_size=len(states), collate_fn=list)
    trainer.fit(module, train_dataloaders=loader)
    return trainer


def sequence_logprobs(module: RLModule) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(old, new) summed response log-probs per row of the last rollout, and its advantages per row."""
    batch = module.last_step.rollout
    module.policy.eval()
    with torch.no_grad():
        new, _ = response_logprobs(module.policy, batch)
    mask = batch.response_mask.float()
    advantage = (batch.advantages * mask).sum(1) / mask.sum(1).clamp(min=1)
    return (batch.old_logprobs * mask).sum(1), (new * mask).sum(1), advantage


def test_grpo_step_raises_the_logprob_of_rewarded_samples(tokenizer):
    # LR 1e-4: Adam's first step moves every weight by ~LR, so only a small one is first-order for each
    # sample; at 1e-3 a rewarded sample's log-prob fell for 2 of 4 module seeds (3-6), at 1e-4 for none.
    algo = AlgoConfig(
        name="grpo", group_size=4, actor_lr=1e-4, kl_coef=0.0, micro_batch_size=4, grad_clip=100.0
    )
    module = RLModule(tiny_causal_lm(tokenizer, seed=1), tokenizer, FirstOfGroupEnv(4), algo, max_new_tokens=8, seed=3)
    before = {name: p.detach().clone() for name, p in module.policy.named_parameters()}
    fit_one_step(module, ["Say hello.", "Count to three."])
    old, new, advantage = sequence_logprobs(module)
    # Group advantages: the rewarded first sample of each group is positive, the other three negative.
    assert (advantage[[0, 4]] > 0).all() and (advantage[[1, 2, 3, 5, 6, 7]] < 0).all()
    assert (new[advantage > 0] > old[advantage > 0]).all()
    assert (new[advantage < 0] - old[advantage < 0]).mean() < 0
    assert any(not torch.equal(before[name], p) for name, p in module.policy.named_parameters())


def test_ppo_step_updates_actor_and_critic_in_the_direction_of_the_advantage(tokenizer):
    algo = AlgoConfig(name="ppo", actor_lr=1e-3, critic_lr=1e-2, micro_batch_size=2, grad_clip=100.0)
    critic = ValueModel(tiny_causal_lm(tokenizer, seed=2))
    # One state per "group": state 0 and 2 earn 1, states 1 and 3 earn 0 (FirstOfGroupEnv with groups of 2).
    module = RLModule(tiny_causal_lm(tokenizer, seed=1), tokenizer, FirstOfGroupEnv(2), algo, max_new_tokens=8, critic=critic, seed=5)
    head_before = critic.value_head.bias.detach().clone()
    fit_one_step(module, ["a", "b", "c", "d"])
    old, new, advantage = sequence_logprobs(module)
    # The critic starts at 0, so GAE (gamma = lambda = 1, whitened) is positive exactly where reward is 1.
    assert (advantage[[0, 2]] > 0).all() and (advantage[[1, 3]] < 0).all()
    assert (new[[0, 2]] > old[[0, 2]]).all()
    assert (new[[1, 3]] < old[[1, 3]]).all()
    # Returns are 0.5 on average: the value head's bias moved up from 0.
    assert critic.value_head.bias.item() > head_before.item()


def test_malformed_answers_from_a_random_model_never_stop_training(tokenizer):
    """A random model writes garbage: every response is a format error, and training goes on."""
    memories = {
        "Andrew": [MemoryEntry("m1", "Andrew adopted two dogs, Buddy and Scout", "Andrew", "1 May, 2023")],
        "Audrey": [],
    }
    states = [
        AnswerState(Question("c/q0", "c", "What are Andrew's dogs called?", "Buddy and Scout", ("D1:1",), 1), memories),
        AnswerState(Question("c/q1", "c", "When did Andrew adopt dogs?", "May 2023", ("D1:1",), 2), memories),
    ]
    env = AnswerEnv(AnswerAgent(), reward="em", format_penalty=-0.5)
    algo = AlgoConfig(name="grpo", group_size=2, actor_lr=1e-4, kl_coef=0.0, micro_batch_size=4)
    module = AnswerRLModule(tiny_causal_lm(tokenizer, seed=4), tokenizer, env, algo, max_new_tokens=6, seed=0)
    trainer = fit_one_step(module, states, steps=2)
    assert trainer.global_step == 2
    rewards = module.last_step.rewards
    assert len(rewards) == 4
    assert all(r.format_error is not None and r.score == -0.5 for r in rewards)


class AnswerStatesData(LightningDataModule):
    def __init__(self, states: list[AnswerState]) -> None:
        super().__init__()
        self.states = states

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.states * 2, batch_size=len(self.states), collate_fn=list)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.states, batch_size=len(self.states), collate_fn=list)


# bf16 with a LoRA policy: its frozen weights compute with bf16 copies, first made in the validation
# before training (Lightning validates under inference mode), then used by the update.
@pytest.mark.parametrize("val_before_train, precision", [(True, "fp32"), (False, "fp32"), (True, "bf16")])
def test_val_before_train_puts_the_base_policy_at_step_zero(tokenizer, tmp_path, val_before_train, precision):
    memories = {"Andrew": [MemoryEntry("m1", "Andrew adopted two dogs, Buddy and Scout", "Andrew", "1 May, 2023")]}
    states = [AnswerState(Question("c/q0", "c", "What are Andrew's dogs called?", "Buddy and Scout", ("D1:1",), 1), memories)]
    algo = AlgoConfig(name="grpo", group_size=2, actor_lr=1e-4, kl_coef=0.0, micro_batch_size=2)
    policy = tiny_causal_lm(tokenizer, seed=4)
    module = AnswerRLModule(
        policy if precision == "fp32" else apply_lora(policy, r=4, dropout=0.0), tokenizer, AnswerEnv(AnswerAgent(), reward="f1"), algo,
        max_new_tokens=4, seed=0, val_sampled_reward=True, precision=choose_precision(precision, "cpu"),
    )
    trainer = Trainer(
        accelerator="cpu",
        max_steps=2,
        val_check_interval=2,
        check_val_every_n_epoch=None,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[metrics := MetricsCSV(tmp_path / "metrics.csv"), TrainingCurves(tmp_path, metrics), ExportPolicy(tmp_path / "policy", monitor="val/f1")],
    )
    fit(trainer, module, AnswerStatesData(states), ckpt_path=None, val_before_train=val_before_train)
    curves = json.loads((tmp_path / "curves.json").read_text())
    assert [step for step, _ in curves["val"]["val/f1"]] == ([0, 2] if val_before_train else [2])
    # Beside the greedy F1, the sampled reward of the same validation states at every check.
    assert [step for step, _ in curves["val"]["val/sampled_reward"]] == ([0, 2] if val_before_train else [2])
    assert all(0.0 <= value <= 1.0 for _, value in curves["val"]["val/sampled_reward"])
    assert [step for step, _ in curves["train"]["reward/mean"]] == [1, 2]
    assert (tmp_path / "policy" / "best" / ("config.json" if precision == "fp32" else "adapter_config.json")).exists()  # a LoRA export


def test_several_epochs_over_minibatches_report_the_clip_per_epoch(tokenizer):
    """ppo_epochs = 3 over 2 minibatches: 6 optimiser steps per rollout, one Lightning step. The first
    minibatch of epoch 0 is on-policy (ratio 1, nothing clipped); by the last epoch the policy has moved
    past the clip range on some tokens, and the per-epoch numbers say so."""
    algo = AlgoConfig(
        name="grpo", group_size=4, actor_lr=3e-2, kl_coef=0.0, micro_batch_size=4,
        ppo_epochs=3, mini_batch_size=4, grad_clip=100.0,
    )
    module = RLModule(tiny_causal_lm(tokenizer, seed=1), tokenizer, FirstOfGroupEnv(4), algo, max_new_tokens=8, seed=3)
    trainer = fit_one_step(module, ["Say hello.", "Count to three."])
    assert trainer.global_step == 1
    metrics = module.last_step.metrics
    assert {f"actor/clip_frac/epoch{e}" for e in range(3)} <= set(metrics)
    assert {f"actor/approx_kl/epoch{e}" for e in range(3)} <= set(metrics)
    assert metrics["actor/clip_frac/epoch2"] > 0
    assert metrics["actor/clip_frac/epoch2"] >= metrics["actor/clip_frac/epoch0"]


class ProbeData(LightningDataModule):
    """Training states and a probe set, as RLStatesDataModule offers them."""

    def __init__(self, states: list[str]) -> None:
        super().__init__()
        self.states = states

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.states * 4, batch_size=len(self.states), collate_fn=list)

    def probe_states(self, count: int) -> list[str]:
        return self.states[:count]


class LengthEnv(FirstOfGroupEnv):
    """Rewards a response by its length in characters / 100: a reward that depends on what was sampled."""

    def score(self, states: Sequence[str], responses: Sequence[str]) -> list[Reward]:
        return [Reward.of(len(text) / 100) for text in responses]


def test_the_probe_reward_scores_fixed_states_with_a_fixed_seed(tokenizer):
    algo = AlgoConfig(name="grpo", group_size=4, actor_lr=1e-3, kl_coef=0.0, micro_batch_size=4)
    module = RLModule(tiny_causal_lm(tokenizer, seed=1), tokenizer, LengthEnv(4), algo, max_new_tokens=6, seed=3, probe_states=2, probe_every_n_steps=2)
    trainer = Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=ProbeData(["Say hello.", "Count to three.", "Name a dog."]))
    assert module.held_out.probe == ["Say hello.", "Count to three."]
    logged = module.last_step.metrics["train/probe_reward"]  # probed at step 2, after its update
    # The same policy and the same seed give the same samples: the probe moves only when the policy does.
    assert module.probe_reward() == logged == module.probe_reward()
    assert logged > 0


def test_the_sampled_validation_reward_samples_at_the_rollout_temperature(tokenizer):
    algo = AlgoConfig(name="grpo", group_size=4, temperature=1.0, kl_coef=0.0, micro_batch_size=4)
    module = RLModule(tiny_causal_lm(tokenizer, seed=1), tokenizer, LengthEnv(4), algo, max_new_tokens=12, seed=3, val_sampled_reward=True)
    states = ["Say hello.", "Count to three.", "Name a dog.", "Spell cat."]
    module.sample_validation_rewards(states)
    module.sample_validation_rewards(states)  # the next batch draws with its own seed
    first, second = module.held_out._val_sampled[:4], module.held_out._val_sampled[4:]
    assert len(first) == len(second) == 4 and first != second  # sampled, not greedy
    assert module.held_out.take_sampled_validation_reward() == pytest.approx(sum(first + second) / 8)
    assert module.held_out.take_sampled_validation_reward() is None  # taken: the next validation starts afresh
    off = RLModule(tiny_causal_lm(tokenizer, seed=1), tokenizer, LengthEnv(4), algo, max_new_tokens=12, seed=3)
    off.sample_validation_rewards(states)
    assert off.held_out.take_sampled_validation_reward() is None


class ZeroEnv(FirstOfGroupEnv):
    """Every response earns 0: only a KL in the reward can tell them apart."""

    def score(self, states: Sequence[str], responses: Sequence[str]) -> list[Reward]:
        return [Reward.of(0.0) for _ in responses]


def test_a_kl_in_the_reward_is_what_the_advantages_see_and_leaves_the_loss(tokenizer):
    # Rewards all 0, a reference that is another model: with kl_in_reward each group's advantages rank
    # its samples by their KL (the smaller, the better) and the loss has no KL term; in the loss
    # (kl_in_reward false) the same rollout's advantages are all 0.
    algo = AlgoConfig(name="grpo", group_size=4, actor_lr=1e-4, kl_coef=0.5, kl_kind="k1", kl_in_reward=True, micro_batch_size=4)
    module = RLModule(
        tiny_causal_lm(tokenizer, seed=1), tokenizer, ZeroEnv(4), algo, reference=tiny_causal_lm(tokenizer, seed=2), max_new_tokens=6, seed=3
    )
    fit_one_step(module, ["Say hello.", "Name a dog."])
    batch, metrics = module.last_step.rollout, module.last_step.metrics
    assert "actor/kl" not in metrics and metrics["reward/mean"] == 0.0
    mask = batch.response_mask.float()
    kl = ((batch.old_logprobs - batch.ref_logprobs) * mask).sum(dim=-1)
    assert metrics["reward/kl_mean"] == pytest.approx(float(kl.mean()), rel=1e-5)
    advantage = (batch.advantages * mask).sum(dim=-1) / mask.sum(dim=-1)
    for group in (slice(0, 4), slice(4, 8)):
        assert torch.equal(torch.argsort(advantage[group]), torch.argsort(-kl[group]))
    in_loss = RLModule(
        tiny_causal_lm(tokenizer, seed=1), tokenizer, ZeroEnv(4), dataclasses.replace(algo, kl_in_reward=False),
        reference=tiny_causal_lm(tokenizer, seed=2), max_new_tokens=6, seed=3,
    )
    fit_one_step(in_loss, ["Say hello.", "Name a dog."])
    assert torch.all(in_loss.last_step.rollout.advantages == 0) and "actor/kl" in in_loss.last_step.metrics


def test_with_reinforce_the_reward_is_the_advantage_even_in_a_group_that_agrees(tokenizer):
    algo = AlgoConfig(name="reinforce", group_size=4, actor_lr=1e-3, kl_coef=0.0, micro_batch_size=4)
    module = RLModule(tiny_causal_lm(tokenizer, seed=1), tokenizer, LengthEnv(4), algo, max_new_tokens=6, seed=3)
    batch, _ = module.rollout(["Say hello.", "Name a dog."])
    batch.scores = torch.tensor([0.3, 0.3, 0.3, 0.3, -0.2, 0.0, 0.1, 0.1])  # the first group all alike
    module._advantages(batch, [0, 0, 0, 0, 1, 1, 1, 1])
    mask = batch.response_mask.float()
    assert torch.equal(batch.advantages, batch.scores.unsqueeze(1) * mask)
    # GRPO's group baseline gives the agreeing group nothing to learn from.
    grouped = RLModule(tiny_causal_lm(tokenizer, seed=1), tokenizer, LengthEnv(4), AlgoConfig(name="grpo", group_size=4), max_new_tokens=6)
    grouped._advantages(batch, [0, 0, 0, 0, 1, 1, 1, 1])
    assert torch.all(batch.advantages[:4] == 0)
    with pytest.raises(ValueError, match="algo.name: 'mean' is not one of"):
        AlgoConfig(name="mean")
