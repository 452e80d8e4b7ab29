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
from typing import Any

from omegaconf import DictConfig

from memr1.shipped import is_shipped, shipped_path

# The typed groups of each entry point (dataclasses of memr1.config), checked key by key before anything
# heavy. A preset for both entry points may hold train-only groups (algo): evaluate.py ignores them.
TRAIN_GROUPS = ("algo", "answer", "manager", "banks")
EVALUATE_GROUPS = ("answer", "manager", "banks")


class ConfigError(ValueError):
    """A config value that cannot work on this machine or with the rest of the config."""


def looks_like_path(name: str) -> bool:
    """A local path rather than a hub id or an `embedded:` name (hub ids also contain "/")."""
    return name.startswith(("/", "./", "../", "~"))


def check_dir(key: str, value: str | None, what: str) -> None:
    if value is not None and not Path(value).expanduser().is_dir():
        raise FileNotFoundError(f"{key}={value}: no such directory ({what})")


def check_export(key: str, value: str | None, what: str) -> None:
    """A policy export: a directory, or a shipped agent's `trained:NAME`."""
    if value is not None and is_shipped(value):
        try:
            shipped_path(value)
        except FileNotFoundError as missing:
            raise FileNotFoundError(f"{key}={missing}") from None
        return
    check_dir(key, value, what)


def check_backbone(backbone: DictConfig) -> None:
    name = str(backbone.name_or_path)
    if looks_like_path(name):
        check_dir("backbone.name_or_path", name, "a Hugging Face model directory")


def check_data(data: DictConfig) -> None:
    """`data.kind` names a dataset and `data.path` exists, unless LoCoMo may download it there (the
    default location, or `data.download=true`); a missing file's error says what the dataset's spec
    says to do."""
    from memr1.datasets.registry import dataset_spec

    try:
        spec = dataset_spec(str(data.kind))
    except ValueError as error:
        raise ConfigError(str(error)) from None
    path = data.get("path")
    if data.kind == "locomo" and (path is None or data.get("download", False)):
        return
    if path is None:
        raise ConfigError(f"data.path: data={data.kind} needs the path of your copy of {spec.title}")
    if not Path(path).is_file():
        raise FileNotFoundError(f"data.path={path}: no such file ({spec.title}). {spec.missing_file}")


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
    wants_gpu = trainer.kind == "gpu" or (trainer.kind == "fsdp" and trainer.get("accelerator", "gpu") == "gpu")
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
            f"trainer.devices={devices}: on CPU each device is a process and this machine has {cores} "
            f"core(s); use trainer.devices<={cores} (or trainer=gpu on a GPU machine)"
        )


def check_typed_groups(cfg: DictConfig, groups: tuple[str, ...] = TRAIN_GROUPS) -> None:
    """Each typed group has exactly its dataclass's fields (an unknown or misspelt key is named, with
    the nearest field) and values the dataclass accepts; `hydra.utils.instantiate` then builds it."""
    import dataclasses
    import difflib

    from hydra.utils import get_class

    for group in groups:
        node = cfg.get(group)
        if node is None:
            continue
        target = node.get("_target_")
        if target is None:
            raise ConfigError(f"{group}._target_: missing; the {group} group names its dataclass (memr1.config)")
        schema = get_class(target)
        fields = [field.name for field in dataclasses.fields(schema)]
        for key in node:
            if key != "_target_" and key not in fields:
                near = difflib.get_close_matches(str(key), fields, n=1)
                raise ConfigError(
                    f"{group}.{key}: no such key in {group} ({schema.__name__})"
                    + (f"; did you mean {group}.{near[0]}?" if near else f"; the keys are {', '.join(fields)}")
                )
        missing = [name for name in fields if name not in node]
        if missing:
            raise ConfigError(f"{group}: the keys {missing} of {schema.__name__} are not set (memr1/conf/{group}/*.yaml sets them all)")
        instantiate_group(node)


