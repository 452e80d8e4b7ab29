"""Memory-SFT (`algo=sft`): each agent's RL module with its training step replaced by supervised
fine-tuning on teacher targets (`memr1.teachers`).

Everything but the step is the RL module's: the same state data modules and prompts, the same LoRA or
full fine-tuning, the same validation (greedy F1 for the Answer Agent, greedy reward for the Manager),
checkpoints, resume and `policy/{best,last}` exports, so an SFT export is a warm start RL loads with
`answer.ckpt=...` / `manager.ckpt=...` and a checkpoint `evaluate.py ckpt=...` scores.

One step: the teacher's target for each state (cached), prompt + target tokenized as a rollout would be
(the chat template's generation prompt, the target, EOS), the NLL of the target tokens only
(`core.sft_loss`, each target weighed by `target_weights`: the Manager's by the operation it teaches,
`algo.operation_weights`), accumulated over micro-batches, one clipped optimizer step.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from memr1.faults import fault_point
from memr1.interrupt import raise_if_requested
from memr1.llm.engines import encode_prompts
from memr1.modules.answer import AnswerRLModule
from memr1.modules.base import RLModule
from memr1.modules.manager import ManagerRLModule
from memr1.modules.outputs import StepOutput
from memr1.rl import core
from memr1.rl.batch import RolloutBatch, pack_rollouts, response_logprobs
from memr1.teachers import TeacherTrajectories


class SupervisedStep(RLModule):
    """The SFT training step; mixed in before an agent's RL module (`AnswerSFTModule`, ...)."""

    def __init__(self, *args: Any, trajectories: TeacherTrajectories, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trajectories = trajectories

    def sft_batch(self, states: list[Any]) -> tuple[RolloutBatch, int]:
        """Prompt and teacher-target tokens of `states`, and how many targets were cut to
        the agent's `max_new_tokens` (what the agent may generate; a longer target teaches what it cannot say)."""
        prompts = [self.env.prompt(state) for state in states]
        targets = self.trajectories.targets(states, prompts)
        eos = self.tokenizer.eos_token_id
        responses, truncated = [], 0
        for target in targets:
            ids = self.tokenizer(target, add_special_tokens=False).input_ids + [eos]
            truncated += len(ids) > self.max_new_tokens
            responses.append(ids[: self.max_new_tokens])
        batch = pack_rollouts(encode_prompts(self.tokenizer, prompts), responses, [0.0] * len(states), self.tokenizer.pad_token_id)
        batch.weights = torch.tensor(self.target_weights(states, targets), dtype=torch.float32)
        return batch.to(self.device), truncated

    def target_weights(self, states: list[Any], targets: list[str]) -> list[float]:
        """Each target's weight in the loss: 1, unless an agent's module weighs its targets."""
        return [1.0] * len(targets)

    def training_step(self, states: list[Any], batch_idx: int) -> dict[str, StepOutput]:
        started = time.perf_counter()
        batch, truncated = self.sft_batch(states)
        teacher_s = time.perf_counter() - started
        optimizer = self._optimizers()[0]
        started = time.perf_counter()
        # Each micro-batch's loss over the whole batch's tokens (all ranks): the sum is the batch's loss,
        # whatever the micro-batch size.
        denominator = self.denominator(batch.response_mask)
        loss_sum = 0.0
        with self.compute_precision():
            for micro in batch.minibatches(self.algo.micro_batch_size):
                raise_if_requested()  # before the optimizer step nothing has changed: a stop loses nothing
                logprobs, _ = response_logprobs(self.policy, micro, share_prompt=False)
                loss = core.sft_loss(logprobs, micro.response_mask.float(), self.algo.loss_agg_mode, denominator, micro.weights)
                self.manual_backward(loss)
                fault_point("micro_batch")
                loss_sum += float(loss.detach()) / denominator.ranks
        grad_norm = self._step(optimizer, self.policy)
        lengths = batch.response_mask.float().sum(dim=1)
        metrics = {
            "sft/loss": loss_sum,
            "sft/truncated_frac": truncated / len(states),
            "actor/grad_norm": grad_norm,
            "actor/lr": float(optimizer.param_groups[0]["lr"]),
            "actor/skipped_steps": float(self.skipped_steps),
            "response/length_mean": float(lengths.mean()),
            "time/teacher_s": teacher_s,
            "time/update_s": time.perf_counter() - started,
        }
        metrics.update(self.probe_metrics())
        self.last_step = StepOutput(dict(metrics))
        self.log("sft/loss", metrics.pop("sft/loss"), on_step=True, prog_bar=True, batch_size=len(batch))
        self.log_dict(metrics, on_step=True, prog_bar=False, batch_size=len(batch))
        return self.last_step.as_outputs()

    @torch.no_grad()
    def sft_loss_of(self, states: list[Any]) -> float:
        """The SFT loss of `states` under the current policy, without a step (tests, diagnostics)."""
        batch, _ = self.sft_batch(states)
        with self.compute_precision():
            logprobs, _ = response_logprobs(self.policy, batch, share_prompt=False)
        denominator = core.LossDenominator.of(batch.response_mask, norm_length=self.max_new_tokens)
        return float(core.sft_loss(logprobs, batch.response_mask.float(), self.algo.loss_agg_mode, denominator, batch.weights))


class AnswerSFTModule(SupervisedStep, AnswerRLModule):
    """Memory-SFT of the Answer Agent."""


class ManagerSFTModule(SupervisedStep, ManagerRLModule):
    """Memory-SFT of the Memory Manager."""

    def target_weights(self, states: list[Any], targets: list[str]) -> list[float]:
        """`algo.operation_weights` of the operation each target teaches (a NONE or a malformed target
        is a NOOP, as the Manager's parser reads it)."""
        weights = self.algo.operation_weights
        operations = [self.env.manager_agent.parse(target, state.fact, state.candidates).kind for state, target in zip(states, targets, strict=True)]
        return [weights.get(operation.value.lower(), 1.0) for operation in operations]
