"""Train the Memory Manager or the Answer Agent: `memr1 train [overrides]` or `python train.py
[overrides]` (memr1/conf/train.yaml). Example: `memr1 train model=manager algo=ppo trainer.devices=4`.

Only Hydra and the config checks are imported up front: a typo or a missing path fails in about a
second, before torch, the models or Milvus load, and leaves no run directory behind."""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from memr1.preflight import check_train, remove_if_empty_run


@hydra.main(config_path="../conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_dir = Path(cfg.run_dir)
    try:
        check_train(cfg)
    except BaseException:
        remove_if_empty_run(run_dir, "train.log")
        raise
    from memr1.data_modules.rl_states import RLStatesDataModule
    from memr1.quiet import quiet_third_party
    from memr1.training import run_training

    quiet_third_party()  # after the imports: Lightning installs its console handlers on import
    run_training(cfg, run_dir, RLStatesDataModule.from_config(cfg))


if __name__ == "__main__":
    main()
