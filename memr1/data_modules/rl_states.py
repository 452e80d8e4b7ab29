"""The RL states of one agent over LoCoMo as a LightningDataModule: banks opened or built by their
recipe (`memr1.banks.recipe`), states (`memr1.states.datasets`) and the step-indexed, resumable order
(`memr1.states.order`) wired to a Trainer."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Literal

import numpy as np
from lightning.pytorch import LightningDataModule
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from memr1.data_modules.locomo import LoCoMoDataModule
from memr1.banks.build import memory_items
from memr1 import lightning_loop
from memr1.banks.policies import AddAllPolicy, MemoryPolicy
from memr1.banks.recipe import BankRecipe, bank_recipe, open_or_build_banks
from memr1.datasets.registry import dataset_spec
from memr1.embed import Embedder
from memr1.factories import ModelCache, answer_config, banks_config, manager_config, memory_policy, run_precision
from memr1.memory import MemoryBank
from memr1.progress import progress_bar
from memr1.states.datasets import AnswerStates, ManagerStates, collate_states
from memr1.states.order import IndexedStates, StepBatches, check_weights, step_indices

AGENTS = ("manager", "answer")


class RLStatesDataModule(LightningDataModule):
    """The RL states of one agent over LoCoMo: train = split "train" (conv-26), validation = split
    "validation" (conv-30), in the same kind of states: the Manager is validated by its greedy reward on
    conv-30's manager states, the Answer Agent by greedy F1 / BLEU-1 / EM on conv-30's answer states.

    locomo: a `LoCoMoDataModule`, or its keyword arguments.
    agent: "manager" (`ManagerStates`) or "answer" (`AnswerStates`).
    recipe: the banks both splits' states read (`BankRecipe`), opened or built on first `setup` under
        `banks_dir` (or at the server `banks_uri`) and shared with every run of the same recipe. Manager
        states are cut from ADD-all banks of the dataset's facts (the Manager's teacher).
    bank_policy: who builds them: ADD-all, or a Memory Manager (`memr1.factories.memory_policy`, which
        loads its model only if a bank still needs building).
    window, num_candidates, questions: of `ManagerStates`; k_per_speaker: memories per speaker for answer states.
    batch_size: states per training step (all ranks together); val_batch_size: states per validation
        batch and rank.
    seed: of the training order (`step_indices`).
    max_steps: the last batch step (exclusive) when no trainer with `max_steps` is attached.

    `train_dataloader()` yields the batches of steps [start, stop): start from the attached trainer's
    global step (a resumed run continues with the batch the interrupted one was about to take), stop
    from `trainer.max_steps`; by the uniform passes of `memr1.states.order`, or by weight once
    `weigh_training_states` was called (the enumerated Manager's `algo.taught_sampling_alpha`). Banks
    are opened in `setup` and closed in `teardown`; once built they serve reads from this process, so
    DDP ranks and other runs share one Lite file (each waits up to `lock_wait_s` while another builds or
    loads it). Under DDP each rank takes its share of every batch.
    """

    def __init__(
        self,
        locomo: LoCoMoDataModule | Mapping[str, Any],
        agent: Literal["manager", "answer"],
        recipe: BankRecipe,
        banks_dir: str | Path,
        banks_uri: str | None = None,
        bank_policy: MemoryPolicy | None = None,
        window: int = 50,
        num_candidates: int = 5,
        questions: str = "fact",
        k_per_speaker: int = 30,
        batch_size: int = 8,
        val_batch_size: int = 8,
        seed: int = 0,
        max_steps: int | None = None,
        lock_wait_s: float = 1800.0,
        embedder: Embedder | None = None,
    ) -> None:
        super().__init__()
        if agent not in AGENTS:
            raise ValueError(f"RLStatesDataModule.agent: {agent!r} is not one of {AGENTS}")
        if recipe.policy == "oracle":
            raise ValueError("banks=oracle: an upper bound that reads the questions it is scored on, for evaluate.py; train on banks=add_all or banks=manager")
        if agent == "manager" and (recipe.uses_manager or recipe.source != "observation"):
            raise ValueError(
                f"banks: Manager states are cut from ADD-all banks of the dataset's facts (banks=add_all "
                f"memory=facts); got banks.policy={recipe.policy}, memory.source={recipe.source}"
            )
        if recipe.uses_manager and bank_policy is None:
            raise ValueError("RLStatesDataModule.bank_policy: the recipe's banks are written by the Manager; pass its policy")
        if recipe.source == "llm":
            raise ValueError("memory=llm_facts: RL states are built from the dataset's facts or raw turns")
        sizes = {"batch_size": batch_size, "val_batch_size": val_batch_size}
        for name, value in sizes.items():
            if value < 1:
                raise ValueError(f"RLStatesDataModule.{name}: must be >= 1, got {value}")
        if seed < 0:
            raise ValueError(f"RLStatesDataModule.seed: must be >= 0, got {seed}")
        if max_steps is not None and max_steps < 0:
            raise ValueError(f"RLStatesDataModule.max_steps: must be >= 0, got {max_steps}")
        self.locomo = locomo if isinstance(locomo, LoCoMoDataModule) else LoCoMoDataModule(**dict(locomo))
        self.agent = agent
        self.recipe = recipe
        self.banks_dir = Path(banks_dir)
        self.banks_uri = banks_uri
        self.bank_policy = bank_policy
        self.window = window
        self.num_candidates = num_candidates
        self.questions = questions
        self.k_per_speaker = k_per_speaker
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size
        self.seed = seed
        self.max_steps = max_steps
        self.lock_wait_s = lock_wait_s
        self.embedder = embedder
        self.banks: dict[str, MemoryBank] = {}
        self._open = ExitStack()
        self.train_states: ManagerStates | AnswerStates | None = None
        self.val_states: ManagerStates | AnswerStates | None = None
        self.train_weights: np.ndarray | None = None  # each training state's draw probability; None: uniform passes

    @classmethod
    def from_config(cls, cfg: DictConfig) -> RLStatesDataModule:
        """The data module of `train.py`'s config: `data` (LoCoMo), the bank recipe (`banks`, `memory`,
        and `manager` when it writes the banks), `model` (agent, `window`, `questions`), `answer.k_per_speaker`,
        `manager.num_candidates`, `data_loader` (states_per_step, val_batch_size, max_steps), `seed`."""
        spec = dataset_spec(cfg.data.kind)
        if not spec.locomo_format:
            raise ValueError(
                f"data.kind={cfg.data.kind}: RL states need conversations split by id whose questions name their "
                f"evidence turns (LoCoMo's format); {spec.title} is a zero-shot test set"
            )
        loader, banks = cfg.data_loader, banks_config(cfg)
        precision = run_precision(cfg)
        recipe = bank_recipe(cfg, precision=precision.name)
        manager = manager_config(cfg)
        models = ModelCache(cfg.backbone, "hf", manager.batch_size, precision)  # loaded only if a bank needs building

        return cls(
            locomo={
                "path": cfg.data.path,
                "sha256": cfg.data.sha256,
                "download": cfg.data.get("download") or None,
                "splits": cfg.data.splits,
                "exclude_categories": list(cfg.data.exclude_categories),
            },
            agent=cfg.model.agent,
            recipe=recipe,
            banks_dir=banks.dir,
            banks_uri=banks.uri,
            bank_policy=memory_policy(recipe, cfg, models.engine, ()),
            **({"window": cfg.model.window, "questions": cfg.model.questions} if cfg.model.agent == "manager" else {}),
            num_candidates=manager.num_candidates,
            k_per_speaker=answer_config(cfg).k_per_speaker,
            batch_size=loader.states_per_step,
            val_batch_size=loader.val_batch_size,
            seed=cfg.seed,
            max_steps=loader.max_steps,
            lock_wait_s=banks.lock_wait_s,
        )

    def prepare_data(self) -> None:
        self.locomo.prepare_data()

    def setup(self, stage: str | None = None) -> None:
        if self.train_states is not None:
            return
        self.locomo.setup()
        train, validation = self.locomo.conversations("train"), self.locomo.conversations("validation")
        if self.embedder is None:
            self.embedder = Embedder(self.recipe.embedder)
        conversations = [*train, *validation]
        # A Manager-written bank takes minutes to build: the same progress bar (or log lines) as evaluate.py.
        with progress_bar() as bar:
            task = bar.add_task("building banks", total=None)
            self.banks = open_or_build_banks(
                self.recipe,
                conversations,
                self.embedder,
                self._open,
                policy=self.bank_policy or AddAllPolicy(),
                items={c.sample_id: memory_items(c, self.recipe.source) for c in conversations},
                banks_dir=self.banks_dir,
                uri=self.banks_uri,
                lock_wait_s=self.lock_wait_s,
                on_total=lambda total: bar.update(task, total=total),
                on_advance=lambda n: bar.advance(task, n),
            )
        if self.agent == "manager":
            self.train_states = ManagerStates(train, self.banks.__getitem__, self.window, self.num_candidates, questions=self.questions)
            self.val_states = ManagerStates(validation, self.banks.__getitem__, self.window, self.num_candidates, questions=self.questions)
        else:
            self.train_states = AnswerStates(train, self.banks, self.k_per_speaker)
            self.val_states = AnswerStates(validation, self.banks, self.k_per_speaker)

    def teardown(self, stage: str | None = None) -> None:
        self._open.close()
        self._open = ExitStack()
        self.banks = {}
        self.train_states = self.val_states = None
        self.train_weights = None

    def weigh_training_states(self, weigh: Callable[[IndexedStates], Sequence[float] | np.ndarray]) -> None:
        """Draw the training states by weight from now on: `weigh(states)`, one weight per training
        state (`memr1.states.order.check_weights`), each batch `weighted_batch_indices`. Call it after
        `setup`, before `train_dataloader`."""
        states = self._loaded(self.train_states)
        self.train_weights = check_weights(weigh(states), len(states), self.batch_size)

    def probe_states(self, count: int) -> list[Any]:
        """`count` training states drawn once with a fixed seed: the probe set the RL module scores
        every few steps (`train/probe_reward`)."""
        states = self._loaded(self.train_states)
        order = np.random.default_rng(self.seed + 104_729).permutation(len(states))[:count]
        return [states[int(index)] for index in order]

    def extra_states(self, step: int, draw: int) -> list[Any]:
        """Dynamic sampling's extra states for batch step `step`: draw `draw` (1, 2, ...) is a batch of
        `batch_size` training states drawn with a seed of (seed, step, draw), so a resumed run draws
        the same ones; this rank's share, as `train_dataloader` gives it."""
        states = self._loaded(self.train_states)
        rank, world_size = self._shard()
        order = np.random.default_rng([self.seed, step, draw, 15_485_863]).permutation(len(states))[: self.batch_size]
        return [states[int(index)] for index in order[rank::world_size]]

    @property
    def num_states(self) -> int:
        """Training states (one pass over the data)."""
        return len(self._loaded(self.train_states))

    def batch_indices(self, step: int) -> list[int]:
        """The training state indices of batch step `step`, all ranks together (for logging)."""
        return step_indices(step, self.num_states, self.batch_size, self.seed, self.train_weights)

    def step_range(self) -> range:
        """The batch steps `train_dataloader()` yields now: [start, stop), see the class docstring."""
        stop = self.max_steps
        if self.trainer is not None and self.trainer.max_steps > 0:
            stop = self.trainer.max_steps
        if stop is None:
            raise ValueError("RL training is counted in steps: set the trainer's max_steps (or max_steps= here)")
        start = self.batch_step()
        return range(start, max(start, stop))

    def batch_step(self) -> int:
        """The batch step training stands at: the attached trainer's (`lightning_loop.batch_step`; 0
        without a trainer)."""
        return 0 if self.trainer is None else lightning_loop.batch_step(self.trainer)

    def train_dataloader(self) -> DataLoader:
        states = self._loaded(self.train_states)
        batches = StepBatches(
            states, self.batch_size, self.seed, self.step_range(), self.batch_step, self._shard(), weights=self.train_weights
        )
        return DataLoader(batches, batch_size=None, num_workers=0, collate_fn=collate_states)

    def val_dataloader(self) -> DataLoader:
        states = self._loaded(self.val_states)
        return DataLoader(
            states, batch_size=self.val_batch_size, shuffle=False, num_workers=0, collate_fn=collate_states
        )

    def _shard(self) -> tuple[int, int]:
        """(rank, world size) of the attached trainer; (0, 1) without one."""
        if self.trainer is None:
            return 0, 1
        return self.trainer.global_rank, self.trainer.world_size

    @staticmethod
    def _loaded(states: ManagerStates | AnswerStates | None) -> ManagerStates | AnswerStates:
        if states is None:
            raise RuntimeError("RLStatesDataModule: call setup() before asking for states or loaders")
        return states
