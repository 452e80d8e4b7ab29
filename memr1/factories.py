"""The one place where configs become objects: engines, agents, memory policies, judges, teachers,
the policy, critic and environment of a training run, and the RL module over them.

Each factory is a small function of a composed config (`conf/train.yaml` or `conf/evaluate.yaml`), so
a notebook or a sweep agent can assemble a run piece by piece. The typed groups (`algo`, `answer`,
`manager`, `banks`) are instantiated from their `_target_` (`memr1.config`, `memr1.rl.algorithms`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from memr1.agents.answer import AnswerAgent
from memr1.agents.manager import ManagerAgent
from memr1.banks.policies import AddAllPolicy, MemoryPolicy, ModelPolicy
from memr1.banks.recipe import BankRecipe, LazyPolicy
from memr1.config import AnswerConfig, BanksConfig, ManagerConfig
from memr1.envs.answer import AnswerEnv
from memr1.envs.manager import ManagerEnv
from memr1.llm.engines import GenerationEngine, HFEngine
from memr1.llm.loading import load_policy
from memr1.llm.precision import FP32, Precision, choose_precision
from memr1.llm.lora import apply_lora
from memr1.llm.sampling import SamplingConfig
from memr1.llm.value import ValueModel
from memr1.metrics.judge import EngineJudge, Judge, OpenAICompatibleJudge
from memr1.modules.answer import AnswerRLModule
from memr1.modules.base import RLModule
from memr1.modules.manager import ManagerRLModule
from memr1.modules.enumerated import ManagerEnumeratedModule
from memr1.modules.sft import AnswerSFTModule, ManagerSFTModule
from memr1.rl.algorithms import AlgoConfig
from memr1.search_teacher import OraclePolicy, SearchManagerTeacher
from memr1.teachers import EndpointTeacher, EvidenceAnswerTeacher, RuleManagerTeacher, Teacher, TeacherTrajectories
from memr1.types import Conversation

log = logging.getLogger(__name__)


# ---- the typed groups ------------------------------------------------------------------------------


def algo_config(cfg: DictConfig) -> AlgoConfig:
    return instantiate(cfg.algo)


def answer_config(cfg: DictConfig) -> AnswerConfig:
    """The Answer Agent of both entry points: `train.py` (its rollouts, validation and states) and
    `evaluate.py` read this one object."""
    return instantiate(cfg.answer)


def manager_config(cfg: DictConfig) -> ManagerConfig:
    return instantiate(cfg.manager)


def banks_config(cfg: DictConfig) -> BanksConfig:
    return instantiate(cfg.banks)


def answer_agent(config: AnswerConfig) -> AnswerAgent:
    return AnswerAgent(distill=config.distill, max_answer_words=config.max_answer_words)


# ---- engines and models ----------------------------------------------------------------------------


def build_engine(
    kind: Literal["hf", "vllm"],
    *,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    name_or_path: str | None = None,
    batch_size: int = 8,
    precision: Precision = FP32,
    prompt_lookup: int = 0,
    reuse_prefix: bool = False,
    **vllm_options: Any,
) -> GenerationEngine:
    """A generation engine of `kind`.

    "hf": samples from `model` itself (the policy being trained: no weight sync needed); needs `model`
        and `tokenizer`, uses `batch_size`, `precision` (`run_precision`), and for a lone greedy request
        `prompt_lookup` (draft tokens per forward; 0: off) and `reuse_prefix` (see `HFEngine`).
    "vllm": a vLLM engine serving `name_or_path` (hub id, directory or `embedded:` name), kept in sync by
        `load_weights` / `load_lora`; `tokenizer` is optional, `vllm_options` go to `VLLMEngine`.
    """
    if kind == "hf":
        if model is None or tokenizer is None:
            raise ValueError("build_engine('hf'): needs model= and tokenizer=")
        if vllm_options:
            raise TypeError(f"build_engine('hf'): unexpected options {sorted(vllm_options)} (they are vLLM's)")
        return HFEngine(model, tokenizer, batch_size=batch_size, precision=precision, prompt_lookup=prompt_lookup, reuse_prefix=reuse_prefix)
    if kind == "vllm":
        if name_or_path is None:
            raise ValueError("build_engine('vllm'): needs name_or_path=")
        from memr1.llm.vllm_engine import VLLMEngine

        return VLLMEngine(name_or_path, tokenizer=tokenizer, **vllm_options)
    raise ValueError(f"build_engine: unknown kind {kind!r}; expected 'hf' or 'vllm'")


def run_precision(cfg: DictConfig) -> Precision:
    """The `precision` key (auto | fp32 | bf16) resolved on the device this run computes on: a GPU
    unless there is none or `trainer=cpu` says otherwise."""
    on_cpu = not torch.cuda.is_available() or cfg.get("trainer", {}).get("kind") == "cpu"
    return choose_precision(cfg.precision, "cpu" if on_cpu else "cuda")


def frozen_policy(name_or_path: str, dtype: str, ckpt: str | None) -> tuple[PreTrainedModel, Any]:
    """The backbone with the policy export `ckpt` applied, frozen: an agent that is not trained."""
    model, tokenizer = load_policy(name_or_path, dtype=dtype, ckpt=ckpt)
    for param in model.parameters():
        param.requires_grad_(False)
    return model, tokenizer


class ModelCache:
    """Loads each (backbone, checkpoint) once, so a prompted Manager and the Answer Agent share it."""

    def __init__(self, backbone: DictConfig, engine_kind: str, batch_size: int, precision: Precision = FP32) -> None:
        self.backbone = backbone
        self.engine_kind = engine_kind
        self.batch_size = batch_size
        self.precision = precision
        self._engines: dict[str | None, GenerationEngine] = {}

    def engine(self, ckpt: str | None) -> GenerationEngine:
        if ckpt not in self._engines:
            started = time.perf_counter()
            if self.engine_kind == "vllm":
                from memr1.llm.loading import merged_checkpoint

                # vLLM serves a whole model: a LoRA export (and its warm starts) is merged into one first.
                path = merged_checkpoint(self.backbone.name_or_path, ckpt, dtype=self.backbone.dtype) if ckpt else None
                self._engines[ckpt] = build_engine("vllm", name_or_path=str(path or self.backbone.name_or_path))
            else:
                model, tokenizer = frozen_policy(self.backbone.name_or_path, self.backbone.dtype, ckpt)
                self._engines[ckpt] = build_engine("hf", model=model, tokenizer=tokenizer, batch_size=self.batch_size, precision=self.precision)
            log.info("loaded %s%s in %.1fs", self.backbone.name_or_path, f" + {ckpt}" if ckpt else "", time.perf_counter() - started)
        return self._engines[ckpt]


def memory_policy(recipe: BankRecipe, cfg: DictConfig, engine: Callable[[str | None], GenerationEngine], conversations: Sequence[Conversation]) -> MemoryPolicy:
    """Who decides the operations of `recipe`'s banks: ADD-all; the Memory Manager, greedy, on the
    engine that `engine(manager.ckpt)` returns; or the oracle's search (`OraclePolicy`) over
    `conversations`' own questions, answered on `engine(answer.ckpt)`. The models load only when a bank
    still has items to take."""
    manager = manager_config(cfg)
    if recipe.policy == "oracle":
        return LazyPolicy(lambda: oracle_policy(cfg, engine, conversations), manager.num_candidates)
    if not recipe.uses_manager:
        return AddAllPolicy()
    return LazyPolicy(
        lambda: ModelPolicy(engine(manager.ckpt), ManagerAgent(manager.add_text), SamplingConfig.greedy_up_to(manager.max_new_tokens), manager.num_candidates),
        manager.num_candidates,
    )


def oracle_policy(cfg: DictConfig, engine: Callable[[str | None], GenerationEngine], conversations: Sequence[Conversation]) -> OraclePolicy:
    """`banks=oracle`: the search teacher over the Answer Agent that answers the banks (`answer.*`),
    scoring with `banks.oracle`'s reward and deciding by its rule."""
    answer, oracle = answer_config(cfg), banks_config(cfg).oracle
    env = ManagerEnv(
        ManagerAgent("fact"), answer_agent(answer), engine(answer.ckpt), SamplingConfig.greedy_up_to(answer.max_new_tokens),
        k_per_speaker=answer.k_per_speaker, reward=oracle.reward, credit="outcome",
    )
    teacher = SearchManagerTeacher(
        env, env.variant(ManagerAgent("model"), credit="outcome"), answerer=str(answer.ckpt),
        min_margin=oracle.min_margin, drop_factor=oracle.drop_factor,
    )
    return OraclePolicy(teacher, conversations, manager_config(cfg).num_candidates)


