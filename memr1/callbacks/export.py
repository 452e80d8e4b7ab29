"""Export the trained policy as a Hugging Face / peft directory that `evaluate.py ckpt=...` loads."""

from __future__ import annotations

import logging
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer

from memr1.llm.loading import write_warm_start
from memr1.llm.sharding import full_state_dict, is_sharded

log = logging.getLogger(__name__)


class ExportPolicy(Callback):
    """Writes `dirpath/last` at the end of training and `dirpath/best` whenever `monitor` improves.

    A LoRA policy is saved as its adapter (small; `load_policy(ckpt=...)` merges it into the base),
    a full policy as a complete checkpoint with its tokenizer. `init`: the warm start the policy was
    trained from; a LoRA export names it (`warm_start.json`), so loading it applies both in order.
    """

    def __init__(self, dirpath: str | Path, monitor: str | None = None, mode: str = "max", init: str | None = None) -> None:
        self.dirpath = Path(dirpath)
        self.init = init
        self.monitor = monitor
        self.sign = 1.0 if mode == "max" else -1.0
        self.best: float | None = None

    def export(self, trainer: Trainer, pl_module: LightningModule, name: str) -> Path:
        """Every rank calls it: under FSDP the policy's parameters are gathered (a collective), then
        rank 0 writes them, once."""
        target = self.dirpath / name
        state = full_state_dict(pl_module.policy) if is_sharded(pl_module.policy) else None
        if not trainer.is_global_zero:
            return target
        pl_module.policy.save_pretrained(target, state_dict=state)
        pl_module.tokenizer.save_pretrained(target)
        if self.init is not None and (target / "adapter_config.json").is_file():
            write_warm_start(target, self.init)
        log.info("exported the policy to %s", target)
        return target

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.monitor is None or trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.monitor)
        improved = value is not None and (self.best is None or self.sign * float(value) > self.sign * self.best)
        # Rank 0 decides, so every rank joins the export's gather or none does.
        improved, best = trainer.strategy.broadcast((improved, float(value) if improved else self.best), src=0)
        if improved:
            self.best = best
            self.export(trainer, pl_module, "best")

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.export(trainer, pl_module, "last")

    def state_dict(self) -> dict:
        return {"best": self.best}

    def load_state_dict(self, state_dict: dict) -> None:
        self.best = state_dict.get("best")
