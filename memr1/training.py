"""`python train.py`: the Lightning Trainer around the module `memr1.factories.build_module` makes,
with its loggers, callbacks, resume and stop handling; `run_training` is what `train.py` calls."""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningDataModule, Trainer, seed_everything
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, RichProgressBar
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from memr1.callbacks import (
    AtomicCheckpointIO,
    ExportPolicy,
    MetricsCSV,
    ResumableRun,
    SampleLog,
    StepConsole,
    TrainingCurves,
    VLLMWeightSync,
    latest_checkpoint,
)
from memr1.factories import build_module, monitored_metric, trained_agent
from memr1.interrupt import StopRequested
from memr1.memory import BankLockedError
from memr1.modules.base import RLModule
from memr1.provenance import code_version, describe

log = logging.getLogger(__name__)


def trainer_kwargs(trainer_cfg: DictConfig) -> dict[str, Any]:
    """Accelerator, devices, strategy and Lightning's precision (always 32-true) for `trainer.kind` on
    this machine. `fsdp` is FSDP2 through Lightning's `ModelParallelStrategy` (the module shards its
    models in `configure_model`), on GPUs or, with `trainer.accelerator=cpu`, on CPU processes (gloo)."""
    kind, devices = trainer_cfg.kind, trainer_cfg.devices
    has_gpu = torch.cuda.is_available()
    if kind == "auto":
        kind = "fsdp" if has_gpu and devices > 1 else ("gpu" if has_gpu else "cpu")
    accelerator = trainer_cfg.accelerator if kind == "fsdp" and "accelerator" in trainer_cfg else ("cpu" if kind == "cpu" else "gpu")
    if accelerator not in ("cpu", "gpu"):
        raise ValueError(f"trainer.accelerator: {accelerator!r}; expected cpu or gpu")
    if accelerator == "gpu" and not has_gpu:
        hint = " or trainer.accelerator=cpu (FSDP2 over CPU processes)" if kind == "fsdp" else ""
        raise ValueError(
            f"trainer={trainer_cfg.kind}: no CUDA GPU on this machine. On CPU use trainer=cpu "
            f"(trainer.devices={devices} runs {devices} DDP processes on the CPU){hint} or trainer=auto."
        )
    strategy: Any
    if kind == "fsdp":
        from lightning.pytorch.strategies import ModelParallelStrategy

        # Data parallel over every process; no tensor parallelism. The checkpoint is gathered into one
        # file on rank 0 (what resume, evaluate.py and the atomic checkpoint IO read), not a shard per rank.
        strategy = ModelParallelStrategy(
            data_parallel_size=devices * trainer_cfg.num_nodes, tensor_parallel_size=1, save_distributed_checkpoint=False
        )
    elif kind == "cpu":
        strategy = "ddp_find_unused_parameters_true" if devices > 1 else "auto"
    elif kind == "gpu":
        strategy = "ddp" if devices > 1 else "auto"
    else:
        raise ValueError(f"trainer.kind: unknown kind {trainer_cfg.kind!r}; expected auto, cpu, gpu or fsdp")
    # Lightning keeps the weights in fp32 on GPUs as on CPU: they are the masters an RL step's small
    # updates land on (a bf16 weight keeps 8 significant bits: an Adam step of actor_lr 1e-6 leaves a
    # weight of 0.01 unchanged), and the compute runs in bf16 under memr1's own autocast (`precision`).
    return {"accelerator": accelerator, "devices": devices, "strategy": strategy, "precision": "32-true", "num_nodes": trainer_cfg.num_nodes}


def wandb_run_id(run_dir: Path) -> str:
    """The W&B run id of `run_dir`, made on its first run and kept in `wandb_run_id.txt`, so that a
    resumed run logs into the same W&B run."""
    path = run_dir / "wandb_run_id.txt"
    if not path.exists():
        path.write_text(uuid.uuid4().hex[:12] + "\n")
    return path.read_text().strip()


def build_loggers(cfg: DictConfig, run_dir: Path) -> list[Logger]:
    """W&B (offline by default) when `logging.wandb`; `metrics.csv` is written by `MetricsCSV`."""
    if not cfg.logging.wandb:
        return []
    from lightning.pytorch.loggers import WandbLogger

    os.environ.setdefault("WANDB_MODE", cfg.logging.wandb_mode)
    return [
        WandbLogger(
            project=cfg.logging.project,
            save_dir=str(run_dir),
            id=wandb_run_id(run_dir),
            resume="allow",
            config=OmegaConf.to_container(cfg, resolve=True),
        )
    ]


def build_callbacks(cfg: DictConfig, run_dir: Path) -> list[Callback]:
    monitor = monitored_metric(cfg.model.agent)
    # Order matters at the end of a step: the logs are written before ResumableRun may stop the run,
    # and Lightning runs ModelCheckpoint last, after every other callback's state is up to date.
    metrics = MetricsCSV(run_dir / "csv" / "metrics.csv")
    callbacks: list[Callback] = [
        metrics,
        *([TrainingCurves(run_dir, metrics)] if cfg.logging.plots else []),  # drawn from metrics' rows once written
        SampleLog(run_dir, every_n_steps=cfg.logging.samples_every_n_steps),
        StepConsole(),
        ResumableRun(run_dir / "checkpoints"),
        ModelCheckpoint(
            dirpath=run_dir / "checkpoints",
            every_n_train_steps=cfg.checkpoint.every_n_train_steps,
            save_top_k=1,  # the newest; `ckpt_path=last` finds it (`latest_checkpoint`)
        ),
        ExportPolicy(run_dir / "policy", monitor=monitor, init=trained_agent(cfg).ckpt),
        VLLMWeightSync(),
    ]
    if sys.stderr.isatty():  # redirected output gets StepConsole's lines, not a bar's control codes
        callbacks.append(RichProgressBar())
    return callbacks