def make_judge(cfg: DictConfig) -> Judge | None:
    """The configured judge (`judge` group), or None for judge=none."""
    kind = cfg.judge.kind
    if kind == "none":
        return None
    if kind == "hf":
        judge_models = ModelCache(OmegaConf.create({"name_or_path": cfg.judge.model, "dtype": cfg.backbone.dtype}), "hf", cfg.judge.batch_size)
        return EngineJudge(judge_models.engine(None), cfg.judge.max_new_tokens, cfg.judge.batch_size)
    if kind == "openai_compatible":
        return OpenAICompatibleJudge(cfg.judge.url, cfg.judge.model, cfg.judge.api_key_env, cfg.judge.timeout_s)
    raise ValueError(f"judge.kind: unknown kind {kind!r}; expected none, hf or openai_compatible")


# ---- a training run's parts ------------------------------------------------------------------------


def trained_agent(cfg: DictConfig) -> AnswerConfig | ManagerConfig:
    """The config of the agent `train.py` trains (`model.agent`): its `ckpt` is the warm start."""
    if cfg.model.agent == "answer":
        return answer_config(cfg)
    if cfg.model.agent == "manager":
        return manager_config(cfg)
    raise ValueError(f"model.agent: unknown agent {cfg.model.agent!r}; expected answer or manager")


