"""A short GRPO or PPO run of a tiny model on a real Lightning Trainer, for the resume tests (DDP runs
through train.py in tests/test_ddp.py).

    python rl_run.py RUN_DIR --max-steps 4 [--kill-at-step 2] [--resume] [--algo ppo]

It checkpoints every step, can SIGKILL itself at the start of a step (after the previous step's
checkpoint is on disk), and on a clean finish writes the policy's parameters to RUN_DIR/final.pt.
The environment rewards the first response of each group: a stand-in for the reward, the module
and the trainer are the real ones.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from data_modules.rl_states import StepBatches, collate_states
from memr1.envs.base import Reward
from memr1.llm.loading import load_tokenizer
from memr1.llm.testing import tiny_causal_lm
from memr1.llm.value import ValueModel
from memr1.rl.algorithms import AlgoConfig
from memr1.modules.base import RLModule

PROMPTS = ["Say hello.", "Count to three.", "Name a colour.", "Name a dog.", "Spell cat.", "Add 2 and 2."]


class FirstOfGroupEnv:
    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def prompt(self, state: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": state}]

    def score(self, states, responses) -> list[Reward]:
        return [Reward(1.0 if row % self.group_size == 0 else 0.0, None) for row in range(len(responses))]


class KillAtStep(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class Module(RLModule):
    def train_dataloader(self) -> DataLoader:
        # The batches of the steps still to run: a resumed run continues where the killed one stopped.
        steps = range(self.trainer.global_step, self.trainer.max_steps)
        return DataLoader(StepBatches(PROMPTS, 2, seed=7, steps=steps), batch_size=None, collate_fn=collate_states)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--kill-at-step", type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--algo", default="grpo", choices=["grpo", "ppo"])
    args = parser.parse_args()

    seed_everything(0)
    tokenizer = load_tokenizer("embedded:smollm2-135m-instruct")
    group = 2 if args.algo == "grpo" else 1
    algo = AlgoConfig(name=args.algo, group_size=group, actor_lr=1e-3, critic_lr=1e-3, kl_coef=0.0, micro_batch_size=2)
    critic = ValueModel(tiny_causal_lm(tokenizer, seed=2)) if args.algo == "ppo" else None
    env = FirstOfGroupEnv(group if group > 1 else 2)
    module = Module(tiny_causal_lm(tokenizer, seed=1), tokenizer, env, algo, max_new_tokens=6, critic=critic, seed=11)
    callbacks: list[Callback] = [ModelCheckpoint(dirpath=args.run_dir / "checkpoints", every_n_train_steps=1, save_last=True, save_top_k=-1)]
    if args.kill_at_step is not None:
        callbacks.append(KillAtStep(args.kill_at_step))
    trainer = Trainer(
        accelerator="cpu",
        max_steps=args.max_steps,
        logger=False,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(args.run_dir),
    )
    trainer.fit(module, ckpt_path="last" if args.resume else None)
    torch.save({name: p.detach().clone() for name, p in module.policy.named_parameters()}, args.run_dir / "final.pt")
    print(f"finished at global step {trainer.global_step}")


if __name__ == "__main__":
    main()
