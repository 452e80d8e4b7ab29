"""Checks of a composed config that need no model, no Milvus and no torch: every path it names and
what the machine and the batch allow, run by `train.py` and `evaluate.py` before their heavy imports,
so a mistake fails in a second with the key that holds it.

Each check raises `ConfigError` (a `ValueError`) or `FileNotFoundError` naming the config key.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from omegaconf import DictConfig

# Values of model.bank_manager that name a builder rather than a checkpoint directory.
BANK_BUILDERS = ("add_all", "prompted")


class ConfigError(ValueError):
    """A config value that cannot work on this machine or with the rest of the config."""


def looks_like_path(name: str) -> bool:
    """A local path rather than a hub id or an `embedded:` name (hub ids also contain "/")."""
    return name.startswith(("/", "./", "../", "~"))


def check_dir(key: str, value: str | None, what: str) -> None:
    if value is not None and not Path(value).expanduser().is_dir():
        raise FileNotFoundError(f"{key}={value}: no such directory ({what})")


def check_backbone(backbone: DictConfig) -> None:
    name = str(backbone.name_or_path)
    if looks_like_path(name):
        check_dir("backbone.name_or_path", name, "a Hugging Face model directory")


def check_data(data: DictConfig) -> None:
    """`data.path` exists, unless LoCoMo may download it there (the default location, or
    `data.download=true`)."""
    path = data.get("path")
    if data.kind == "locomo":
        if path is None or data.get("download", False) or Path(path).is_file():
            return
        raise FileNotFoundError(
            f"data.path={path}: no such file. Point data.path at your copy of locomo10.json, leave it unset "
            "for ../shared/data/locomo10.json or data/locomo10.json, or add data.download=true to download "
            "it to that path."
        )
    if path is None:
        raise ConfigError(f"data.path: data={data.kind} needs the path of your copy of the dataset")
    if not Path(path).exists():
        raise FileNotFoundError(f"data.path={path}: no such file (data={data.kind})")


def check_devices(trainer: DictConfig, states_per_step: int) -> None:
    """`trainer.devices` against the machine (CPU cores or GPUs) and against the states of a step,
    which every process needs a share of."""
    devices, nodes = int(trainer.devices), int(trainer.get("num_nodes", 1))
    if devices < 1:
        raise ConfigError(f"trainer.devices={devices}: must be >= 1")
    if devices * nodes > states_per_step:
        raise ConfigError(
            f"trainer.devices={devices} x trainer.num_nodes={nodes} processes > data_loader.states_per_step="
            f"{states_per_step}: every process trains on a share of each step's states. Raise "
            f"data_loader.states_per_step to at least {devices * nodes} or lower trainer.devices."
        )
    wants_gpu = trainer.kind in ("gpu", "fsdp")
    if wants_gpu or (trainer.kind == "auto" and devices > 1):
        import torch  # the one check that needs it, and only where GPUs are asked for or may be used

        gpus = torch.cuda.device_count()
        if gpus or wants_gpu:
            if devices > gpus:
                raise ConfigError(
                    f"trainer.devices={devices} with trainer={trainer.kind}: this machine has {gpus} CUDA GPU(s)"
                    + ("; on CPU use trainer=cpu or trainer=auto" if not gpus else "")
                )
            return
    cores = os.cpu_count() or 1
    if devices > cores:
        raise ConfigError(
            f"trainer.devices={devices}: on CPU each device is a DDP process and this machine has {cores} "
            f"core(s); use trainer.devices<={cores} (or trainer=gpu on a GPU machine)"
        )


def check_train(cfg: DictConfig) -> None:
    """What `train.py` needs before anything heavy starts."""
    check_data(cfg.data)
    check_backbone(cfg.backbone)
    check_devices(cfg.trainer, int(cfg.data_loader.states_per_step))
    run_dir = Path(cfg.run_dir)
    if cfg.ckpt_path == "last":
        checkpoints = run_dir / "checkpoints"
        if not checkpoints.is_dir() or not any(p.is_file() for p in checkpoints.glob("*.ckpt")):
            raise FileNotFoundError(
                f"ckpt_path=last: no checkpoint in {checkpoints}. Resuming needs the run_dir of the run that "
                "wrote it (run_dir=runs/train/...); the default run_dir is a new timestamped directory."
            )
    elif cfg.ckpt_path is not None and not Path(cfg.ckpt_path).is_file():
        raise FileNotFoundError(f"ckpt_path={cfg.ckpt_path}: no such checkpoint file")
    model = cfg.model
    check_dir("model.answer_ckpt", model.get("answer_ckpt"), "the frozen Answer Agent's policy export")
    check_dir("model.init", model.get("init"), "the warm start: an SFT run's policy/best or policy/last")
    if cfg.algo.name == "sft" and cfg.teacher.kind == "endpoint" and not (cfg.teacher.get("url") and cfg.teacher.get("model")):
        raise ValueError("teacher=endpoint needs teacher.url=http://HOST:PORT/v1 and teacher.model=NAME")
    bank_manager = model.get("bank_manager")
    if bank_manager is not None and str(bank_manager) not in BANK_BUILDERS:
        check_dir("model.bank_manager", str(bank_manager), f"a trained Manager's policy export, or one of {BANK_BUILDERS}")


def check_evaluate(cfg: DictConfig) -> None:
    """What `evaluate.py` needs before anything heavy starts."""
    check_data(cfg.data)
    check_backbone(cfg.backbone)
    check_dir("ckpt", cfg.get("ckpt"), "a policy export: runs/train/.../policy/best or last")
    check_dir("manager.ckpt", cfg.manager.get("ckpt"), "a trained Memory Manager's policy export")
    check_dir("memory.ckpt", cfg.memory.get("ckpt"), "the fact extractor's policy export")


def remove_if_empty_run(run_dir: Path, log_name: str) -> None:
    """Remove `run_dir` when it holds only what Hydra writes itself (`.hydra`, `log_name`): a run that
    failed before writing any result leaves no directory behind."""
    if run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= {".hydra", log_name}:
        logging.shutdown()  # Hydra's file handler holds the log open
        shutil.rmtree(run_dir, ignore_errors=True)
