"""`train.py trainer=cpu trainer.devices=2`: two real DDP processes (gloo) train a tiny model, share one
Milvus Lite bank file (one builds, the other waits, both read it in-process), clip, log and export
once; the export reloads."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from memr1.llm.loading import load_policy, load_tokenizer
from memr1.llm.testing import save_tiny_checkpoint
from processes import run, train_command

pytestmark = pytest.mark.slow


def test_two_ddp_processes_on_cpu_train_log_and_export_once(tmp_path: Path):
    backbone = save_tiny_checkpoint(tmp_path / "tiny", load_tokenizer("embedded:smollm2-135m-instruct"))
    run_dir = tmp_path / "run"
    command = train_command(
        backbone, run_dir, tmp_path / "banks", "trainer=cpu", "trainer.devices=2", "data_loader.states_per_step=2",
        "data_loader.max_steps=2", "data_loader.val_check_interval=2", "lora.enabled=true", "lora.target_modules=[q_proj,v_proj]",
    )
    log = tmp_path / "log.txt"
    assert run(command, log, timeout=600) == 0, log.read_text()[-3000:]
    with (run_dir / "csv" / "metrics.csv").open() as file:
        steps = [int(row["step"]) for row in csv.DictReader(file) if row.get("reward/mean")]
    assert steps == [1, 2]  # rank 0 logs each step once
    banks = sorted(p.name for p in (tmp_path / "banks").glob("*.db"))
    assert len(banks) == 1 and banks[0].startswith("locomo-observation-add_all-")  # one file for both ranks
    exported = run_dir / "policy" / "last"
    assert (exported / "adapter_config.json").is_file()
    model, _ = load_policy(backbone, ckpt=exported)
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[3, 8, 1, 4]])).logits).all()
