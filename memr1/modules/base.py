"""The RL LightningModule shared by both agents: rollout → reward → advantages → PPO / GRPO update.

The module orchestrates and owns the models; the rollout side (sampling, rewards, overlong shaping,
dynamic sampling, packing) is `memr1.modules.rollout`, the update loop `memr1.rl.update` (which calls
this module's forwards and optimiser steps through its `Learner` hooks), what a step logs
`memr1.modules.step_metrics`, the maths `memr1.rl.core` (pure functions), the tensors
`memr1.rl.batch`, the rewards `memr1.envs`. Subclasses only say how to validate and what extra to log
(`ManagerRLModule`, `AnswerRLModule`).

One training step:
1. rollout: every state's prompt is sampled `group_size` times (GRPO's G; PPO uses 1) by the rollout
   engine — the policy itself through `HFEngine`, or vLLM kept in sync by `VLLMWeightSync`; with LoRA
   on the top layers, the frozen layers below run once per token (`memr1.llm.trunk`), here or in 3;
2. reward: the environment scores each response (never raising on malformed output);
3. old log-probs (unless the policy sampled them itself in fp32, or the update is a single pass, which
   takes them from its own forward), reference log-probs for the KL and critic values for PPO, by
   forward passes without gradients, in micro-batches;
4. advantages: GAE over the critic's values (PPO) or group-normalised scores (GRPO);
5. `ppo_epochs` passes over shuffled mini-batches, each accumulating gradients over micro-batches
   before one optimiser step of the actor (and of the critic for PPO).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

import torch
from lightning.pytorch import LightningModule
from torch import nn

from memr1 import lightning_loop
from memr1.envs.base import Environment, Reward
from memr1.faults import fault_point
from memr1.interrupt import deferred, raise_if_requested
from memr1.llm.engines import GenerationEngine, HFEngine
from memr1.llm.precision import FP32, FrozenLinearCopies, Precision
from memr1.llm.sampling import SamplingConfig
from memr1.llm.sharding import clip_grad_norm, shard
from memr1.llm.trunk import frozen_trunk_depth
from memr1.modules.held_out import HeldOutRewards
from memr1.modules.outputs import StepOutput
from memr1.modules.rollout import Rollouts, StageSeconds
from memr1.modules.step_metrics import rl_step_metrics
from memr1.rl import core
from memr1.rl.algorithms import AlgoConfig
from memr1.rl.batch import RolloutBatch, response_logprobs, response_values, trunk_hidden_states
from memr1.rl.update import single_pass, update_actor_critic
from memr1.seeds import stream_seed


class RLModule(LightningModule):
    """Trains `policy` on `env` with the algorithm `algo.name` names (`memr1.rl.algorithms`): PPO needs
    a `critic` (a value model), the others none.

    `reference` is the frozen policy of the KL term; None with a peft policy means "the same model with
    its adapters disabled" (no second copy), None otherwise means no KL term can be computed.
    `precision`: the dtype the rollout, the scoring forwards and the update compute in (bf16 autocast
    where the machine has bf16 units, `memr1.llm.precision`); log-softmax, losses and optimiser state
    stay fp32.
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
        precision: Precision = FP32,
    ) -> None:
        super().__init__()
        self.algorithm = algo.algorithm
        if self.algorithm.needs_critic and critic is None:
            raise ValueError(f"algo={algo.name}: {self.algorithm.title} needs a critic (a value model)")
        self.policy = policy.train()
        self.critic = critic.train() if critic is not None and self.algorithm.needs_critic else None
        self.reference = reference.eval() if reference is not None else None
        self.tokenizer = tokenizer
        self.env = env
        self.algo = algo
        self.max_new_tokens = max_new_tokens  # the trained agent's decoding cap (answer/manager.max_new_tokens)
        self.seed = seed
        self.precision = precision
        self._frozen_copies = FrozenLinearCopies(precision)
        # None: the policy samples for itself. A vLLM engine is set by train.py and kept in sync.
        self.engine = engine or HFEngine(
            policy, tokenizer, batch_size=max(algo.micro_batch_size, 8), precision=precision, frozen_copies=self._frozen_copies
        )
        # The sampler's log-probs are pi_old's when the policy sampled for itself in fp32 (the HF engine's
        # equal a forward pass within 1e-4). vLLM's, and bf16 decoding's (a token at a time rounds
        # differently from the update's whole-sequence forward), are the update's own: from its forward
        # when it is a single pass (`single_pass`), recomputed by that forward beforehand otherwise.
        self._policy_samples_itself = engine is None
        self._reuse_sampler_logprobs = engine is None and precision.is_fp32
        self.automatic_optimization = False
        self.skipped_steps = 0  # optimiser steps dropped for a non-finite gradient norm
        self._step_at_batch_start = 0  # the global step when the current training batch began
        self.last_step: StepOutput | None = None  # the last training step's output (what its callbacks got)
        self.stage_seconds = StageSeconds()  # of the current step: rollout, reward, update, ...
        self._sharded = False  # FSDP2 shards the models (configure_model, under trainer=fsdp)
        self._trunk_depth = 0  # frozen bottom layers, run once per token (memr1.llm.trunk; set in on_train_start)
        # A fixed probe set of training states, sampled with a fixed seed every N steps: the step reward
        # compares different questions each step, the probe reward the same ones (`train/probe_reward`).
        # Validation also samples each state once as rollouts do (`val/sampled_reward`): the reward the
        # training curve reports, on held-out states, beside the greedy metrics.
        self.probe_count = probe_states
        self.held_out = HeldOutRewards(self.engine, env, seed, probe_every_n_steps, val_sampled_reward)
        self.rollouts = Rollouts(self.engine, env, tokenizer, algo, max_new_tokens, seed, self.stage_seconds)
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

    def configure_model(self) -> None:
        """Under `trainer=fsdp` (Lightning's ModelParallelStrategy), shard the policy, the critic and a
        separate reference with FSDP2 over the data-parallel mesh, one unit per decoder layer
        (`memr1.llm.sharding.shard`); their compute precision stays the module's autocast. Nothing
        under the other strategies."""
        from lightning.pytorch.strategies import ModelParallelStrategy

        if self._sharded or not isinstance(self.trainer.strategy, ModelParallelStrategy):
            return
        mesh = self.device_mesh["data_parallel"]
        for model in (self.policy, self.critic, self.reference):
            if model is not None:
                shard(model, mesh)
        self._sharded = True
        if isinstance(self.engine, HFEngine):  # it decodes with the sharded policy: a collective per forward
            self.engine.lockstep = True

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
        """How this step's rollouts sample (the probe and the sampled validation reward sample alike)."""
        return self.rollouts.sampling(self.global_step)

    def rollout(self, states: Sequence[Any]) -> tuple[RolloutBatch, list[Reward]]:
        """Sample, score and pack (`Rollouts`): rows are grouped by state, `_group` per state. With
        `algo.filter_groups`, groups without reward spread are replaced by groups of extra states."""
        rows = self.rollouts.sample(states, self.global_step, trunk_depth=self._recorded_trunk_depth)
        if self.algorithm.flat_groups_are_zero and self.algo.filter_groups.enable:
            source = self.trainer.datamodule if self._trainer is not None else None
            rows = self.rollouts.keep_groups_with_spread(
                rows, len(states), source, self.global_step, self._min_over_ranks, self._recorded_trunk_depth
            )
        batch = self.rollouts.pack(rows, self.device, self._reuse_sampler_logprobs, bool(self._recorded_trunk_depth))
        return batch, [reward for _, reward in rows]

    def _min_over_ranks(self, value: int) -> int:
        return int(self.all_gather(torch.tensor(value, device=self.device)).min())

    @property
    def _recorded_trunk_depth(self) -> int:
        """The trunk depth the engine records while it samples: the policy's own engine, when it can
        (the HF engine); otherwise 0, and `_score_batch` computes the trunk states in one pass."""
        return self._trunk_depth if self._policy_samples_itself and self.engine.records_trunk else 0

    # -- forward passes without gradients -----------------------------------------------------------
    @property
    def _group(self) -> int:
        """Rows per state: consecutive rows of a rollout batch share a prompt."""
        return self.rollouts.group

    @property
    def _sharing(self) -> bool:
        return self._group > 1 and self.algo.share_prompt

    def _micro(self, batch: RolloutBatch) -> Iterator[RolloutBatch]:
        # Sharing a prompt needs its whole group in one micro-batch: micro_batch_size rounded to groups.
        # The loss is normalised over the whole mini-batch, so the rounding changes no gradient.
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
        """Fill old log-probs (unless the rollout gave them or the update is a `single_pass`), reference
        log-probs (when the KL is on) and critic values."""
        self.policy.eval()
        if self._trunk_depth and batch.trunk_hidden is None:
            batch.trunk_hidden = torch.cat(
                [trunk_hidden_states(self.policy, mb, self._trunk_depth, self._sharing) for mb in self._micro_checked(batch)]
            )
        # kl_in_reward prices pi_old's tokens against the reference before the update, so it needs them.
        if batch.old_logprobs is None and (not single_pass(self.algo, len(batch)) or self.algo.kl_in_reward):
            batch.old_logprobs = torch.cat([self._logprobs(self.policy, mb)[0] for mb in self._micro_checked(batch)])
        if self.algorithm.uses_reference(self.algo):
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

    def _advantages(self, batch: RolloutBatch, group_ids: Sequence[int]) -> dict[str, float]:
        """Fill the advantages (and returns); with `kl_in_reward`, from the scores less the KL, whose
        mean it returns as a metric (the logged rewards stay the environment's)."""
        scores, metrics = batch.scores, {}
        if self.algo.kl_in_reward and batch.ref_logprobs is not None:
            assert batch.old_logprobs is not None  # `_score_batch` filled them
            scores, kl = core.kl_in_reward(
                scores, batch.old_logprobs, batch.ref_logprobs, batch.response_mask.float(), self.algo.kl_coef, self.algo.kl_kind
            )
            metrics["reward/kl_mean"] = float(kl.mean())
        batch.advantages, returns = self.algorithm.advantages(
            scores, batch.response_mask, torch.as_tensor(group_ids), batch.old_values, self.algo, self.sum_over_ranks
        )
        if returns is not None:
            batch.returns = returns
        return metrics

    @contextlib.contextmanager
    def compute_precision(self) -> Iterator[None]:
        """The scoring forwards' and the update's precision: autocast, with the frozen weights held in
        its dtype (`FrozenLinearCopies`: the same numbers without a cast per call). The HF engine's
        rollout computes with the same copies."""
        with self.precision.autocast(self.device):
            if self._sharded:
                yield
            else:
                with self._frozen_copies.swapped(self.policy):
                    yield

    # -- update (memr1.rl.update): the Learner's side ---------------------------------------------------
    def _update(self, batch: RolloutBatch) -> dict[str, float]:
        generator = torch.Generator().manual_seed(stream_seed(self.seed, "minibatch_order", self.global_step))
        return update_actor_critic(
            self, batch, self.algo, generator, self._group, self.critic is not None)

    def policy_logprobs(self, micro: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        logprobs, entropy = self._logprobs(self.policy, micro, with_entropy=True)
        assert entropy is not None  # asked for
        return logprobs, entropy

    def critic_values(self, micro: RolloutBatch) -> torch.Tensor:
        assert self.critic is not None
        return response_values(self.critic, micro)

    def micro_batches(self, minibatch: RolloutBatch, interruptible: bool) -> Iterator[RolloutBatch]:
        return self._micro_checked(minibatch) if interruptible else self._micro(minibatch)

    def denominator(self, response_mask: torch.Tensor) -> core.LossDenominator:
        """The mini-batch's token and sequence counts over every rank (DDP averages the ranks'
        gradients, so each rank's share is scaled by their number); the constant length of
        `seq-mean-token-sum-norm` is the agent's `max_new_tokens`."""
        mask = response_mask.float()
        counts = self.sum_over_ranks(torch.stack([mask.sum(), (mask.sum(dim=-1) > 0).sum().float()]))
        ranks = self.trainer.world_size if self._trainer is not None else 1
        return core.LossDenominator(float(counts[0]), float(counts[1]), ranks, self.max_new_tokens)

    def sum_over_ranks(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over the data-parallel processes (itself in one process)."""
        if self._trainer is None or self.trainer.world_size == 1:
            return tensor
        return self.trainer.strategy.reduce(tensor, reduce_op="sum")

    def accumulate(self, loss: torch.Tensor) -> None:
        self.manual_backward(loss)

    def step_actor(self, last: bool) -> float:
        # Lightning counts every LightningOptimizer.step as a global step; one RL step is one rollout
        # batch (`lightning_loop`), so only the batch's last actor step goes through it, the others
        # (earlier mini-batches) step the wrapped torch optimiser directly.
        actor = self._optimizers()[0]
        return self._step(actor if last else actor.optimizer, self.policy)

    def step_critic(self) -> float:
        critic = self._optimizers()[1]
        return self._step(critic.optimizer, self.critic)

    def _step(self, optimizer: Any, module: nn.Module) -> float:
        """Clip and step; a gradient whose norm is not finite is dropped and counted instead (verl's
        `_optimizer_step`): one bad batch must not turn the weights into NaN. The step is still taken,
        without gradients (AdamW leaves a parameter without one untouched), so that Lightning counts
        it: one global step per batch (`lightning_loop`)."""
        params = [p for p in module.parameters() if p.requires_grad]
        norm = clip_grad_norm(params, self.algo.grad_clip)
        if not torch.isfinite(norm):
            self.skipped_steps += 1
            optimizer.zero_grad(set_to_none=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(norm)

    # -- the training step ------------------------------------------------------------------------------
    def on_train_start(self) -> None:
        self.stage_seconds.clear()
        # FSDP runs a sharded model's units only through its root forward: a sharded policy runs whole.
        self._trunk_depth = frozen_trunk_depth(self.policy) if self.algo.reuse_frozen_trunk and not self._sharded else 0
        data = self.trainer.datamodule if self.trainer is not None else None
        if self.probe_count and self.held_out.probe_every_n_steps and hasattr(data, "probe_states"):
            self.held_out.probe = data.probe_states(self.probe_count)

    def probe_reward(self) -> float:
        """The probe states' mean reward under the current policy (`HeldOutRewards.probe_reward`)."""
        with self._evaluating():
            return self.held_out.probe_reward(self.rollout_sampling())

    def probe_metrics(self) -> dict[str, float]:
        """This step's `train/probe_reward` when it is a probe step, else nothing. It runs after the
        optimiser step: a stop signal waits for the step's end (`deferred`), where the checkpoint holds
        the whole step and the validation due after it."""
        with self._evaluating(), deferred():
            return self.held_out.probe_metrics(self.rollout_sampling(), self.global_step)

    def sample_validation_rewards(self, states: Sequence[Any]) -> None:
        self.held_out.sample_validation_rewards(states, self.rollout_sampling(), self.global_step)

    def log_sampled_validation_reward(self) -> None:
        sampled = self.held_out.take_sampled_validation_reward()
        if sampled is not None:
            self.log("val/sampled_reward", sampled)

    @contextlib.contextmanager
    def _evaluating(self) -> Iterator[None]:
        was_training = self.policy.training
        self.policy.eval()
        try:
            yield
        finally:
            self.policy.train(was_training)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        fault_point("train_step")
        raise_if_requested()
        self._step_at_batch_start = self.global_step

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        lightning_loop.check_one_step(self._step_at_batch_start, self.global_step)

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        fault_point("validation_batch")
        raise_if_requested()

    def training_step(self, states: list[Any], batch_idx: int) -> dict[str, StepOutput]:
        self.stage_seconds.clear()
        self.rollouts.filter_stats = {}
        batch, rewards = self.rollout(states)  # the engine decodes in its own precision
        group_ids = [index for index in range(len(batch) // self._group) for _ in range(self._group)]
        with self.stage_seconds.timing("update"), self.compute_precision():
            self._score_batch(batch)
            reward_stats = self._advantages(batch, group_ids)
            update_stats = self._update(batch)
        metrics = rl_step_metrics(batch, rewards, self._group, update_stats, self.stage_seconds, self.algo.overlong_buffer.enable)
        if self.critic is not None:
            metrics["critic/explained_variance"] = float(core.explained_variance(batch.old_values, batch.returns, batch.response_mask.float()))
        metrics["actor/lr"] = float(self._optimizers()[0].param_groups[0]["lr"])
        metrics["actor/skipped_steps"] = float(self.skipped_steps)
        metrics.update(reward_stats)
        metrics.update(self.extra_metrics(rewards))
        metrics.update(self.rollouts.filter_stats)
        metrics.update(self.probe_metrics())
        self.last_step = StepOutput(dict(metrics), batch, rewards)
        self.log("reward/mean", metrics.pop("reward/mean"), on_step=True, prog_bar=True, batch_size=len(batch))
        self.log_dict(metrics, on_step=True, prog_bar=False, batch_size=len(batch))
        return self.last_step.as_outputs()

    def extra_metrics(self, rewards: Sequence[Reward]) -> dict[str, float]:
        """Agent-specific per-step metrics (e.g. the Manager's operation mix)."""
        return {}
