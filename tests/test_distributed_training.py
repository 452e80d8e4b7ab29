"""`train.py` with two real processes (gloo) on CPU: DDP (`trainer=cpu trainer.devices=2`) and FSDP2
(`trainer=fsdp trainer.accelerator=cpu trainer.devices=2`, every model sharded per decoder layer). They
share one Milvus Lite bank file (one builds, the other waits, both read it in-process), clip, log and
export once; the export reloads in plain peft / transformers; an FSDP run resumes from its gathered
checkpoint."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

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


def metric_steps(run_dir: Path) -> list[int]:
    """The steps of metrics.csv's training rows (validation rows have no gradient norm)."""
    with (run_dir / "csv" / "metrics.csv").open() as file:
        return [int(row["step"]) for row in csv.DictReader(file) if row.get("actor/grad_norm")]


def test_fsdp2_on_two_cpu_processes_trains_as_one_process_exports_once_and_resumes(tmp_path: Path):
    """Memory-SFT (no sampling: the same batches however many processes) with LoRA: two FSDP2 processes
    for 2 steps, resumed for a third from the gathered checkpoint, end with the parameters of one
    process's unbroken 3 steps; the export reloads in plain peft."""
    backbone = save_tiny_checkpoint(tmp_path / "tiny", load_tokenizer("embedded:smollm2-135m-instruct"))
    common = (
        "data_loader.states_per_step=2", "data_loader.val_check_interval=2", "lora.enabled=true",
        "lora.target_modules=[q_proj,v_proj]",
        "precision=fp32",  # bf16 rounds differently for 1 and 2 rows a process; Adam turns that into lr-sized steps
    )
    fsdp = ("trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2")
    log = tmp_path / "log.txt"
    sharded, alone = tmp_path / "fsdp", tmp_path / "alone"
    for run_dir, extra in [
        (sharded, (*fsdp, "data_loader.max_steps=2")),
        (sharded, (*fsdp, "data_loader.max_steps=3", "ckpt_path=last")),
        (alone, ("trainer=cpu", "data_loader.max_steps=3")),
    ]:
        command = train_command(backbone, run_dir, tmp_path / "banks", *common, *extra, algo="sft")
        assert run(command, log, timeout=600) == 0, log.read_text()[-3000:]
    assert "Restored all states from the checkpoint" in log.read_text()
    assert metric_steps(sharded) == metric_steps(alone) == [1, 2, 3]  # rank 0 logs each step once, the resumed step 3 once
    checkpoint = torch.load(next((sharded / "checkpoints").glob("*step=3.ckpt")), weights_only=False)
    weights = checkpoint["state_dict"]  # one file, gathered: plain tensors under the model's own names
    assert weights and all(type(t) is torch.Tensor and k.startswith("policy.") for k, t in weights.items())

    exported = {name: load_file(run_dir / "policy" / "last" / "adapter_model.safetensors") for name, run_dir in [("fsdp", sharded), ("alone", alone)]}
    assert exported["fsdp"].keys() == exported["alone"].keys() and exported["fsdp"]
    for key, value in exported["alone"].items():
        assert (exported["fsdp"][key] - value).abs().max() <= 1e-5, key
    model, _ = load_policy(backbone, ckpt=sharded / "policy" / "last")  # plain peft on one process
    base, _ = load_policy(backbone)
    ids = torch.tensor([[3, 8, 1, 4]])
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, base(ids).logits)  # trained adapters, gathered whole
