"""One update step on a fixed rollout batch through a real Lightning Trainer, its gradient read just
before the optimiser steps: shared by tests/test_rl_aggregation.py and tests/scripts/ddp_update.py.

The rollout (sampling and the environment) is a fixed batch; the module, its update and the Trainer
are the real ones. Two prompts of different lengths (left padding), each with G = 3 responses of
lengths 1..6 (right padding); a tiny random Llama with LoRA (non-zero lora_B) and the real tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from lightning.pytorch import Trainer
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader

from memr1.envs.base import Reward
from memr1.llm.lora import apply_lora
from memr1.llm.testing import tiny_causal_lm
from memr1.llm.value import ValueModel
from memr1.modules.base import RLModule
from memr1.modules.sft import SupervisedStep
from memr1.rl.algorithms import AlgoConfig
from memr1.rl.batch import RolloutBatch, pack_rollouts, response_logprobs

GROUP = 3
PROMPT_LENGTHS = (7, 11)
RESPONSE_LENGTHS = ((1, 4, 6), (2, 5, 3))
SCORES = (1.0, 0.0, 0.5, 0.25, 1.0, 0.0)


def fixed_rows(tokenizer) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) of the 6 rows, group by group."""
    generator = torch.Generator().manual_seed(0)
    rows = []
    for prompt_length, lengths in zip(PROMPT_LENGTHS, RESPONSE_LENGTHS):
        prompt = torch.randint(5, 1000, (prompt_length,), generator=generator).tolist()
        for length in lengths:
            rows.append((prompt, torch.randint(5, 1000, (length,), generator=generator).tolist()))
    return rows


def policy(tokenizer, lora: bool = True) -> nn.Module:
    """LoRA on q and v (non-zero adapters), or the whole tiny model trained (`lora=False`)."""
    model = tiny_causal_lm(tokenizer, seed=3, num_layers=2, init_std=0.02)
    if not lora:
        return model
    model = apply_lora(model, 4, 8, 0.0, ["q_proj", "v_proj"])
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():  # every adapter drawn here (peft draws lora_A from the global RNG), lora_B non-zero
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, 0.1, generator=generator)
    return model


def on_policy_logprobs(tokenizer, rows) -> list[list[float]]:
    prompts, responses = zip(*rows)
    batch = pack_rollouts(prompts, responses, [0.0] * len(rows), tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs, _ = response_logprobs(policy(tokenizer).eval(), batch)
    return [logprobs[i, : len(r)].tolist() for i, r in enumerate(responses)]


class GradientProbe:
    """Mixed into a module: keeps each trainable gradient (actor/..., critic/...) as the optimiser is
    about to step."""

    grads: dict[str, torch.Tensor]

    def _step(self, optimizer, module: nn.Module) -> float:
        role = "critic" if module is self.critic else "actor"
        self.grads.update({f"{role}/{n}": full(p.grad) for n, p in module.named_parameters() if p.grad is not None})
        return super()._step(optimizer, module)


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of `tensor`, all-gathered when FSDP2 shards it (a DTensor; every rank must call it)."""
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def trainable_parameters(module: RLModule) -> dict[str, torch.Tensor]:
    """The trainable parameters of the policy (and critic), gathered when sharded."""
    models = {"actor": module.policy, "critic": module.critic}
    return {f"{role}/{n}": full(p) for role, model in models.items() if model is not None
            for n, p in model.named_parameters() if p.requires_grad}


class FixedRollout(GradientProbe, RLModule):
    """The rollout is the fixed rows of the step's states (row indices), with their scores and pi_old's log-probs."""

    def __init__(self, *args, rows, old_logprobs, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rows, self.old, self.grads = rows, old_logprobs, {}

    def rollout(self, states: Sequence[int]):
        prompts, responses = zip(*[self.rows[i] for i in states])
        batch = pack_rollouts(prompts, responses, [SCORES[i] for i in states], self.tokenizer.pad_token_id,
                              logprobs=[self.old[i] for i in states])
        return batch, [Reward.of(SCORES[i]) for i in states]


class FixedTargets(GradientProbe, SupervisedStep):
    """SFT on the fixed rows as (prompt, target)."""

    def __init__(self, *args, rows, **kwargs) -> None:
        super().__init__(*args, trajectories=None, **kwargs)
        self.rows, self.grads = rows, {}

    def sft_batch(self, states: Sequence[int]) -> tuple[RolloutBatch, int]:
        prompts, responses = zip(*[self.rows[i] for i in states])
        return pack_rollouts(prompts, responses, [0.0] * len(states), self.tokenizer.pad_token_id).to(self.device), 0


def build(
    tokenizer, algo_name: str, micro: int, share: bool = True, loss_agg_mode: str = "token-mean", lora: bool = True
) -> RLModule:
    """`lora=False` (SFT only: the RL algorithms' KL needs the adapters-disabled reference) trains the
    whole model."""
    rows = fixed_rows(tokenizer)
    common = dict(max_new_tokens=8, seed=1)
    if algo_name == "sft":
        algo = AlgoConfig(name="sft", actor_lr=1e-3, micro_batch_size=micro, loss_agg_mode=loss_agg_mode)
        return FixedTargets(policy(tokenizer, lora), tokenizer, None, algo, rows=rows, **common)
    algo = AlgoConfig(
        name=algo_name, group_size=GROUP, actor_lr=1e-3, critic_lr=1e-3, kl_coef=0.05, entropy_coef=0.01,
        micro_batch_size=micro, share_prompt=share, loss_agg_mode=loss_agg_mode,
    )
    critic = None
    if algo_name == "ppo":
        critic = apply_lora(ValueModel(tiny_causal_lm(tokenizer, seed=5, init_std=0.02)), 4, 8, 0.0, ["q_proj", "v_proj"], modules_to_save=["value_head"])
        generator = torch.Generator().manual_seed(8)
        with torch.no_grad():
            for name, param in critic.named_parameters():
                if "lora_" in name or "value_head" in name:
                    param.normal_(0.0, 0.1, generator=generator)
    return FixedRollout(policy(tokenizer), tokenizer, None, algo, critic=critic, rows=rows,
                        old_logprobs=on_policy_logprobs(tokenizer, rows), **common)


def step(module: RLModule, states: Sequence[int], steps: int = 1, **trainer_options) -> dict[str, torch.Tensor]:
    """`steps` training steps, each on `states` (row indices); the gradients the last stepped with."""
    trainer = Trainer(
        accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=False, **trainer_options,
    )
    trainer.fit(module, train_dataloaders=DataLoader([list(states)] * steps, batch_size=None))
    return module.grads
