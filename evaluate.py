"""Evaluate memory managers and answer agents: `python evaluate.py [overrides]` (conf/evaluate.yaml)."""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from memr1.pipeline.evaluation import run_evaluation
from memr1.pipeline.report import markdown_table
from memr1.datasets.registry import category_names

log = logging.getLogger("memr1.evaluate")


@hydra.main(config_path="conf", config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    result = run_evaluation(cfg, run_dir)
    log.info("\n%s", markdown_table(result["scores"], category_names(cfg.data.kind)))
    log.info("wrote %s (predictions.jsonl, report.json, report.md, scores.png)", run_dir)


if __name__ == "__main__":
    main()
