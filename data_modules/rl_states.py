"""The RL states of both agents, built lazily and cached, and a step-indexed, resumable loader over them.

Manager states (`ManagerStates`): one per (evidence turn of a training question, fact of that turn).
A fact belongs to the turn it becomes knowable at, the last turn it cites (`Conversation.facts_by_turn`,
the order banks are built in). The state's bank is the paper's temporal bank: the memories of the
`window` turns strictly before the fact's turn. It is cut out of a *teacher* bank built once per
conversation over all its facts. The teacher ADDs every fact (`AddAllPolicy`), so its memories are the
dataset's facts with their turns as provenance; a prompted or trained teacher (the paper's strong LLM)
is a later extension.

Answer states (`AnswerStates`): one per question, with the top memories of each speaker retrieved
from the conversation's bank.

Both datasets hold only their (small) index eagerly; a state is built in `__getitem__` and kept in a
small LRU cache. States hold views of Milvus-backed banks, which live in this process: load them with
`num_workers=0`. Milvus Lite allows one process per database, so under DDP each rank builds and opens
its own copy of a Lite database (`rank_uri`).

Training order (`StepBatches`): the batch of global step `s` is a pure function of (seed, s): every
pass over the data visits the states in a fresh permutation seeded by (seed, pass index), cut into
`num_states // batch_size` batches (`batch_indices`). A run resumed at step `s` therefore sees exactly
the batches an unbroken run saw. Under DDP, rank r of w takes positions r, r + w, ... of each batch.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np
from lightning.pytorch import LightningDataModule
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset, IterableDataset

from data_modules.locomo import LoCoMoDataModule
from memr1.embed import Embedder
from memr1.envs.answer import AnswerState
from memr1.envs.manager import ManagerState
from memr1.llm.engines import build_engine
from memr1.llm.loading import load_policy
from memr1.memory import BankFork, MemoryBank, MemoryView
from memr1.memory.store import is_lite_uri
from memr1.pipeline.answering import retrieve_memories
from memr1.pipeline.banks import bank_name, build_banks, memory_items
from memr1.pipeline.managers import AddAllPolicy, MemoryPolicy, ModelPolicy
from memr1.types import Conversation, MemoryOp, OpKind, Question

AGENTS = ("manager", "answer")
DEFAULT_CACHE_SIZE = 128


# ---- banks -----------------------------------------------------------------------------------------


def build_banks_at(
    conversations: Sequence[Conversation],
    uri: str | Path,
    embedder: Embedder,
    policy: MemoryPolicy,
    progress_file: Path,
) -> dict[str, MemoryBank]:
    """Open every conversation's bank at `uri` (named by `bank_name`) and bring it up to date over the
    conversation's observation facts with `policy`; resumable through `progress_file`.

    The caller closes the returned banks. A bank whose build is already complete is opened as it is.
    """
    banks: dict[str, MemoryBank] = {}
    try:
        for conversation in conversations:
            banks[conversation.sample_id] = MemoryBank.open(uri, bank_name(conversation.sample_id), embedder)
        items = {conversation.sample_id: memory_items(conversation, "observation") for conversation in conversations}
        build_banks(items, banks, policy, progress_file)
    except BaseException:
        for bank in banks.values():
            bank.close()
        raise
    return banks


def build_teacher_banks(
    conversations: Sequence[Conversation], uri: str | Path, embedder: Embedder, progress_file: Path
) -> dict[str, MemoryBank]:
    """The Manager's teacher banks: every observation fact ADDed (`AddAllPolicy`), one bank per
    conversation at `uri`, built once (a rerun reopens them)."""
    return build_banks_at(conversations, uri, embedder, AddAllPolicy(), progress_file)


def rank_uri(uri: str, rank: int, world_size: int) -> str:
    """The database of one DDP rank: a Milvus Lite path gets a per-rank sibling ("banks.db" ->
    "banks.rank1.db"; Lite allows one process per database), a server URI is shared by all ranks."""
    if world_size == 1 or not is_lite_uri(uri):
        return uri
    return str(Path(uri).with_suffix(f".rank{rank}.db"))


def model_bank_policy(name_or_path: str, dtype: str, adapter: str | None) -> ModelPolicy:
    """A Memory Manager model (the base model prompted when `adapter` is None, else a trained
    checkpoint on it) that builds banks, greedy, through an HF engine."""
    model, tokenizer = load_policy(name_or_path, dtype=dtype, adapter=adapter)
    return ModelPolicy(build_engine("hf", model=model, tokenizer=tokenizer))


def turn_positions(conversation: Conversation) -> dict[str, int]:
    """dia_id -> position of the turn in the whole conversation (0-based, across sessions)."""
    return {turn.dia_id: position for position, turn in enumerate(conversation.turns())}


def known_position(provenance: Sequence[str], positions: Mapping[str, int]) -> int | None:
    """Position of the latest turn in `provenance` (when the memory became knowable); None if it cites
    no turn of the conversation."""
    return max((positions[dia_id] for dia_id in provenance if dia_id in positions), default=None)


def in_window(memory_position: int | None, fact_position: int, window: int) -> bool:
    """Whether a memory known at `memory_position` is among the `window` turns strictly before the fact's
    turn: fact_position - window <= memory_position < fact_position. A memory of no turn never is."""
    return memory_position is not None and fact_position - window <= memory_position < fact_position


def window_bank(teacher: MemoryView, positions: Mapping[str, int], fact_position: int, window: int) -> BankFork:
    """A fork of `teacher` in which every memory outside the window before `fact_position` is deleted."""
    bank = teacher.fork()
    for entry in teacher.entries():
        if not in_window(known_position(entry.provenance, positions), fact_position, window):
            bank.apply(MemoryOp(OpKind.DELETE, target_id=entry.id))
    return bank


# ---- states ----------------------------------------------------------------------------------------


class StateKey(NamedTuple):
    """Which manager state: the fact `fact_index` of turn `dia_id` (in `facts_by_turn` order)."""

    conversation_id: str
    dia_id: str
    fact_index: int


def by_sample_id(conversations: Sequence[Conversation]) -> dict[str, Conversation]:
    result: dict[str, Conversation] = {}
    for position, conversation in enumerate(conversations):
        if conversation.sample_id in result:
            raise ValueError(f"conversations[{position}]: sample_id {conversation.sample_id!r} appears twice")
        result[conversation.sample_id] = conversation
    return result


class ManagerStates(Dataset[ManagerState]):
    """One `ManagerState` per (evidence turn of a question of `conversations`, fact of that turn).

    bank_for(conversation_id): the conversation's opened teacher bank, built over all its facts
        (`build_teacher_banks`); asked once per conversation, when its first state is built.
    window: turns before the fact's turn whose facts the state's bank holds (the paper: 24 or 50).
    num_candidates: memories shown to the Manager (Mem0: 5).

    Evidence turns with no fact are skipped and counted in `skipped_turns`; questions with no evidence
    give no state. `keys` lists the states: conversations in the given order, turns in dialogue order.
    """

    def __init__(
        self,
        conversations: Sequence[Conversation],
        bank_for: Callable[[str], MemoryView],
        window: int = 50,
        num_candidates: int = 5,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        if window < 1:
            raise ValueError(f"ManagerStates.window: must be >= 1, got {window}")
        if num_candidates < 0:
            raise ValueError(f"ManagerStates.num_candidates: must be >= 0, got {num_candidates}")
        self.window = window
        self.num_candidates = num_candidates
        self._bank_for = bank_for
        self._conversations = by_sample_id(conversations)
        self._positions = {cid: turn_positions(c) for cid, c in self._conversations.items()}
        self._facts = {cid: c.facts_by_turn() for cid, c in self._conversations.items()}
        self._questions: dict[tuple[str, str], list[Question]] = {}  # (conversation, turn) -> questions
        self._teachers: dict[str, MemoryView] = {}
        self.keys: list[StateKey] = []
        self.skipped_turns = 0
        for cid, conversation in self._conversations.items():
            positions = self._positions[cid]
            asking: dict[str, list[Question]] = {}  # evidence turn -> the questions citing it
            for question in conversation.questions:
                for dia_id in dict.fromkeys(question.evidence):  # a turn cited twice asks once
                    if dia_id not in positions:
                        raise ValueError(
                            f"conversation {cid}: question {question.qid}: evidence {dia_id!r} "
                            "is no turn of the conversation"
                        )
                    asking.setdefault(dia_id, []).append(question)
            for dia_id in sorted(asking, key=positions.__getitem__):
                self._questions[(cid, dia_id)] = asking[dia_id]
                facts = self._facts[cid].get(dia_id, [])
                self.skipped_turns += not facts
                self.keys.extend(StateKey(cid, dia_id, index) for index in range(len(facts)))
        self._state = functools.lru_cache(maxsize=cache_size)(self._build)

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int) -> ManagerState:
        if not 0 <= index < len(self.keys):
            raise IndexError(f"ManagerStates: index {index} out of range 0..{len(self.keys) - 1}")
        return self._state(index)

    def _build(self, index: int) -> ManagerState:
        cid, dia_id, fact_index = self.keys[index]
        fact = self._facts[cid][dia_id][fact_index]
        positions = self._positions[cid]
        bank = window_bank(self._teacher(cid), positions, positions[dia_id], self.window)
        candidates = bank.search(fact.text, speaker=fact.speaker, k=self.num_candidates) if self.num_candidates else []
        return ManagerState(
            fact=fact,
            conversation_id=cid,
            speakers=self._conversations[cid].speakers,
            bank=bank,
            candidates=candidates,
            questions=list(self._questions[(cid, dia_id)]),
        )

    def _teacher(self, conversation_id: str) -> MemoryView:
        teacher = self._teachers.get(conversation_id)
        if teacher is None:
            teacher = self._bank_for(conversation_id)
            if len(teacher) == 0:
                raise ValueError(
                    f"ManagerStates: the teacher bank of {conversation_id} ({teacher.name!r}) is empty; "
                    "build it first (build_teacher_banks)"
                )
            self._teachers[conversation_id] = teacher
        return teacher


class AnswerStates(Dataset[AnswerState]):
    """One `AnswerState` per question of `conversations` (dataset order), with the `k_per_speaker`
    memories of each speaker most similar to the question, retrieved from `banks[conversation_id]`."""

    def __init__(
        self,
        conversations: Sequence[Conversation],
        banks: Mapping[str, MemoryView],
        k_per_speaker: int = 30,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        if k_per_speaker < 1:
            raise ValueError(f"AnswerStates.k_per_speaker: must be >= 1, got {k_per_speaker}")
        by_id = by_sample_id(conversations)
        missing = sorted(set(by_id) - set(banks))
        if missing:
            raise ValueError(f"AnswerStates: banks: no bank for conversations {missing}")
        self.k_per_speaker = k_per_speaker
        self.questions = [question for conversation in by_id.values() for question in conversation.questions]
        self._speakers = {cid: conversation.speakers for cid, conversation in by_id.items()}
        self._banks = banks
        self._state = functools.lru_cache(maxsize=cache_size)(self._build)

    def __len__(self) -> int:
        return len(self.questions)

    def __getitem__(self, index: int) -> AnswerState:
        if not 0 <= index < len(self.questions):
            raise IndexError(f"AnswerStates: index {index} out of range 0..{len(self.questions) - 1}")
        return self._state(index)

    def _build(self, index: int) -> AnswerState:
        question = self.questions[index]
        cid = question.conversation_id
        memories = retrieve_memories(self._banks[cid], question.question, self._speakers[cid], self.k_per_speaker)
        return AnswerState(question, memories)


def collate_states(batch: Sequence[Any]) -> list[Any]:
    """States are dataclasses, not tensors: a batch is a plain list of them."""
    return list(batch)


# ---- step-indexed order ----------------------------------------------------------------------------


def pass_permutation(num_states: int, seed: int, pass_index: int) -> np.ndarray:
    """The order of the states in pass `pass_index` over the data: (num_states,) int64, seeded by
    (seed, pass_index) through numpy's SeedSequence, the same on every machine."""
    return np.random.default_rng([seed, pass_index]).permutation(num_states)


