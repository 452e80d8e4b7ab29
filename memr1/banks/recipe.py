"""The bank recipe: everything that decides what a conversation's bank holds, and the one function
that opens or builds the banks of a recipe. Evaluation and the RL state data modules both call it,
so identical recipes share one set of banks (one Milvus Lite file, or one server's collections).

A recipe is the data file, the memory source (the dataset's facts, its raw turns, or facts an LLM
extracted), and who decides each item's operation: ADD-all, or the Memory Manager (the prompted base
model, or a trained checkpoint) with the settings that change its decisions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memr1.banks.build import bank_name, build_banks
from memr1.banks.policies import MemoryPolicy
from memr1.config import BANK_POLICIES
from memr1.embed import Embedder
from memr1.llm.loading import weights_digest
from memr1.memory import BankLockedError, MemoryBank, MemoryView
from memr1.memory.ephemeral import MEMORY_URI
from memr1.timing import StageTimer
from memr1.types import Conversation, Fact, MemoryEntry, MemoryOp

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class BankRecipe:
    """What a set of banks is built from and by whom.

    data, data_path: the dataset kind and file. source: `memory.source` (observation | raw_turns | llm).
    policy: "add_all", "manager" (the Memory Manager decides; raw turns are always ADDed) or "oracle"
        (the search with the questions of the banks' own conversations, `memr1.search_teacher.OraclePolicy`).
    writer: the settings of every model that writes memories (the Manager's backbone, checkpoint, the
        digest of its weights (`weights_digest`) and decoding; the extractor's, for source=llm; the
        oracle's answerer and search rule); empty for ADD-all over the dataset's items.
    embedder: the sentence-transformers model of the vectors (`banks.embedder`; None: all-MiniLM-L6-v2).
    """

    data: str
    data_path: str
    source: str
    policy: str
    writer: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    embedder: str | None = None

    def __post_init__(self) -> None:
        if self.policy not in BANK_POLICIES:
            raise ValueError(f"banks.policy: {self.policy!r} is not one of {BANK_POLICIES}")
        if self.policy == "oracle" and self.source != "observation":
            raise ValueError(f"banks=oracle: it decides the dataset's facts, whose turns the questions cite (memory=facts); got memory.source={self.source}")

    @property
    def uses_manager(self) -> bool:
        """Whether a model decides the operations (raw turns are always ADDed)."""
        return self.policy == "manager" and self.source != "raw_turns"

    def signature(self) -> str:
        """The banks' name: "<data>-<source>-<policy>-<digest of the whole recipe>"."""
        recipe = dataclasses.asdict(self)
        if self.embedder is None:  # the default embedder stays out: banks built before the key keep their names
            del recipe["embedder"]
        manager = recipe["writer"].get("manager")
        if manager and manager.get("weights"):
            # A trained Manager is named by its weights: copies of one export share banks, an export
            # rewritten in place (a run's policy/best) gets new ones.
            del manager["ckpt"]
        if manager and manager.get("add_text") == "model":  # the only ADD there was: banks built before the key keep their names
            del manager["add_text"]
        body = json.dumps(recipe, sort_keys=True, default=str)
        policy = "manager" if self.uses_manager else "oracle" if self.policy == "oracle" else "add_all"
        return f"{self.data}-{self.source}-{policy}-{hashlib.sha256(body.encode()).hexdigest()[:10]}"


def bank_recipe(cfg: Any, *, precision: str) -> BankRecipe:
    """The recipe of a composed `train.yaml` or `evaluate.yaml`: `data`, `memory` (the source), `banks`
    (the policy), and `manager` / `backbone` when a model writes. `precision`: the one the run's models
    compute in (`run_precision(cfg).name`); it names the banks a model writes, since greedy decisions
    can differ between fp32 and bf16, and ADD-all's banks of the dataset's facts do not depend on it."""
    source, policy = str(cfg.memory.source), str(cfg.banks.policy)
    if source == "raw_turns":
        policy = "add_all"  # raw turns are ADDed whoever the policy is: the same banks, one name
    writer: dict[str, Any] = {}
    if source == "llm":
        writer["extractor"] = {"backbone": str(cfg.backbone.name_or_path), "precision": precision, **dict(cfg.memory)}
    if policy == "manager":
        manager = cfg.manager
        writer["manager"] = {
            "backbone": str(cfg.backbone.name_or_path),
            "precision": precision,
            "ckpt": None if manager.ckpt is None else str(manager.ckpt),
            "weights": None if manager.ckpt is None else weights_digest(manager.ckpt),
            "num_candidates": int(manager.num_candidates),
            "max_new_tokens": int(manager.max_new_tokens),
            "add_text": str(manager.add_text),
        }
    if policy == "oracle":
        answer = cfg.answer
        writer["oracle"] = {
            "backbone": str(cfg.backbone.name_or_path),
            "precision": precision,
            "answerer": str(answer.ckpt),
            "weights": None if answer.ckpt is None else weights_digest(answer.ckpt),
            "distill": bool(answer.distill),
            "k_per_speaker": int(answer.k_per_speaker),
            "max_new_tokens": int(answer.max_new_tokens),
            "num_candidates": int(cfg.manager.num_candidates),
            **{key: cfg.banks.oracle[key] for key in ("reward", "min_margin", "drop_factor")},
        }
    embedder = cfg.banks.embedder
    return BankRecipe(str(cfg.data.kind), str(cfg.data.path), source, policy, writer, None if embedder is None else str(embedder))


def store_location(recipe: BankRecipe, banks_dir: str | Path, uri: str | None) -> tuple[str, Path | None]:
    """(store URI, build-progress file) of `recipe`: a Milvus Lite file `<banks_dir>/<signature>.db`,
    or the server `uri` with the progress file still under `banks_dir`. Banks in memory (":memory:")
    start empty in every process: no progress file, each build starts from the first item."""
    if uri == MEMORY_URI:
        return uri, None
    folder = Path(banks_dir)
    folder.mkdir(parents=True, exist_ok=True)
    signature = recipe.signature()
    return uri or str(folder / f"{signature}.db"), folder / f"{signature}.progress.json"


def facts_cache_file(recipe: BankRecipe, banks_dir: str | Path) -> Path:
    """Where the facts extracted for `recipe`'s banks are cached, whichever store keeps the banks."""
    folder = Path(banks_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{recipe.signature()}.facts.jsonl"


def open_banks(
    uri: str, conversations: Sequence[Conversation], embedder: Embedder, stack: ExitStack, lock_wait_s: float
) -> dict[str, MemoryBank]:
    """Every conversation's bank at `uri`, entered into `stack`. A Lite file held by another process
    (building or loading the same banks; each releases it once they are loaded) is waited for, up to
    `lock_wait_s` seconds, then a `BankLockedError` names it."""
    deadline = time.monotonic() + lock_wait_s
    while True:
        opened = ExitStack()
        try:
            banks = {c.sample_id: opened.enter_context(MemoryBank.open(uri, bank_name(c.sample_id), embedder)) for c in conversations}
        except BankLockedError as error:
            opened.close()  # the banks opened before the locked one
            if time.monotonic() >= deadline:
                raise BankLockedError(
                    error.path,
                    hint=f"wait for it (banks.lock_wait_s={lock_wait_s} s), or give this run its own banks with banks.dir=DIR",
                ) from None
            log.info("waiting for %s: another process is building or loading these banks", uri)
            time.sleep(2.0)
            continue
        stack.enter_context(opened)
        return banks


def open_or_build_banks(
    recipe: BankRecipe,
    conversations: Sequence[Conversation],
    embedder: Embedder,
    stack: ExitStack,
    *,
    policy: MemoryPolicy,
    items: Mapping[str, Sequence[Fact]],
    banks_dir: str | Path,
    uri: str | None = None,
    lock_wait_s: float = 0.0,
    timer: StageTimer | None = None,
    on_total: Callable[[int], None] | None = None,
    on_advance: Callable[[int], None] | None = None,
) -> dict[str, MemoryBank]:
    """The banks of `recipe` for `conversations`, built or brought up to date, then released for reading.

    policy: who decides (`lazy_policy` loads a model only when a bank still has items to take).
    items: each conversation's items, in dialogue order (`memr1.banks.build.memory_items`).
    The build is resumable (`build_banks`); once built, each bank serves reads from this process and
    the Lite file is free for other processes (`MemoryBank.release_store`).
    """
    store_uri, progress_file = store_location(recipe, banks_dir, uri)
    banks = open_banks(store_uri, conversations, embedder, stack, lock_wait_s)
    if on_total is not None:
        on_total(sum(len(items[c.sample_id]) for c in conversations))
    build_banks(items, banks, policy, progress_file, timer, on_advance=on_advance)
    for bank in banks.values():
        bank.release_store()
    return banks


class LazyPolicy:
    """A `MemoryPolicy` made on its first decision: finished banks never load the Manager's model.
    `num_candidates` is the recipe's, known without the model."""

    def __init__(self, make: Callable[[], MemoryPolicy], num_candidates: int) -> None:
        self._make = make
        self._policy: MemoryPolicy | None = None
        self.num_candidates = num_candidates

    def _get(self) -> MemoryPolicy:
        if self._policy is None:
            self._policy = self._make()
        return self._policy

    def decide(
        self, conversation_ids: Sequence[str], facts: Sequence[Fact], candidates: Sequence[Sequence[MemoryEntry]], banks: Sequence[MemoryView]
    ) -> list[MemoryOp]:
        return self._get().decide(conversation_ids, facts, candidates, banks)
