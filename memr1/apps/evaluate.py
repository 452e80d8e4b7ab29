"""Evaluate memory managers and answer agents: `memr1 evaluate [overrides]` or `python evaluate.py
[overrides]` (memr1/conf/evaluate.yaml).

Only Hydra and the config checks are imported up front: a typo or a missing path fails in about a
second, before torch, the models or Milvus load. A run that fails before writing any result leaves
no run directory behind."""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from memr1.preflight import check_evaluate, remove_if_empty_run

log = logging.getLogger("memr1.evaluate")


@hydra.main(config_path="../conf", config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        check_evaluate(cfg)
        from memr1.datasets.registry import category_names
        from memr1.pipeline.evaluation import run_evaluation
        from memr1.pipeline.report import markdown_table
        from memr1.quiet import quiet_third_party

        quiet_third_party()
        result = run_evaluation(cfg, run_dir)
    except BaseException:
        remove_if_empty_run(run_dir, "evaluate.log")
        raise
    log.info("\n%s", markdown_table(result["scores"], category_names(cfg.data.kind)))
    log.info("wrote %s (predictions.jsonl, report.json, report.md, scores.png)", run_dir)


if __name__ == "__main__":
    main()