def batch_indices(step: int, num_states: int, batch_size: int, seed: int) -> list[int]:
    """The state indices of global step `step`.

    Each pass over the data is `num_states // batch_size` batches cut from that pass's permutation;
    the last `num_states % batch_size` states of the permutation sit that pass out (different ones
    each pass), so a batch never holds a state twice. Step s is batch s % per_pass of pass s // per_pass.
    """
    if step < 0 or batch_size < 1 or seed < 0 or num_states < batch_size:
        raise ValueError(
            f"batch_indices: need step >= 0, 1 <= batch_size <= num_states, seed >= 0; "
            f"got step={step}, batch_size={batch_size}, num_states={num_states}, seed={seed}"
        )
    pass_index, batch = divmod(step, num_states // batch_size)
    start = batch * batch_size
    return pass_permutation(num_states, seed, pass_index)[start : start + batch_size].tolist()


class IndexedStates(Protocol):
    """What `StepBatches` draws from: `ManagerStates`, `AnswerStates`, or any sequence."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


class StepBatches(IterableDataset[list[Any]]):
    """The batches of global steps `steps` (a range), in order: batch `s` is
    `[states[i] for i in batch_indices(s, len(states), batch_size, seed)]`. Load it with
    `DataLoader(..., batch_size=None, num_workers=0)`: it yields whole batches, from one process.

    current_step: where the consumer stands (the data module passes the trainer's batch step). Every
        iteration must begin at `steps.start`: a loader iterated again after its steps ran out (a
        trainer that starts another epoch because its step count disagrees with ours) raises instead
        of replaying batches or spinning through empty epochs.
    shard: (rank, world_size) under DDP: this rank's part of each batch, positions rank::world_size.
    """

    def __init__(
        self,
        states: IndexedStates,
        batch_size: int,
        seed: int,
        steps: range,
        current_step: Callable[[], int] | None = None,
        shard: tuple[int, int] = (0, 1),
    ) -> None:
        if not 1 <= batch_size <= len(states):
            raise ValueError(
                f"StepBatches.batch_size: must be in 1..{len(states)} (the number of states), got {batch_size}"
            )
        if seed < 0:
            raise ValueError(f"StepBatches.seed: must be >= 0, got {seed}")
        if steps.step != 1 or steps.start < 0:
            raise ValueError(f"StepBatches.steps: expected a range of consecutive steps from >= 0, got {steps}")
        rank, world_size = shard
        if not 0 <= rank < world_size <= batch_size:
            raise ValueError(
                f"StepBatches.shard: rank {rank} of {world_size}; every rank needs a state of each batch, "
                f"so world_size must be <= batch_size={batch_size}"
            )
        self.states = states
        self.batch_size = batch_size
        self.seed = seed
        self.steps = steps
        self.current_step = current_step
        self.shard = shard

    def indices(self, step: int) -> list[int]:
        """This rank's state indices of step `step`."""
        rank, world_size = self.shard
        return batch_indices(step, len(self.states), self.batch_size, self.seed)[rank::world_size]

    def __iter__(self) -> Iterator[list[Any]]:
        if self.current_step is not None and (current := self.current_step()) != self.steps.start:
            raise RuntimeError(
                f"StepBatches: iterated at batch step {current}, but this loader serves steps {self.steps}; "
                "the trainer went on past them (is steps_per_batch the number of optimizer steps per batch?)"
            )
        for step in self.steps:
            yield [self.states[index] for index in self.indices(step)]


# ---- the data module -------------------------------------------------------------------------------


class RLStatesDataModule(LightningDataModule):
    """The RL states of one agent over LoCoMo: train = split "train" (conv-26), validation = split
    "validation" (conv-30), in the same kind of states: the Manager is validated by its greedy reward on
    conv-30's manager states, the Answer Agent by greedy F1 / BLEU-1 / EM on conv-30's answer states.

    locomo: a `LoCoMoDataModule`, or its keyword arguments.
    agent: "manager" (`ManagerStates`) or "answer" (`AnswerStates`).
    banks_uri: where the banks of both splits live (a Milvus Lite `.db` path or a server URI), built on
        first `setup` and reused afterwards; `progress_file` (default: beside a Lite path,
        `<name>.progress.json`) records the build.
    bank_policy: who builds the banks. None: ADD-all, the Manager's teacher (required for
        agent="manager") and the no-RL-Manager ablation for the answer agent. For the answer agent the
        paper's alternating schedule builds them with the trained Manager: pass its `ModelPolicy`, or a
        function that makes one (called only in `setup`, so its model is freed once the banks are built).
        Use a separate uri per policy: a finished build is never redone.
    window, num_candidates: of `ManagerStates`; k_per_speaker: memories per speaker for answer states.
    batch_size: states per training step (all ranks together); val_batch_size: states per validation
        batch and rank.
    seed: of the training order (`batch_indices`).
    steps_per_batch: optimizer steps the module takes per batch. `trainer.global_step` counts every
        `LightningOptimizer.step`; `memr1.modules` takes exactly one per rollout batch (the default 1).
    max_steps: the last batch step (exclusive) when no trainer with `max_steps` is attached.

    `train_dataloader()` yields the batches of steps [start, stop): start from the attached trainer's
    global step (a resumed run continues with the batch the interrupted one was about to take), stop
    from `trainer.max_steps`. Banks are opened in `setup` and closed in `teardown`. Under DDP each rank
    takes its share of every batch and opens its own copy of a Lite database (`rank_uri`).
    """

    def __init__(
        self,
        locomo: LoCoMoDataModule | Mapping[str, Any],
        agent: Literal["manager", "answer"],
        banks_uri: str | Path,
        window: int = 50,
        num_candidates: int = 5,
        k_per_speaker: int = 30,
        batch_size: int = 8,
        val_batch_size: int = 8,
        seed: int = 0,
        steps_per_batch: int = 1,
        max_steps: int | None = None,
        bank_policy: MemoryPolicy | Callable[[], MemoryPolicy] | None = None,
        progress_file: str | Path | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        super().__init__()
        if agent not in AGENTS:
            raise ValueError(f"RLStatesDataModule.agent: {agent!r} is not one of {AGENTS}")
        if agent == "manager" and bank_policy is not None:
            raise ValueError(
                "RLStatesDataModule.bank_policy: manager states are cut from the ADD-all teacher bank (leave "
                "it None); a prompted or trained teacher is not supported yet"
            )
        sizes = {"batch_size": batch_size, "val_batch_size": val_batch_size, "steps_per_batch": steps_per_batch}
        for name, value in sizes.items():
            if value < 1:
                raise ValueError(f"RLStatesDataModule.{name}: must be >= 1, got {value}")
        if seed < 0:
            raise ValueError(f"RLStatesDataModule.seed: must be >= 0, got {seed}")
        if max_steps is not None and max_steps < 0:
            raise ValueError(f"RLStatesDataModule.max_steps: must be >= 0, got {max_steps}")
        self.locomo = locomo if isinstance(locomo, LoCoMoDataModule) else LoCoMoDataModule(**dict(locomo))
        self.agent = agent
        self.banks_uri = str(banks_uri)
        if progress_file is None:
            if not is_lite_uri(self.banks_uri):
                raise ValueError(f"RLStatesDataModule.progress_file: needed with the server URI {self.banks_uri!r}")
            progress_file = Path(self.banks_uri).with_suffix(".progress.json")
        self.progress_file = Path(progress_file)
        self.window = window
        self.num_candidates = num_candidates
        self.k_per_speaker = k_per_speaker
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size
        self.seed = seed
        self.steps_per_batch = steps_per_batch
        self.max_steps = max_steps
        self.bank_policy = bank_policy
        self.embedder = embedder
        self.banks: dict[str, MemoryBank] = {}
        self.train_states: ManagerStates | AnswerStates | None = None
        self.val_states: ManagerStates | AnswerStates | None = None

    @classmethod
    def from_config(cls, cfg: DictConfig) -> RLStatesDataModule:
        """The data module of `train.py`'s config: `data` (LoCoMo), `model` (agent, its state settings
        and, for the answer agent, `bank_manager`: add_all | prompted | a trained Manager's checkpoint
        dir), `data_loader` (states_per_step, val_batch_size, max_steps), `banks.dir`, `seed`, and
        `backbone` when a model builds the banks. Banks go to `banks.dir/rl-<builder>-<digest>.db`, one
        database per (data file, builder)."""
        if cfg.data.kind != "locomo":
            raise ValueError(f"data={cfg.data.kind}: RL states come from LoCoMo's conversations; use data=locomo")
        model, loader = cfg.model, cfg.data_loader
        builder = "add_all" if model.agent == "manager" else str(model.get("bank_manager", "add_all"))
        bank_policy = None
        if builder != "add_all":
            adapter = None if builder == "prompted" else builder
            bank_policy = functools.partial(model_bank_policy, cfg.backbone.name_or_path, cfg.backbone.dtype, adapter)
        recipe = {"data": str(cfg.data.path), "builder": builder}
        if bank_policy is not None:
            recipe["backbone"] = str(cfg.backbone.name_or_path)
        digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:10]
        kind = "add_all" if bank_policy is None else "model"
        return cls(
            locomo={
                "path": cfg.data.path,
                "sha256": cfg.data.sha256,
                "download": cfg.data.get("download") or None,
                "splits": cfg.data.splits,
                "exclude_categories": list(cfg.data.exclude_categories),
            },
            agent=model.agent,
            banks_uri=Path(cfg.banks.dir) / f"rl-{kind}-{digest}.db",
            window=model.get("window", 50),
            num_candidates=model.get("num_candidates", 5),
            k_per_speaker=model.k_per_speaker,
            batch_size=loader.states_per_step,
            val_batch_size=loader.val_batch_size,
            seed=cfg.seed,
            max_steps=loader.max_steps,
            bank_policy=bank_policy,
        )

    def prepare_data(self) -> None:
        self.locomo.prepare_data()

    def setup(self, stage: str | None = None) -> None:
        if self.train_states is not None:
            return
        self.locomo.setup()
        train, validation = self.locomo.conversations("train"), self.locomo.conversations("validation")
        if self.embedder is None:
            self.embedder = Embedder()
        rank, world_size = self._shard()
        uri = rank_uri(self.banks_uri, rank, world_size)
        progress_file = self.progress_file
        if uri != self.banks_uri:
            progress_file = progress_file.with_suffix(f".rank{rank}.json")
        if is_lite_uri(uri):
            Path(uri).parent.mkdir(parents=True, exist_ok=True)
        policy = self.bank_policy() if callable(self.bank_policy) else self.bank_policy
        self.banks = build_banks_at([*train, *validation], uri, self.embedder, policy or AddAllPolicy(), progress_file)
        if self.agent == "manager":
            self.train_states = ManagerStates(train, self.banks.__getitem__, self.window, self.num_candidates)
            self.val_states = ManagerStates(validation, self.banks.__getitem__, self.window, self.num_candidates)
        else:
            self.train_states = AnswerStates(train, self.banks, self.k_per_speaker)
            self.val_states = AnswerStates(validation, self.banks, self.k_per_speaker)

    def teardown(self, stage: str | None = None) -> None:
        for bank in self.banks.values():
            bank.close()
        self.banks = {}
        self.train_states = self.val_states = None

    def probe_states(self, count: int) -> list[Any]:
        """`count` training states drawn once with a fixed seed: the probe set the RL module scores
        every few steps (`train/probe_reward`)."""
        states = self._loaded(self.train_states)
        order = np.random.default_rng(self.seed + 104_729).permutation(len(states))[:count]
        return [states[int(index)] for index in order]

    @property
    def num_states(self) -> int:
        """Training states (one pass over the data)."""
        return len(self._loaded(self.train_states))

    def batch_indices(self, step: int) -> list[int]:
        """The training state indices of batch step `step`, all ranks together (for logging)."""
        return batch_indices(step, self.num_states, self.batch_size, self.seed)

    def step_range(self) -> range:
        """The batch steps `train_dataloader()` yields now: [start, stop), see the class docstring."""
        stop = self.max_steps
        if self.trainer is not None and self.trainer.max_steps > 0:
            stop = math.ceil(self.trainer.max_steps / self.steps_per_batch)
        if stop is None:
            raise ValueError("RL training is counted in steps: set the trainer's max_steps (or max_steps= here)")
        start = self.batch_step()
        return range(start, max(start, stop))

    def batch_step(self) -> int:
        """The batch step training stands at: the attached trainer's global step // steps_per_batch (0
        without a trainer)."""
        if self.trainer is None:
            return 0
        global_step = self.trainer.global_step
        if global_step % self.steps_per_batch:
            raise ValueError(
                f"trainer.global_step={global_step} is not a multiple of steps_per_batch={self.steps_per_batch}: "
                "the checkpoint is not at a batch boundary, or steps_per_batch differs from the optimizer steps "
                "the module takes per batch"
            )
        return global_step // self.steps_per_batch

    def train_dataloader(self) -> DataLoader:
        states = self._loaded(self.train_states)
        batches = StepBatches(states, self.batch_size, self.seed, self.step_range(), self.batch_step, self._shard())
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
