"""Keep a vLLM rollout engine's weights equal to the policy's after every optimiser step."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from memr1.llm.sharding import full_state_dict


class VLLMWeightSync(Callback):
    """After each training step, push the policy into `pl_module.engine` when it is a vLLM engine.

    A LoRA policy ships only its adapter (saved to a scratch dir and hot-loaded); a full policy ships
    its parameters by name. With the HF engine the policy generates itself, so nothing is copied.
    """

    def __init__(self, scratch_dir: str | None = None) -> None:
        self.scratch_dir = Path(scratch_dir or tempfile.mkdtemp(prefix="memr1-lora-"))

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        engine = pl_module.engine
        if not hasattr(engine, "load_weights"):
            return
        policy = pl_module.policy
        # Under FSDP each rank holds a shard: gather the full tensors (every rank takes part).
        state = full_state_dict(policy)
        if hasattr(policy, "peft_config"):
            adapter_dir = self.scratch_dir / f"step-{trainer.global_step}"
            policy.save_pretrained(adapter_dir, state_dict=state)
            engine.load_lora(adapter_dir)
        else:
            engine.load_weights(state.items())
