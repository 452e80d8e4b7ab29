"""Train the Memory Manager or the Answer Agent with PPO / GRPO: `python train.py [overrides]`
(conf/train.yaml). Example: `python train.py model=manager algo=ppo trainer.devices=4`."""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from memr1.training import run_training


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_training(cfg, Path(cfg.run_dir))


if __name__ == "__main__":
    main()
