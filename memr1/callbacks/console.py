"""One log line per training step and per validation: readable in a terminal, greppable in a file
(`grep "memr1.step"`), and there when the progress bar is not (output redirected)."""

from __future__ import annotations

import logging
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from memr1.modules.outputs import StepOutput

log = logging.getLogger("memr1.step")

# (metric, label, format) in the order they are printed; missing metrics are left out.
STEP_FIELDS = (
    ("sft/loss", "sft-loss", "{:.4f}"),
    ("reward/mean", "reward", "{:.3f}"),
    ("train/probe_reward", "probe", "{:.3f}"),
    ("reward/zero_std_group_frac", "zero-spread", "{:.2f}"),
    ("enum/states_with_spread", "spread", "{:.2f}"),
    # The Manager's operation mix: sampled (GRPO), or the policy's probability (algo=enumerated).
    ("ops/add_frac", "add", "{:.2f}"),
    ("ops/update_frac", "update", "{:.2f}"),
    ("ops/delete_frac", "delete", "{:.2f}"),
    ("ops/noop_frac", "noop", "{:.2f}"),
    ("enum/set_mass", "set-mass", "{:.3f}"),
    ("response/format_error_rate", "format-err", "{:.2f}"),
    ("response/missing_memory_list_frac", "no-memory-list", "{:.2f}"),
    ("response/length_mean", "len", "{:.1f}"),
    ("actor/grad_norm", "grad", "{:.3g}"),
    ("time/teacher_s", "teacher", "{:.1f}s"),
    ("time/rollout_s", "rollout", "{:.1f}s"),
    ("time/reward_s", "reward-time", "{:.1f}s"),
    ("time/update_s", "update", "{:.1f}s"),
    ("time/probe_s", "probe-time", "{:.1f}s"),
    ("actor/skipped_steps", "skipped", "{:.0f}"),
)


class StepConsole(Callback):
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = StepOutput.of(outputs)
        if not trainer.is_global_zero or step is None:
            return
        metrics = step.metrics
        fields = [f"{label} {fmt.format(metrics[key])}" for key, label, fmt in STEP_FIELDS if key in metrics]
        log.info("step %d/%d | %s", trainer.global_step, trainer.max_steps, " | ".join(fields))

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        scores = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        if scores:
            shown = " | ".join(f"{key} {value:.4g}" for key, value in sorted(scores.items()))
            log.info("validation at step %d | %s", trainer.global_step, shown)