def cpu_threads(cfg: DictConfig) -> int:
    """torch's CPU threads in each process of this run: `threads`, else the machine's cores shared among
    the run's processes on it (`trainer.devices` of them when they train on the CPU). More threads than
    cores make OpenMP's waiting threads spin against each other's work: two 2-thread runs on 2 cores
    each took 1.7x as long as one alone (tests/test_distributed_training.py's runs are such a pair)."""
    if cfg.threads:
        return cfg.threads
    settings = trainer_kwargs(cfg.trainer)
    processes_here = settings["devices"] if settings["accelerator"] == "cpu" else 1
    return max(1, (os.cpu_count() or 1) // processes_here)


def build_trainer(cfg: DictConfig, run_dir: Path) -> Trainer:
    loader = cfg.data_loader
    loggers = build_loggers(cfg, run_dir)
    return Trainer(
        **trainer_kwargs(cfg.trainer),
        max_steps=loader.max_steps,
        val_check_interval=loader.val_check_interval,
        check_val_every_n_epoch=None,
        limit_val_batches=loader.limit_val_batches,
        num_sanity_val_steps=0,
        log_every_n_steps=cfg.logging.log_every_n_steps,
        logger=loggers or False,
        callbacks=build_callbacks(cfg, run_dir),
        plugins=[AtomicCheckpointIO()],
        enable_progress_bar=sys.stderr.isatty(),
        default_root_dir=str(run_dir),
        enable_model_summary=False,
    )


def resume_checkpoint(ckpt_path: str | None, run_dir: Path) -> str | None:
    """`ckpt_path` as a file to resume from: "last" is the newest complete checkpoint of
    `run_dir/checkpoints`; a FileNotFoundError names the directory or file when there is none."""
    if ckpt_path is None:
        return None
    if ckpt_path == "last":
        found = latest_checkpoint(run_dir / "checkpoints")
        if found is None:
            raise FileNotFoundError(
                f"ckpt_path=last: no checkpoint in {run_dir / 'checkpoints'}. Pass the run_dir of the run to "
                "resume (run_dir=runs/train/...), or drop ckpt_path to start a new run."
            )
        return str(found)
    if not Path(ckpt_path).is_file():
        raise FileNotFoundError(f"ckpt_path={ckpt_path}: no such checkpoint file")
    return ckpt_path


def run_training(cfg: DictConfig, run_dir: Path, data: LightningDataModule) -> RLModule:
    """Train on `data` (the entry point's data module: `RLStatesDataModule.from_config(cfg)`)."""
    seed_everything(cfg.seed, workers=True)
    threads = cpu_threads(cfg)
    torch.set_num_threads(threads)
    log.info("torch uses %d CPU thread(s) of %d core(s) (threads=%s)", threads, os.cpu_count(), cfg.threads)
    log.info("memr1 code: %s", describe(code_version()))  # each resume logs its own: a run may span commits
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = resume_checkpoint(cfg.ckpt_path, run_dir)
    if ckpt_path:
        log.info("resuming from %s", ckpt_path)
    module = build_module(cfg)
    trainer = build_trainer(cfg, run_dir)
    try:
        fit(trainer, module, data, ckpt_path=ckpt_path, val_before_train=cfg.data_loader.val_before_train)
    except BankLockedError as error:
        # Typically a second training run on the same data: it needs banks of its own.
        raise BankLockedError(
            error.path, hint=f"give this run its own banks with banks.dir=DIR (now {cfg.banks.dir}; ADD-all banks rebuild in seconds)"
        ) from error
    except (StopRequested, SIGTERMException) as stop:
        signum = stop.signum if isinstance(stop, StopRequested) else signal.SIGTERM  # Lightning's exception is SIGTERM's
        name = signal.Signals(signum).name
        if trainer.global_step == 0 and ckpt_path is None:
            log.warning("stopped by %s before the first step completed; run the same command again to start over", name)
        else:
            log.warning(
                "stopped by %s after step %d; resume with: python train.py run_dir=%s ckpt_path=last",
                name, trainer.global_step, run_dir,
            )
        raise SystemExit(128 + signum) from None
    return module


def fit(
    trainer: Trainer, module: RLModule, data: LightningDataModule, ckpt_path: str | None, val_before_train: bool
) -> None:
    """`trainer.fit`, after validating the untrained policy when `val_before_train` (verl's option of
    the same name) and the run is not a resume: that score is step 0 of the curves and the bar
    `policy/best` has to clear, so a run that never beats its base exports the base as best."""
    if val_before_train and ckpt_path is None:
        trainer.validate(module, datamodule=data)
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