def lora_from_config(module: torch.nn.Module, lora: DictConfig, modules_to_save: tuple[str, ...] | list[str] = ()) -> torch.nn.Module:
    """`apply_lora` with the `lora` config group's settings (the policy and the critic share them)."""
    return apply_lora(
        module, lora.r, lora.alpha, lora.dropout, list(lora.target_modules), modules_to_save=modules_to_save, top_layers=lora.top_layers
    )


def build_policy(cfg: DictConfig) -> tuple[torch.nn.Module, Any]:
    """The policy to train: the backbone, or the trained agent's `ckpt` (a warm start, e.g. an SFT
    export) on it, with fresh LoRA adapters when `lora.enabled` (adapters off, it is the warm start:
    the KL reference)."""
    model, tokenizer = load_policy(cfg.backbone.name_or_path, dtype=cfg.backbone.dtype, ckpt=trained_agent(cfg).ckpt)
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
    """The trained agent's environment. Training the Manager, the Answer Agent is frozen at `answer.ckpt`."""
    model, answer = cfg.model, answer_config(cfg)
    judge = make_judge(cfg) if model.reward == "judge" else None
    if model.agent == "answer":
        return AnswerEnv(answer_agent(answer), reward=model.reward, format_penalty=model.format_penalty, judge=judge)
    if model.agent == "manager":
        frozen, tokenizer = frozen_policy(cfg.backbone.name_or_path, cfg.backbone.dtype, answer.ckpt)
        return ManagerEnv(
            ManagerAgent(manager_config(cfg).add_text),
            answer_agent(answer),
            build_engine("hf", model=frozen, tokenizer=tokenizer, batch_size=answer.batch_size, precision=run_precision(cfg)),
            SamplingConfig.greedy_up_to(answer.max_new_tokens),
            k_per_speaker=answer.k_per_speaker,
            reward=model.reward,
            format_penalty=model.format_penalty,
            judge=judge,
            credit=model.credit,
        )
    raise ValueError(f"model.agent: unknown agent {model.agent!r}; expected answer or manager")


