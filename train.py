"""Train the Memory Manager or the Answer Agent with PPO / GRPO: `python train.py [overrides]`
(conf/train.yaml). Example: `python train.py model=manager algo=ppo trainer.devices=4`.

Only Hydra and the config checks are imported up front: a typo or a missing path fails in about a
second, before torch, the models or Milvus load, and leaves no run directory behind."""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from memr1.preflight import check_train, remove_if_empty_run


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_dir = Path(cfg.run_dir)
    try:
        check_train(cfg)
    except BaseException:
        remove_if_empty_run(run_dir, "train.log")
        raise
    # The entry point hands the data module to the library: memr1 never imports data_modules.
    from data_modules.rl_states import RLStatesDataModule
    from memr1.quiet import quiet_third_party
    from memr1.training import run_training

    quiet_third_party()  # after the imports: Lightning installs its console handlers on import
    run_training(cfg, run_dir, RLStatesDataModule.from_config(cfg))


if __name__ == "__main__":
    main()
