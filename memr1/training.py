"""`python train.py`: build the policy, environment, data and Lightning Trainer from a Hydra config.

Each builder is a small function of the config, so a notebook or a sweep agent can assemble a run
piece by piece; `run_training` is what `train.py` calls.
"""

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

from memr1.agents.answer import AnswerAgent
from memr1.agents.manager import ManagerAgent
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
from memr1.interrupt import StopRequested
from memr1.envs.answer import AnswerEnv
from memr1.envs.manager import ManagerEnv
from memr1.llm.engines import GenerationEngine, build_engine
from memr1.llm.loading import load_policy
from memr1.llm.lora import apply_lora
from memr1.llm.sampling import SamplingConfig
from memr1.llm.value import ValueModel
from memr1.memory import BankLockedError
from memr1.modules.answer import AnswerRLModule
from memr1.modules.base import AlgoConfig, RLModule
from memr1.modules.manager import ManagerRLModule
from memr1.modules.sft import AnswerSFTModule, ManagerSFTModule
from memr1.pipeline.evaluation import make_judge
from memr1.teachers import EndpointTeacher, EvidenceAnswerTeacher, RuleManagerTeacher, Teacher, TeacherTrajectories

log = logging.getLogger(__name__)


def algo_config(cfg: DictConfig) -> AlgoConfig:
    return AlgoConfig(**OmegaConf.to_container(cfg.algo, resolve=True))


def trainer_kwargs(trainer_cfg: DictConfig) -> dict[str, Any]:
    """Accelerator, devices, strategy and precision for `trainer.kind` on this machine."""
    kind, devices = trainer_cfg.kind, trainer_cfg.devices
    has_gpu = torch.cuda.is_available()
    if kind == "auto":
        kind = "fsdp" if has_gpu and devices > 1 else ("gpu" if has_gpu else "cpu")
    if kind in ("gpu", "fsdp") and not has_gpu:
        raise ValueError(
            f"trainer={trainer_cfg.kind}: no CUDA GPU on this machine. On CPU use trainer=cpu "
            f"(trainer.devices={devices} runs {devices} DDP processes on the CPU) or trainer=auto."
        )
    precision = trainer_cfg.precision or ("bf16-true" if kind in ("gpu", "fsdp") else "32-true")
    if kind == "cpu":
        strategy: Any = "ddp_find_unused_parameters_true" if devices > 1 else "auto"
        return {"accelerator": "cpu", "devices": devices, "strategy": strategy, "precision": precision, "num_nodes": trainer_cfg.num_nodes}
    if kind == "gpu":
        strategy = "ddp" if devices > 1 else "auto"
    elif kind == "fsdp":
        from lightning.pytorch.strategies import FSDPStrategy

        # Shard each decoder layer: the unit that keeps all-gathers large and memory peaks small.
        strategy = FSDPStrategy(auto_wrap_policy=_decoder_layer_classes(), sharding_strategy="FULL_SHARD")
    else:
        raise ValueError(f"trainer.kind: unknown kind {trainer_cfg.kind!r}; expected auto, cpu, gpu or fsdp")
    return {"accelerator": "gpu", "devices": devices, "strategy": strategy, "precision": precision, "num_nodes": trainer_cfg.num_nodes}


def _decoder_layer_classes() -> set[type]:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    return {LlamaDecoderLayer, Qwen2DecoderLayer}


def lora_from_config(
    module: torch.nn.Module, lora: DictConfig, modules_to_save: tuple[str, ...] | list[str] = ()
) -> torch.nn.Module:
    """`apply_lora` with the `lora` config group's settings (the policy and the critic share them)."""
    return apply_lora(
        module,
        lora.r,
        lora.alpha,
        lora.dropout,
        list(lora.target_modules),
        modules_to_save=modules_to_save,
        top_layers=lora.top_layers,
    )


def build_policy(cfg: DictConfig) -> tuple[torch.nn.Module, Any]:
    """The policy to train: the backbone, or the warm start `model.init` (an SFT export) on top of it,
    with fresh LoRA adapters when `lora.enabled` (adapters off, it is the warm start: the KL reference)."""
    model, tokenizer = load_policy(cfg.backbone.name_or_path, dtype=cfg.backbone.dtype, adapter=cfg.model.get("init"))
    if cfg.lora.enabled:
        model = lora_from_config(model, cfg.lora)
    model.train()
    return model, tokenizer


def build_critic(cfg: DictConfig) -> torch.nn.Module:
    """A value head on its own copy of the backbone (the paper's PPO critic)."""
    backbone, _ = load_policy(cfg.backbone.name_or_path, dtype=cfg.backbone.dtype)
    critic: torch.nn.Module = ValueModel(backbone)
    if cfg.lora.enabled:
        critic = lora_from_config(critic, cfg.lora, modules_to_save=["value_head"])
    return critic.train()


def build_env(cfg: DictConfig) -> AnswerEnv | ManagerEnv:
    model = cfg.model
    answer_agent = AnswerAgent(distill=model.get("distill", True), max_answer_words=model.get("max_answer_words", 6))
    judge = make_judge(cfg) if model.reward == "judge" else None
    if model.agent == "answer":
        return AnswerEnv(answer_agent, reward=model.reward, format_penalty=model.format_penalty, judge=judge)
    if model.agent == "manager":
        frozen, tokenizer = load_policy(cfg.backbone.name_or_path, dtype=cfg.backbone.dtype, adapter=model.answer_ckpt)
        for param in frozen.parameters():
            param.requires_grad_(False)
        answer_engine = build_engine("hf", model=frozen, tokenizer=tokenizer, batch_size=8)
        return ManagerEnv(
            ManagerAgent(),
            answer_agent,
            answer_engine,
            SamplingConfig(max_new_tokens=model.answer_max_new_tokens, temperature=0.0),
            k_per_speaker=model.k_per_speaker,
            reward=model.reward,
            format_penalty=model.format_penalty,
            judge=judge,
        )
    raise ValueError(f"model.agent: unknown agent {model.agent!r}; expected answer or manager")