def build_rollout_engine(cfg: DictConfig, tokenizer: Any) -> GenerationEngine | None:
    """None: the module's HF engine over the policy itself. vLLM: a separate engine, synced each step."""
    if cfg.engine == "hf":
        return None
    if cfg.engine == "vllm":
        # The run's precision: the sampler's distribution is the one the update's log-probs score.
        dtype = "float32" if run_precision(cfg).is_fp32 else "bfloat16"
        return build_engine(
            "vllm", name_or_path=cfg.backbone.name_or_path, tokenizer=tokenizer, enable_lora=cfg.lora.enabled, dtype=dtype
        )
    raise ValueError(f"engine: unknown engine {cfg.engine!r}; expected hf or vllm")


def build_trajectories(cfg: DictConfig, env: AnswerEnv | ManagerEnv) -> TeacherTrajectories:
    """The `teacher` config group: the dataset's own teacher for the agent, the Manager's environment
    searched (`env`, the run's own), or an endpoint's model."""
    spec = cfg.teacher
    teacher: Teacher
    if spec.kind == "dataset":
        if cfg.model.agent == "answer":
            teacher = EvidenceAnswerTeacher(distill=answer_config(cfg).distill)
        else:
            teacher = RuleManagerTeacher(duplicate_score=spec.duplicate_score)
    elif spec.kind == "search":
        if not isinstance(env, ManagerEnv):
            raise ValueError("teacher=search: it searches the Manager's operations; use model=manager")
        teacher = SearchManagerTeacher(
            env.variant(ManagerAgent("fact"), credit="outcome"), env.variant(ManagerAgent("model"), credit="outcome"),
            answerer=str(answer_config(cfg).ckpt), min_margin=spec.min_margin, drop_factor=spec.drop_factor,
            questions=cfg.model.questions,
        )
    elif spec.kind == "endpoint":
        teacher = EndpointTeacher(spec.url, spec.model, max_tokens=spec.max_tokens, api_key_env=spec.api_key_env)
    else:
        raise ValueError(f"teacher.kind: unknown teacher {spec.kind!r}; expected dataset, search or endpoint")
    return TeacherTrajectories(teacher, spec.cache)


def build_module(cfg: DictConfig) -> RLModule:
    """The Lightning module of `model.agent` and `algo.name` (RL, or SFT on the teacher's targets)."""
    algo = algo_config(cfg)
    algorithm = algo.algorithm
    agent = trained_agent(cfg)
    policy, tokenizer = build_policy(cfg)
    critic = build_critic(cfg) if algorithm.needs_critic else None
    reference = None
    if algorithm.uses_reference(algo) and not cfg.lora.enabled:
        # The KL anchors the policy to where RL started: the warm start when there is one.
        reference, _ = frozen_policy(cfg.backbone.name_or_path, cfg.backbone.dtype, agent.ckpt)
    common: dict[str, Any] = dict(
        critic=critic,
        reference=reference,
        engine=build_rollout_engine(cfg, tokenizer),
        seed=cfg.seed,
        probe_states=cfg.data_loader.probe_states,
        probe_every_n_steps=cfg.data_loader.probe_every_n_steps,
        val_sampled_reward=cfg.data_loader.val_sampled_reward,
        max_new_tokens=agent.max_new_tokens,
        precision=run_precision(cfg),
    )
    answer = cfg.model.agent == "answer"
    env = build_env(cfg)
    if algorithm.enumerates_actions:
        module_class: type[RLModule] = ManagerEnumeratedModule
        common["trajectories"] = build_trajectories(cfg, env)
    elif not algorithm.trains_on_rollouts:
        module_class = AnswerSFTModule if answer else ManagerSFTModule
        common["trajectories"] = build_trajectories(cfg, env)
    else:
        module_class = AnswerRLModule if answer else ManagerRLModule
    return module_class(policy, tokenizer, env, algo, **common)


def monitored_metric(agent: str) -> str:
    """The validation metric that chooses `policy/best`: F1 for the Answer Agent, reward for the Manager."""
    return "val/f1" if agent == "answer" else "val/reward"
