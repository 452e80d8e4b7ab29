"""The RL LightningModule shared by both agents: rollout → reward → advantages → PPO / GRPO update.

The module orchestrates; the maths lives in `memr1.rl.core` (pure functions), the tensors in
`memr1.rl.batch`, the rewards in `memr1.envs`. Subclasses only say how to validate and what extra to
log (`ManagerRLModule`, `AnswerRLModule`).

One training step:
1. rollout: every state's prompt is sampled `group_size` times (GRPO's G; PPO uses 1) by the rollout
   engine — the policy itself through `HFEngine`, or vLLM kept in sync by `VLLMWeightSync`; with LoRA
   on the top layers, the frozen layers below run once per token (`memr1.llm.trunk`), here or in 3;
2. reward: the environment scores each response (never raising on malformed output);
3. old log-probs (unless the policy sampled them itself), reference log-probs for the KL and critic
   values for PPO, by forward passes without gradients, in micro-batches;
4. advantages: GAE over the critic's values (PPO) or group-normalised scores (GRPO);
5. `ppo_epochs` passes over shuffled mini-batches, each accumulating gradients over micro-batches
   before one optimiser step of the actor (and of the critic for PPO).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

import torch
from lightning.pytorch import LightningModule
from torch import nn

from memr1.config import AlgoConfig
from memr1.envs.base import Environment, Reward
from memr1.interrupt import raise_if_requested
from memr1.llm.engines import GenerationEngine, HFEngine
from memr1.llm.sampling import SamplingConfig
from memr1.llm.sharding import clip_grad_norm, is_sharded
from memr1.llm.trunk import frozen_trunk_depth
from memr1.modules.held_out import HeldOutRewards
from memr1.rl import core
from memr1.rl.batch import RolloutBatch, pack_rollouts, response_logprobs, response_values, trunk_hidden_states

class RLModule(HeldOutRewards, LightningModule):
    """Trains `policy` on `env` with PPO (a `critic` is required) or GRPO (no critic).

    `reference` is the frozen policy of the KL term; None with a peft policy means "the same model with
    its adapters disabled" (no second copy), None otherwise means no KL term can be computed.
    """

    def __init__(
        self,
        policy: nn.Module,
        tokenizer: Any,
        env: Environment,
        algo: AlgoConfig,
        critic: nn.Module | None = None,
        reference: nn.Module | None = None,
        engine: GenerationEngine | None = None,
        seed: int = 0,
        probe_states: int = 0,
        probe_every_n_steps: int = 0,
        val_sampled_reward: bool = False,
        max_new_tokens: int = 256,
    ) -> None:
        super().__init__()
        if algo.name == "ppo" and critic is None:
            raise ValueError("algo=ppo needs a critic (a value model)")
        self.policy = policy.train()
        self.critic = critic.train() if critic is not None and algo.name == "ppo" else None
        self.reference = reference.eval() if reference is not None else None
        self.tokenizer = tokenizer
        self.env = env
        self.algo = algo
        self.max_new_tokens = max_new_tokens  # the trained agent's decoding cap (answer/manager.max_new_tokens)
        self.seed = seed
        # None: the policy samples for itself. A vLLM engine is set by train.py and kept in sync.
        self.engine = engine or HFEngine(policy, tokenizer, batch_size=max(algo.micro_batch_size, 8))
        self._policy_samples_itself = engine is None
        self.automatic_optimization = False
        self.skipped_steps = 0  # optimiser steps dropped for a non-finite gradient norm
        self._stage_seconds: dict[str, float] = {}  # of the current step: rollout, update, ...
        self._sharded = False  # FSDP shards the modules (set once the strategy has wrapped them)
        self._trunk_depth = 0  # frozen bottom layers, run once per token (memr1.llm.trunk; set in on_train_start)
        # A fixed probe set of training states, sampled with a fixed seed every N steps: the step reward
        # compares different questions each step, the probe reward the same ones (`train/probe_reward`).
        self.probe_count, self.probe_every_n_steps = probe_states, probe_every_n_steps
        self.probe: list[Any] = []
        # Validation also samples each state once as rollouts do (`val/sampled_reward`): the reward the
        # training curve reports, on held-out states, beside the greedy metrics.
        self.val_sampled_reward = val_sampled_reward
        self._val_sampled: list[float] = []
        self.strict_loading = False  # checkpoints hold the trainable weights only (on_save_checkpoint)
        self.save_hyperparameters({"algo": asdict(algo), "seed": seed})

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Frozen weights (a LoRA policy's base, the KL reference) are rebuilt from the backbone on load:
        # a checkpoint keeps what training changes, kilobytes for LoRA instead of whole models.
        trainable = {name for name, param in self.named_parameters() if param.requires_grad}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}
        checkpoint["skipped_steps"] = self.skipped_steps

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.skipped_steps = checkpoint.get("skipped_steps", 0)  # a resumed run keeps counting

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        # A batch is a list of states (Python objects): tensors are made, on the right device, in rollout.
        return batch

    # -- optimisation -------------------------------------------------------------------------------
    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        def adamw(module: nn.Module, lr: float) -> torch.optim.Optimizer:
            params = [p for p in module.parameters() if p.requires_grad]
            if not params:
                raise ValueError(f"{type(module).__name__}: no trainable parameters")
            return torch.optim.AdamW(params, lr=lr, weight_decay=self.algo.weight_decay)

        optimizers = [adamw(self.policy, self.algo.actor_lr)]
        if self.critic is not None:
            optimizers.append(adamw(self.critic, self.algo.critic_lr))
        return optimizers

    def _optimizers(self) -> tuple[Any, Any | None]:
        optimizers = self.optimizers()
        if isinstance(optimizers, (list, tuple)):
            return optimizers[0], optimizers[1] if len(optimizers) > 1 else None
        return optimizers, None

    # -- rollout and reward -------------------------------------------------------------------------
    def validation_sampling(self) -> SamplingConfig:
        """Greedy, to the agent's `max_new_tokens`: how evaluate.py decodes the same agent."""
        return SamplingConfig.greedy_up_to(self.max_new_tokens)

    def rollout_sampling(self) -> SamplingConfig:
        return SamplingConfig(
            max_new_tokens=self.max_new_tokens,
            temperature=self.algo.temperature,
            top_p=self.algo.top_p,
            n=self.algo.group_size if self.algo.name == "grpo" else 1,
            # A seed per step: a resumed run samples exactly what the unbroken run sampled.
            seed=self.seed * 1_000_003 + self.global_step,
        )

    def rollout(self, states: Sequence[Any]) -> tuple[RolloutBatch, list[Reward]]:
        """Sample, score and pack: rows are grouped by state, `len(batch) // len(states)` per state."""
        sampling = self.rollout_sampling()
        was_training = self.policy.training
        self.policy.eval()
        started = time.perf_counter()
        # The HF engine records the frozen trunk's states as it decodes; vLLM's are computed in _score_batch.
        record = {"trunk_depth": self._trunk_depth} if self._trunk_depth and self._policy_samples_itself else {}
        with torch.no_grad():
            outputs = self.engine.generate([self.env.prompt(state) for state in states], sampling, **record)
        self.policy.train(was_training)
        self._stage_seconds["rollout"] = time.perf_counter() - started
        rows = [(state, sample) for state, samples in zip(states, outputs) for sample in samples]
        started = time.perf_counter()
        rewards = self.env.score([state for state, _ in rows], [sample.text for _, sample in rows])
        self._stage_seconds["reward"] = time.perf_counter() - started
        batch = pack_rollouts(
            [sample.prompt_ids for _, sample in rows],
            [sample.response_ids for _, sample in rows],
            [reward.score for reward in rewards],
            self.tokenizer.pad_token_id,
            # The policy sampled for itself: its rollout log-probs are pi_old's (the HF engine's equal a
            # forward pass within 1e-4), so the recomputing forward is skipped. vLLM's are recomputed.
            logprobs=[sample.logprobs for _, sample in rows] if self._policy_samples_itself else None,
            trunk_hidden=[sample.trunk_hidden for _, sample in rows] if record else None,
        )
        return batch.to(self.device), rewards

    # -- forward passes without gradients -----------------------------------------------------------
    @property
    def _group(self) -> int:
        """Rows per state: consecutive rows of a rollout batch share a prompt."""
        return self.algo.group_size if self.algo.name == "grpo" else 1

    @property
    def _sharing(self) -> bool:
        return self.algo.share_prompt and self._group > 1

    def _micro(self, batch: RolloutBatch) -> Iterator[RolloutBatch]:
        # Sharing a prompt needs its whole group in one micro-batch: micro_batch_size rounded to groups.
        size = self._group * max(1, self.algo.micro_batch_size // self._group) if self._sharing else self.algo.micro_batch_size
        return batch.minibatches(size)

    def _logprobs(self, model: nn.Module, micro: RolloutBatch, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs under softmax(logits / T), the rollout's distribution; the entropy keeps its
        graph only when the loss uses it."""
        return response_logprobs(
            model,
            micro,
            with_entropy=with_entropy,
            temperature=self.algo.temperature,
            share_prompt=self._sharing,
            entropy_grad=self.algo.entropy_coef != 0,
            # The trunk's states are the policy's (and its adapters-disabled self's), not a separate reference's.
            trunk_depth=self._trunk_depth if model is self.policy else 0,
        )

    def _micro_checked(self, batch: RolloutBatch) -> Iterator[RolloutBatch]:
        """Micro-batches with a stop check before each: nothing before the first optimiser step of a
        training step changes the weights, so stopping there loses only the step's partial work."""
        for micro in self._micro(batch):
            raise_if_requested()
            yield micro

    @torch.no_grad()
    def _score_batch(self, batch: RolloutBatch) -> None:
        """Fill old log-probs (unless the rollout gave them), reference log-probs (when the KL is on)
        and critic values."""
        self.policy.eval()
        if self._trunk_depth and batch.trunk_hidden is None:
            batch.trunk_hidden = torch.cat(
                [trunk_hidden_states(self.policy, mb, self._trunk_depth, self._sharing) for mb in self._micro_checked(batch)]
            )
        if batch.old_logprobs is None:
            batch.old_logprobs = torch.cat([self._logprobs(self.policy, mb)[0] for mb in self._micro_checked(batch)])
        if self.algo.name == "grpo" and self.algo.kl_coef > 0:
            with self._reference() as reference:
                batch.ref_logprobs = torch.cat([self._logprobs(reference, mb)[0] for mb in self._micro_checked(batch)])
        if self.critic is not None:
            self.critic.eval()
            batch.old_values = torch.cat([response_values(self.critic, mb) for mb in self._micro_checked(batch)])
            self.critic.train()
        self.policy.train()

    @contextlib.contextmanager
    def _reference(self) -> Iterator[nn.Module]:
        if self.reference is not None:
            yield self.reference
        elif hasattr(self.policy, "disable_adapter"):
            with self.policy.disable_adapter():
                yield self.policy
        else:
            raise ValueError("the KL term needs a reference policy: pass reference= or train with LoRA")

    # -- advantages -----------------------------------------------------------------------------------
    def _advantages(self, batch: RolloutBatch, group_ids: Sequence[int]) -> None:
        mask = batch.response_mask.float()
        if self.algo.name == "ppo":
            token_rewards = core.outcome_to_token_rewards(batch.scores, mask)
            batch.advantages, batch.returns = core.compute_gae(
                token_rewards, batch.old_values, mask, gamma=self.algo.gamma, lam=self.algo.lam
            )
        elif self.algo.baseline == "none":  # the environment's reward carries its own baseline
            batch.advantages = core.broadcast_to_tokens(batch.scores.float(), mask)
        else:
            per_sequence = core.group_advantages(
                batch.scores, torch.as_tensor(group_ids), norm_by_std=self.algo.norm_adv_by_std
            )
            batch.advantages = core.broadcast_to_tokens(per_sequence, mask)

    # -- update ---------------------------------------------------------------------------------------
    def _update(self, batch: RolloutBatch) -> dict[str, float]:
        actor_opt, critic_opt = self._optimizers()
        mini_size = self.algo.mini_batch_size or len(batch)
        stats: dict[str, list[float]] = {}

        def note(name: str, value: torch.Tensor | float) -> None:
            stats.setdefault(name, []).append(float(value))

        generator = torch.Generator().manual_seed(self.seed * 7919 + self.global_step)
        # Shuffled by whole groups, so that a micro-batch can share its groups' prompts.
        minibatches = [
            mb for _ in range(self.algo.ppo_epochs) for mb in batch.minibatches(mini_size, generator, group_size=self._group)
        ]
        for position, minibatch in enumerate(minibatches):
            # Until the first optimiser step a stop loses nothing; after it, the step is finished so that
            # a checkpoint never holds weights halfway through one.
            micros = self._micro_checked(minibatch) if position == 0 else self._micro(minibatch)
            for micro in micros:
                weight = len(micro) / len(minibatch)
                mask = micro.response_mask.float()
                logprobs, entropy = self._logprobs(self.policy, micro, with_entropy=True)
                pg_loss, pg_stats = core.policy_loss(
                    logprobs,
                    micro.old_logprobs,
                    micro.advantages,
                    mask,
                    clip_ratio_low=self.algo.clip_ratio_low,
                    clip_ratio_high=self.algo.clip_ratio_high,
                    clip_ratio_c=self.algo.clip_ratio_c,
                    loss_agg_mode=self.algo.loss_agg_mode,
                )
                entropy_loss = core.aggregate_loss(entropy, mask, self.algo.loss_agg_mode)
                loss = pg_loss - self.algo.entropy_coef * entropy_loss
                if micro.ref_logprobs is not None:
                    kl = core.aggregate_loss(
                        core.kl_penalty(logprobs, micro.ref_logprobs, self.algo.kl_kind), mask, self.algo.loss_agg_mode
                    )
                    loss = loss + self.algo.kl_coef * kl
                    note("kl", kl.detach())
                self.manual_backward(loss * weight)
                note("policy_loss", pg_loss.detach())
                note("entropy", entropy_loss.detach())
                for key, value in pg_stats.items():
                    note(key, value)
                if self.algo.ppo_epochs > 1:  # is the clip active in the later epochs? (the first is on-policy)
                    epoch = position * self.algo.ppo_epochs // len(minibatches)
                    note(f"clip_frac/epoch{epoch}", pg_stats["clip_frac"])
                    note(f"approx_kl/epoch{epoch}", pg_stats["approx_kl"])
                if self.critic is not None:
                    values = response_values(self.critic, micro)
                    v_loss, v_clip = core.value_loss(
                        values, micro.old_values, micro.returns, mask, self.algo.value_clip, self.algo.loss_agg_mode
                    )
                    self.manual_backward(v_loss * weight)
                    note("value_loss", v_loss.detach())
                    note("value_clip_frac", v_clip)
            # Lightning counts every LightningOptimizer.step as a global step; one RL step is one
            # rollout batch, so only the batch's last actor step goes through it, the others
            # (earlier mini-batches, the critic) step the wrapped torch optimiser directly.
            last = position == len(minibatches) - 1
            if critic_opt is not None:
                note("critic_grad_norm", self._step(critic_opt.optimizer, self.critic))
            note("grad_norm", self._step(actor_opt if last else actor_opt.optimizer, self.policy))
        return {name: sum(values) / len(values) for name, values in stats.items()}

    def _step(self, optimizer: Any, module: nn.Module) -> float:
        """Clip and step; a gradient whose norm is not finite is dropped and counted instead (verl's
        `_optimizer_step`): one bad batch must not turn the weights into NaN."""
        params = [p for p in module.parameters() if p.requires_grad]
        norm = clip_grad_norm(params, self.algo.grad_clip, sharded=self._sharded)
        if torch.isfinite(norm):
            optimizer.step()
        else:
            self.skipped_steps += 1
        optimizer.zero_grad(set_to_none=True)
        return float(norm)

    # -- the training step ------------------------------------------------------------------------------
    def on_train_start(self) -> None:
        self._stage_seconds = {}
        self._sharded = is_sharded(self)
        # FSDP runs a wrapped model only through its root forward: a sharded policy runs whole.
        self._trunk_depth = frozen_trunk_depth(self.policy) if self.algo.reuse_frozen_trunk and not self._sharded else 0
        data = self.trainer.datamodule if self.trainer is not None else None
        if self.probe_count and self.probe_every_n_steps and hasattr(data, "probe_states"):
            self.probe = data.probe_states(self.probe_count)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        raise_if_requested()

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        raise_if_requested()

    def training_step(self, states: list[Any], batch_idx: int) -> None:
        self._stage_seconds = {}
        batch, rewards = self.rollout(states)
        self.last_rollout = (batch, rewards)  # read by SampleLog and by tests
        group_ids = [index for index, _ in enumerate(states) for _ in range(len(batch) // len(states))]
        started = time.perf_counter()
        self._score_batch(batch)
        self._advantages(batch, group_ids)
        update_stats = self._update(batch)
        self._stage_seconds["update"] = time.perf_counter() - started
        metrics = self._step_metrics(batch, rewards, group_ids, update_stats)
        metrics.update(self.probe_metrics())
        self.step_metrics = dict(metrics)  # the step's row of metrics.csv and of the console line
        self.log("reward/mean", metrics.pop("reward/mean"), on_step=True, prog_bar=True, batch_size=len(batch))
        self.log_dict(metrics, on_step=True, prog_bar=False, batch_size=len(batch))

    def _step_metrics(
        self, batch: RolloutBatch, rewards: Sequence[Reward], group_ids: Sequence[int], update: dict[str, float]
    ) -> dict[str, float]:
        mask = batch.response_mask.float()
        scores = batch.scores
        lengths = mask.sum(dim=1)
        metrics = {f"actor/{name}": value for name, value in update.items() if not name.startswith(("value", "critic"))}
        metrics.update({f"critic/{name}": value for name, value in update.items() if name.startswith(("value", "critic"))})
        metrics["reward/mean"] = float(scores.mean())
        metrics["reward/std"] = float(scores.std()) if len(scores) > 1 else 0.0
        groups: dict[int, list[float]] = {}
        for gid, score in zip(group_ids, scores.tolist()):
            groups.setdefault(gid, []).append(score)
        if self.algo.name == "grpo":
            metrics["reward/zero_std_group_frac"] = sum(max(g) == min(g) for g in groups.values()) / len(groups)
        advantages = core.masked_mean(batch.advantages, mask)
        metrics["advantage/mean"] = float(advantages)
        metrics["advantage/max"] = float(batch.advantages[mask.bool()].max()) if mask.any() else 0.0
        metrics["advantage/min"] = float(batch.advantages[mask.bool()].min()) if mask.any() else 0.0
        # The responses that carry a gradient: a zero advantage teaches nothing, whatever the reward.
        metrics["advantage/nonzero_frac"] = float((batch.advantages.abs().amax(dim=1) > 0).float().mean())
        if self.critic is not None:
            metrics["critic/explained_variance"] = float(core.explained_variance(batch.old_values, batch.returns, mask))
        metrics["actor/lr"] = float(self._optimizers()[0].param_groups[0]["lr"])
        metrics["actor/skipped_steps"] = float(self.skipped_steps)
        metrics["response/length_mean"] = float(lengths.mean())
        metrics["response/length_max"] = float(lengths.max())
        metrics["response/format_error_rate"] = sum(r.format_error is not None for r in rewards) / len(rewards)
        for name, seconds in self._stage_seconds.items():
            metrics[f"time/{name}_s"] = seconds
        generated = float(lengths.sum())
        if self._stage_seconds.get("rollout"):
            metrics["time/rollout_tokens_per_s"] = generated / self._stage_seconds["rollout"]
        metrics.update(self.extra_metrics(rewards))
        return metrics

    def extra_metrics(self, rewards: Sequence[Reward]) -> dict[str, float]:
        """Agent-specific per-step metrics (e.g. the Manager's operation mix)."""
        return {}