def build_rollout_engine(cfg: DictConfig, policy: torch.nn.Module, tokenizer: Any) -> GenerationEngine | None:
    """None: the module's HF engine over the policy itself. vLLM: a separate engine, synced each step."""
    if cfg.engine == "hf":
        return None
    if cfg.engine == "vllm":
        return build_engine("vllm", name_or_path=cfg.backbone.name_or_path, tokenizer=tokenizer, enable_lora=cfg.lora.enabled)
    raise ValueError(f"engine: unknown engine {cfg.engine!r}; expected hf or vllm")


def build_module(cfg: DictConfig) -> RLModule:
    algo = algo_config(cfg)
    policy, tokenizer = build_policy(cfg)
    critic = build_critic(cfg) if algo.name == "ppo" else None
    reference = None
    if algo.name == "grpo" and algo.kl_coef > 0 and not cfg.lora.enabled:
        # The KL anchors the policy to where RL started: the warm start when there is one.
        reference, _ = load_policy(cfg.backbone.name_or_path, dtype=cfg.backbone.dtype, adapter=cfg.model.get("init"))
        for param in reference.parameters():
            param.requires_grad_(False)
    common = dict(
        critic=critic,
        reference=reference,
        engine=build_rollout_engine(cfg, policy, tokenizer),
        seed=cfg.seed,
        probe_states=cfg.data_loader.probe_states,
        probe_every_n_steps=cfg.data_loader.probe_every_n_steps,
        val_sampled_reward=cfg.data_loader.val_sampled_reward,
    )
    answer = cfg.model.agent == "answer"
    if algo.name == "sft":
        module_class: type[RLModule] = AnswerSFTModule if answer else ManagerSFTModule
        common["trajectories"] = build_trajectories(cfg)
    else:
        module_class = AnswerRLModule if answer else ManagerRLModule
    return module_class(policy, tokenizer, build_env(cfg), algo, **common)


def build_trajectories(cfg: DictConfig) -> TeacherTrajectories:
    """The `teacher` config group: the dataset's own teacher for the agent, or an endpoint's model."""
    spec = cfg.teacher
    teacher: Teacher
    if spec.kind == "dataset":
        if cfg.model.agent == "answer":
            teacher = EvidenceAnswerTeacher(distill=cfg.model.distill)
        else:
            teacher = RuleManagerTeacher(duplicate_score=spec.duplicate_score)
    elif spec.kind == "endpoint":
        teacher = EndpointTeacher(spec.url, spec.model, max_tokens=spec.max_tokens, api_key_env=spec.api_key_env)
    else:
        raise ValueError(f"teacher.kind: unknown teacher {spec.kind!r}; expected dataset or endpoint")
    return TeacherTrajectories(teacher, spec.cache)


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
    monitor = "val/f1" if cfg.model.agent == "answer" else "val/reward"
    # Order matters at the end of a step: the logs are written before ResumableRun may stop the run,
    # and Lightning runs ModelCheckpoint last, after every other callback's state is up to date.
    callbacks: list[Callback] = [
        MetricsCSV(run_dir / "csv" / "metrics.csv"),
        TrainingCurves(run_dir),
        SampleLog(run_dir, every_n_steps=cfg.logging.samples_every_n_steps),
        StepConsole(),
        ResumableRun(run_dir / "checkpoints"),
        ModelCheckpoint(
            dirpath=run_dir / "checkpoints",
            every_n_train_steps=cfg.checkpoint.every_n_train_steps,
            save_top_k=1,  # the newest; `ckpt_path=last` finds it (`latest_checkpoint`)
        ),
        ExportPolicy(run_dir / "policy", monitor=monitor, init=cfg.model.get("init")),
        VLLMWeightSync(),
    ]
    if sys.stderr.isatty():  # redirected output gets StepConsole's lines, not a bar's control codes
        callbacks.append(RichProgressBar())
    return callbacks


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


def run_training(cfg: DictConfig, run_dir: Path) -> RLModule:
    from data_modules.rl_states import RLStatesDataModule

    seed_everything(cfg.seed, workers=True)
    threads = cfg.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    log.info("torch uses %d CPU thread(s) of %d core(s) (threads=%s)", threads, os.cpu_count(), cfg.threads)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = resume_checkpoint(cfg.ckpt_path, run_dir)
    if ckpt_path:
        log.info("resuming from %s", ckpt_path)
    trainer = build_trainer(cfg, run_dir)
    module = build_module(cfg)
    data = RLStatesDataModule.from_config(cfg)
    try:
        fit(trainer, module, data, ckpt_path=ckpt_path, val_before_train=cfg.data_loader.val_before_train)
    except BankLockedError as error:
        # Typically a second training run on the same data: it needs banks of its own.
        raise BankLockedError(
            error.path, hint=f"give this run its own banks with banks.dir=DIR (now {cfg.banks.dir}; ADD-all banks rebuild in seconds)"
        ) from error
    except (StopRequested, SIGTERMException) as stop:
        signum = getattr(stop, "signum", signal.SIGTERM)
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