def instantiate_group(node: DictConfig) -> Any:
    """The typed group's dataclass, built from its `_target_`; its own ValueError becomes a ConfigError."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    try:
        return instantiate(OmegaConf.create(OmegaConf.to_container(node, resolve=True)))
    except Exception as error:  # instantiate wraps the dataclass's own ValueError
        cause = error.__cause__ or error
        raise ConfigError(str(cause)) from None


def command_line_overrides() -> list[str]:
    """The `key=value` overrides of this run's command line (Hydra's), empty outside a Hydra app."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def check_no_ignored_overrides(algorithm: Any, overrides: list[str]) -> None:
    """Refuse an `algo.KEY=...` on the command line that the chosen algorithm does not read (its
    `ignores`), naming the key and why: a setting asked for must never silently do nothing. A preset
    may set them (one preset serves several algorithms); only what the user typed is refused."""
    for override in overrides:
        field = algo_field(override)
        if field in algorithm.ignores:
            raise ConfigError(f"{override}: algo={algorithm.name} does not use algo.{field}: {algorithm.ignores[field]}")


def algo_field(override: str) -> str | None:
    """The `algo` field a `key=value` override sets ("algo.group_size=4" -> "group_size"), else None."""
    key = override.lstrip("+~").split("=", 1)[0]
    return key.removeprefix("algo.").split(".", 1)[0] if key.startswith("algo.") else None


def check_train(cfg: DictConfig) -> None:
    """What `train.py` needs before anything heavy starts."""
    check_typed_groups(cfg)
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
    trained = "answer" if cfg.model.agent == "answer" else "manager"
    check_export("answer.ckpt", cfg.answer.ckpt, "the warm start" if trained == "answer" else "the frozen Answer Agent's policy export")
    check_export("manager.ckpt", cfg.manager.ckpt, "the warm start" if trained == "manager" else "the Manager export that writes the banks")
    algorithm = instantiate_group(cfg.algo).algorithm
    check_no_ignored_overrides(algorithm, command_line_overrides())
    if cfg.model.get("credit") == "counterfactual" and algorithm.trains_on_rollouts and algorithm.flat_groups_are_zero:
        raise ConfigError(
            f"model.credit=counterfactual with algo={cfg.algo.name}: the NOOP reward is the same for every sample of a "
            f"state, so {algorithm.title}'s baseline cancels it; use algo=reinforce (the reward is the advantage)"
        )
    if cfg.algo.name == "sft" and cfg.teacher.kind == "endpoint" and not (cfg.teacher.get("url") and cfg.teacher.get("model")):
        raise ValueError("teacher=endpoint needs teacher.url=http://HOST:PORT/v1 and teacher.model=NAME")
    if cfg.algo.name == "sft" and cfg.algo.operation_weights and cfg.model.agent != "manager":
        raise ConfigError("algo.operation_weights weighs the Memory Manager's targets by their operation; use it with model=manager")
    if cfg.algo.name == "sft" and cfg.teacher.kind == "search" and cfg.model.agent != "manager":
        raise ConfigError("teacher=search searches the Memory Manager's operations; use it with model=manager")
    if algorithm.enumerates_actions and (cfg.model.agent != "manager" or cfg.teacher.kind != "search"):
        raise ConfigError(
            f"algo={cfg.algo.name} weighs every operation of the Memory Manager by the score teacher=search gives it; "
            f"use it with model=manager teacher=search (got model.agent={cfg.model.agent}, teacher.kind={cfg.teacher.kind})"
        )


def check_evaluate(cfg: DictConfig) -> None:
    """What `evaluate.py` needs before anything heavy starts."""
    check_typed_groups(cfg, EVALUATE_GROUPS)
    check_data(cfg.data)
    check_backbone(cfg.backbone)
    check_export("answer.ckpt" if cfg.get("ckpt") is None else "ckpt", cfg.answer.ckpt, "a policy export: runs/train/.../policy/best or last")
    check_export("manager.ckpt", cfg.manager.ckpt, "a trained Memory Manager's policy export")
    check_export("memory.ckpt", cfg.memory.get("ckpt"), "the fact extractor's policy export")


def remove_if_empty_run(run_dir: Path, log_name: str) -> None:
    """Remove `run_dir` when it holds only what Hydra writes itself (`.hydra`, `log_name`): a run that
    failed before writing any result leaves no directory behind."""
    if run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= {".hydra", log_name}:
        logging.shutdown()  # Hydra's file handler holds the log open
        shutil.rmtree(run_dir, ignore_errors=True)
