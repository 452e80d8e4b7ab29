"""RL states on the tiny LoCoMo fixture with real Milvus Lite banks (tmp_path) and the real MiniLM
embedder, the step-indexed loader through a real Lightning resume, and the state counts of the real
file (skipped when it is absent, failed in CI). About 25 s on 2 cores.

tests/fixtures/locomo_mini.json, mini-1 (Ana, Ben), turns in order with their facts:
  0 D1:1 "Ana adopted a dog named Rex."       3 D2:1 "Ben has run 3 marathons."
  1 D1:2 "Ben started running in 2022."       4 D2:2 "Rex learned to fetch."
  2 D1:3 "Ana took Rex to the park." (cites D1:1 and D1:3: known at D1:3)
  and "Ben likes trail running.", which cites no turn of the conversation.
Questions (category 5 excluded): q0 evidence D1:2, q1 D1:1 + D1:3, q3 D2:1, q4 none.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from memr1.apps import CONFIG_DIR
from memr1.data_modules.locomo import LoCoMoDataModule
from memr1.data_modules.rl_states import RLStatesDataModule
from memr1.banks.build import memory_items
from memr1.banks.policies import AddAllPolicy
from memr1.banks.recipe import BankRecipe, LazyPolicy, open_or_build_banks
from memr1.states.datasets import AnswerStates, ManagerStates, StateKey
from memr1.states.order import (
    IndexedStates, StepBatches, batch_indices, check_weights, kind_balanced_weights, pass_permutation, weighted_batch_indices,
)
from memr1.states.windows import in_window
from memr1.embed import Embedder
from memr1.envs import AnswerState, ManagerState
from memr1.memory import MemoryBank
from memr1.types import Conversation, knowable_at

FIXTURE = Path(__file__).parent / "fixtures" / "locomo_mini.json"
CONF = CONFIG_DIR
SPLITS = {"train": ["mini-1"], "validation": ["mini-2"], "test": []}
RECIPE = BankRecipe("locomo", str(FIXTURE), "observation", "add_all")

ADOPTED = "Ana adopted a dog named Rex."
RUNNING = "Ben started running in 2022."
PARK = "Ana took Rex to the park."
MARATHONS = "Ben has run 3 marathons."
FETCH = "Rex learned to fetch."
TRAIL = "Ben likes trail running."


def locomo_args() -> dict:
    return {"path": FIXTURE, "sha256": hashlib.sha256(FIXTURE.read_bytes()).hexdigest(), "splits": SPLITS}


@pytest.fixture(scope="module")
def conversations() -> list[Conversation]:
    module = LoCoMoDataModule(**locomo_args())
    module.prepare_data()
    module.setup()
    return module.conversations("train") + module.conversations("validation")


@pytest.fixture(scope="module")
def teachers(
    tmp_path_factory: pytest.TempPathFactory, conversations, embedder: Embedder
) -> Iterator[dict[str, MemoryBank]]:
    folder = tmp_path_factory.mktemp("teachers")
    with ExitStack() as stack:
        yield open_or_build_banks(
            RECIPE, conversations, embedder, stack, policy=AddAllPolicy(),
            items={c.sample_id: memory_items(c, "observation") for c in conversations}, banks_dir=folder,
        )


# ---- pure helpers ----------------------------------------------------------------------------------


def test_window_membership_is_the_window_turns_strictly_before() -> None:
    positions = {"D1:1": 0, "D1:2": 1, "D1:3": 2, "D2:1": 3}
    assert knowable_at(("D1:1", "D1:3"), positions) == 2  # the latest turn cited
    assert knowable_at(("D9:9",), positions) is None
    assert knowable_at((), positions) is None
    # fact at position 3, window 2: positions 1 and 2 only.
    assert [in_window(p, 3, 2) for p in (0, 1, 2, 3, 4)] == [False, True, True, False, False]
    assert not in_window(None, 3, 50)


def test_batches_are_a_fresh_permutation_per_pass_cut_into_whole_batches() -> None:
    # numpy's SeedSequence([seed, pass]) + PCG64 permutations: the same on every machine.
    assert [pass_permutation(5, 0, p).tolist() for p in range(3)] == [[2, 4, 3, 0, 1], [1, 4, 3, 0, 2], [4, 2, 1, 0, 3]]
    # 5 states in batches of 2: two batches per pass, the permutation's last state sits the pass out.
    assert [batch_indices(s, 5, 2, seed=0) for s in range(6)] == [[2, 4], [3, 0], [1, 4], [3, 0], [4, 2], [1, 0]]
    assert batch_indices(0, 5, 2, seed=1) == pass_permutation(5, 1, 0).tolist()[:2] == [4, 0]
    with pytest.raises(ValueError, match="batch_size <= num_states"):
        batch_indices(0, 3, 4, seed=0)
    with pytest.raises(ValueError, match="step >= 0"):
        batch_indices(-1, 5, 2, seed=0)


# ---- manager states --------------------------------------------------------------------------------


def texts(state: ManagerState) -> set[str]:
    return {entry.text for entry in state.bank.entries()}


def test_manager_states_index_turns_and_cut_the_window_bank(conversations, teachers) -> None:
    mini_1 = conversations[0]
    asked: list[str] = []

    def bank_for(conversation_id: str) -> MemoryBank:
        asked.append(conversation_id)
        return teachers[conversation_id]

    states = ManagerStates([mini_1], bank_for, window=2, num_candidates=5)
    assert asked == []  # nothing built before the first state is asked for
    assert states.keys == [StateKey("mini-1", turn, 0) for turn in ("D1:1", "D1:2", "D1:3", "D2:1")]
    assert len(states) == 4 and states.skipped_turns == 0
    built = [states[index] for index in range(4)]
    assert [state.fact.text for state in built] == [ADOPTED, RUNNING, PARK, MARATHONS]
    assert [[q.qid for q in state.questions] for state in built] == [
        ["mini-1/q1"], ["mini-1/q0"], ["mini-1/q1"], ["mini-1/q3"]
    ]
    # Window 2: the facts known at the two turns strictly before the fact's turn.
    assert [texts(state) for state in built] == [set(), {ADOPTED}, {ADOPTED, RUNNING}, {RUNNING, PARK}]
    # Candidates: the fact's speaker's memories in that bank.
    assert [[c.text for c in state.candidates] for state in built] == [[], [], [ADOPTED], [RUNNING]]
    assert built[0].speakers == ("Ana", "Ben") and built[0].conversation_id == "mini-1"
    assert states[2] is built[2]  # cached
    assert asked == ["mini-1"]  # the teacher is fetched once per conversation
    assert len(teachers["mini-1"]) == 6  # the window forks never touch the teacher

    wide = ManagerStates([mini_1], teachers.__getitem__, window=50)
    # The trail-running fact cites no turn and fetching comes after: neither is ever in a window.
    assert texts(wide[3]) == {ADOPTED, RUNNING, PARK}


def test_states_judged_by_the_candidates_questions_too(conversations, teachers) -> None:
    """questions="fact_and_candidates": a state's questions are its fact's and those citing a candidate's
    turns (what an UPDATE or DELETE could overwrite); a fact no question cites gets a state when a
    candidate is cited. By hand, window 2: MARATHONS' candidate RUNNING is q0's evidence; FETCH (Ana's,
    D2:2, cited by none) sees PARK, which cites D1:1 and D1:3, q1's evidence."""
    states = ManagerStates(conversations[:1], teachers.__getitem__, window=2, questions="fact_and_candidates")
    assert [key.dia_id for key in states.keys] == ["D1:1", "D1:2", "D1:3", "D2:1", "D2:2"]
    built = [states[index] for index in range(len(states))]
    assert [state.fact.text for state in built] == [ADOPTED, RUNNING, PARK, MARATHONS, FETCH]
    assert [[c.text for c in state.candidates] for state in built] == [[], [], [ADOPTED], [RUNNING], [PARK]]
    assert [[q.qid for q in state.questions] for state in built] == [
        ["mini-1/q1"], ["mini-1/q0"], ["mini-1/q1"], ["mini-1/q3", "mini-1/q0"], ["mini-1/q1"]
    ]
    with pytest.raises(ValueError, match="ManagerStates.questions: 'all' is not one of"):
        ManagerStates(conversations[:1], teachers.__getitem__, questions="all")


def test_evidence_turns_without_facts_are_skipped_and_counted(conversations) -> None:
    mini_1 = conversations[0]
    without_marathons = dataclasses.replace(mini_1, facts=tuple(f for f in mini_1.facts if f.text != MARATHONS))
    states = ManagerStates([without_marathons], lambda cid: pytest.fail("no state is built"), window=2)
    assert [key.dia_id for key in states.keys] == ["D1:1", "D1:2", "D1:3"]
    assert states.skipped_turns == 1  # D2:1, the marathons question's only evidence


def test_manager_states_reject_an_empty_teacher_and_bad_evidence(
    conversations, tmp_path: Path, embedder: Embedder
) -> None:
    with MemoryBank.open(tmp_path / "empty.db", "bank_mini_1", embedder) as empty:
        states = ManagerStates(conversations[:1], lambda cid: empty)
        with pytest.raises(ValueError, match="teacher bank of mini-1 .* is empty; build it first"):
            states[0]
    with pytest.raises(IndexError, match="index 4 out of range 0..3"):
        ManagerStates(conversations[:1], lambda cid: empty)[4]
    question = dataclasses.replace(conversations[0].questions[0], evidence=("D7:7",))
    broken = dataclasses.replace(conversations[0], questions=(question,))
    with pytest.raises(ValueError, match="question mini-1/q0: evidence 'D7:7' is no turn"):
        ManagerStates([broken], lambda cid: empty)


# ---- answer states ---------------------------------------------------------------------------------


def test_answer_states_retrieve_each_speakers_best_memories(conversations, teachers) -> None:
    states = AnswerStates(conversations, teachers, k_per_speaker=1)
    assert [q.qid for q in states.questions] == [
        "mini-1/q0", "mini-1/q1", "mini-1/q3", "mini-1/q4", "mini-2/q0", "mini-2/q1", "mini-2/q3"
    ]
    built = [states[index] for index in range(len(states))]
    assert all(isinstance(state, AnswerState) for state in built)
    assert all([len(memories) for memories in state.memories.values()] == [1, 1] for state in built)
    # The best memory of the speaker each question is about, picked by hand.
    about = ["Ben", "Ana", "Ben", "Ana", "Cleo", "Dev", "Cleo"]
    assert [state.memories[speaker][0].text for state, speaker in zip(built, about)] == [
        RUNNING, ADOPTED, MARATHONS, ADOPTED,
        "Cleo moved to Lisbon.", "Dev visited Lisbon in 2019.", "Cleo works at a bakery.",
    ]
    assert list(built[4].memories) == ["Cleo", "Dev"]
    assert states[0] is built[0]
    with pytest.raises(ValueError, match=r"no bank for conversations \['mini-2'\]"):
        AnswerStates(conversations, {"mini-1": teachers["mini-1"]})


# ---- the step-indexed loader -----------------------------------------------------------------------


def test_a_loader_started_at_step_3_yields_the_batches_an_unbroken_one_did(conversations, teachers) -> None:
    states = AnswerStates(conversations, teachers, k_per_speaker=1)  # 7 states: 2 batches of 3 per pass
    fresh = list(StepBatches(states, batch_size=3, seed=4, steps=range(0, 6)))
    resumed = list(StepBatches(states, batch_size=3, seed=4, steps=range(3, 6)))
    assert resumed == fresh[3:6]
    assert [[s.question.qid for s in batch] for batch in fresh[:2]] == [
        [states.questions[i].qid for i in batch_indices(step, 7, 3, 4)] for step in range(2)
    ]
    with pytest.raises(ValueError, match="batch_size: must be in 1..7"):
        StepBatches(states, batch_size=8, seed=0, steps=range(3))


def test_ddp_ranks_split_every_batch(conversations, teachers) -> None:
    states = AnswerStates(conversations, teachers, k_per_speaker=1)
    whole = StepBatches(states, batch_size=4, seed=0, steps=range(2))
    ranks = [StepBatches(states, batch_size=4, seed=0, steps=range(2), shard=(rank, 2)) for rank in (0, 1)]
    for step in range(2):
        full = whole.indices(step)
        assert ranks[0].indices(step) == full[0::2] and ranks[1].indices(step) == full[1::2]
    with pytest.raises(ValueError, match="world_size must be <= batch_size=4"):
        StepBatches(states, batch_size=4, seed=0, steps=range(2), shard=(0, 5))


def test_each_kind_is_drawn_in_proportion_to_its_size_to_the_alpha() -> None:
    kinds = ["add", "add", "add", "delete"]
    # By hand: alpha 0.5, add's share sqrt(3) / (sqrt(3) + 1) = 0.6340 over 3 states, delete's 0.3660.
    assert kind_balanced_weights(kinds, 0.5) == pytest.approx([0.2113, 0.2113, 0.2113, 0.3660], abs=1e-4)
    assert kind_balanced_weights(kinds, 1.0) == pytest.approx([0.25] * 4)  # every state alike
    assert kind_balanced_weights(kinds, 0.0) == pytest.approx([1 / 6, 1 / 6, 1 / 6, 1 / 2])  # every kind alike
    with pytest.raises(ValueError, match="alpha must be in"):
        kind_balanced_weights(kinds, 1.5)


def test_weighted_batches_draw_by_weight_and_repeat_by_seed_and_step() -> None:
    weights = np.array([0.5, 0.25, 0.25, 0.0])
    batches = [weighted_batch_indices(step, weights, 2, seed=3) for step in range(200)]
    assert batches == [weighted_batch_indices(step, weights, 2, seed=3) for step in range(200)]
    assert batches != [weighted_batch_indices(step, weights, 2, seed=4) for step in range(200)]
    assert all(len(set(batch)) == 2 and 3 not in batch for batch in batches)
    # One state a step: each state's share of 4,000 draws is its weight (binomial sd 0.008 for 0.5).
    draws = np.bincount([weighted_batch_indices(step, weights, 1, seed=0)[0] for step in range(4000)], minlength=4) / 4000
    assert draws == pytest.approx(weights, abs=0.03)
    with pytest.raises(ValueError, match="the 3 states of positive weight"):
        weighted_batch_indices(0, weights, 4, seed=0)
    assert check_weights([2.0, 1.0, 1.0], 3, 2) == pytest.approx([0.5, 0.25, 0.25])
    for bad, match in [([1.0, 1.0], "one per training state \\(3\\)"), ([1.0, -1.0, 1.0], "finite and >= 0"),
                       ([1.0, 0.0, 0.0], "1 states have a positive weight, fewer than the 2")]:
        with pytest.raises(ValueError, match=match):
            check_weights(bad, 3, 2)


class Recorder(LightningModule):
    """Records the manager states of each batch; takes one optimizer step per batch, as memr1's
    modules do (`memr1.lightning_loop`). weigh: handed to the data module before fitting, as the
    enumerated Manager hands it the search's taught kinds."""

    def __init__(self, weigh: Callable[[IndexedStates], np.ndarray] | None = None) -> None:
        super().__init__()
        self.weigh = weigh
        self.automatic_optimization = False
        self.weights = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(1))])
        self.seen: list[list[tuple[str, str]]] = []

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.weigh is not None:
            self.trainer.datamodule.weigh_training_states(self.weigh)

    def transfer_batch_to_device(self, batch: list[ManagerState], device: torch.device, dataloader_idx: int) -> list:
        # As memr1.modules does: states are Python objects holding bank views; Lightning's default
        # would deep-copy every dataclass in the batch.
        return batch

    def training_step(self, states: list[ManagerState], batch_idx: int) -> None:
        self.seen.append([(state.fact.dia_ids[-1], state.fact.text) for state in states])
        optimizers = self.optimizers()
        for optimizer, weight in zip(optimizers if isinstance(optimizers, list) else [optimizers], self.weights):
            optimizer.zero_grad()
            self.manual_backward((weight - 1.0).pow(2).sum())
            optimizer.step()

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [torch.optim.SGD([weight], lr=0.1) for weight in self.weights]


def fit(
    tmp_path: Path, embedder: Embedder, ckpt_path: Path | None = None, weigh: Callable[[IndexedStates], np.ndarray] | None = None
) -> list:
    """Train a Recorder for 6 batches (checkpoints every 3) and return the batches it saw."""
    data = RLStatesDataModule(
        locomo_args(), "manager", RECIPE, tmp_path, window=2, batch_size=3, seed=7, embedder=embedder,
    )
    module = Recorder(weigh)
    trainer = Trainer(
        max_steps=6,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)],
    )
    try:
        trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
        assert data.banks == {}  # closed by Lightning's teardown
    finally:
        data.teardown()  # after a failed fit too
    return module.seen


def test_resumed_training_sees_the_batches_of_an_unbroken_run(tmp_path: Path, embedder: Embedder) -> None:
    unbroken = fit(tmp_path, embedder)
    assert len(unbroken) == 6 and all(len(batch) == 3 for batch in unbroken)
    # 4 manager states in mini-1, batches of 3: one batch per pass, each pass a new permutation.
    assert unbroken[:3] != unbroken[3:]  # so that restarting from step 0 could not pass for a resume
    checkpoint = tmp_path / "ckpt" / "epoch=0-step=3.ckpt"
    assert checkpoint.is_file()
    resumed = fit(tmp_path, embedder, ckpt_path=checkpoint)
    assert resumed == unbroken[3:]


def test_states_drawn_by_weight_resume_as_they_were_drawn(tmp_path: Path, embedder: Embedder) -> None:
    never: list[tuple[str, str]] = []

    def weigh(states: IndexedStates) -> np.ndarray:
        """mini-1's 4 manager states: the first never drawn, the second 4 times as often as each other."""
        assert len(states) == 4
        never.append((states[0].fact.dia_ids[-1], states[0].fact.text))
        return np.array([0.0, 4.0, 1.0, 1.0])

    unbroken = fit(tmp_path, embedder, weigh=weigh)
    # Three states of positive weight and batches of 3: every batch holds exactly those, in drawn order.
    assert never[0] not in unbroken[0] and all(sorted(batch) == sorted(unbroken[0]) for batch in unbroken)
    assert len({tuple(batch) for batch in unbroken}) > 1  # the order is drawn anew each step
    resumed = fit(tmp_path, embedder, ckpt_path=tmp_path / "ckpt" / "epoch=0-step=3.ckpt", weigh=weigh)
    assert resumed == unbroken[3:]


def test_data_module_exposes_counts_mapping_and_validation_answer_states(
    tmp_path: Path, embedder: Embedder, conversations, caplog: pytest.LogCaptureFixture
) -> None:
    data = RLStatesDataModule(locomo_args(), "answer", RECIPE, tmp_path, k_per_speaker=2, batch_size=2,
                              val_batch_size=2, seed=3, max_steps=4, embedder=embedder)
    data.prepare_data()
    with caplog.at_level(logging.INFO, logger="memr1.progress"):
        data.setup("fit")
    # The bank build reports its progress (a bar on a terminal, log lines elsewhere), as evaluate.py's does.
    items = sum(len(memory_items(c, "observation")) for c in conversations)
    assert f"building banks: {items}/{items}" in caplog.text
    try:
        assert data.num_states == 4  # the questions of mini-1
        assert data.step_range() == range(0, 4)  # no trainer: max_steps
        batches = list(data.train_dataloader())
        assert [[s.question.qid for s in batch] for batch in batches] == [
            [f"mini-1/q{[0, 1, 3, 4][i]}" for i in data.batch_indices(step)] for step in range(4)
        ]
        val = list(data.val_dataloader())
        assert [[s.question.qid for s in batch] for batch in val] == [["mini-2/q0", "mini-2/q1"], ["mini-2/q3"]]
        assert all(len(memories) == 2 for batch in val for s in batch for memories in s.memories.values())
        assert (tmp_path / f"{RECIPE.signature()}.progress.json").is_file()
    finally:
        data.teardown("fit")
    # The manager validates on conv-30's manager states, from the same (already built) ADD-all banks.
    manager = RLStatesDataModule(locomo_args(), "manager", RECIPE, tmp_path, window=2, val_batch_size=2,
                                 max_steps=1, embedder=embedder)
    manager.setup("validate")
    try:
        val = list(manager.val_dataloader())
        assert [[s.fact.text for s in batch] for batch in val] == [
            ["Cleo moved to Lisbon.", "Dev visited Lisbon in 2019."], ["Cleo works at a bakery."]
        ]
        # mini-2's turns: D1:1, D1:2, D2:1 (a bike), D10:1: the bakery fact sees the two turns before.
        assert texts(val[0][1]) == {"Cleo moved to Lisbon."}
        assert texts(val[1][0]) == {"Dev visited Lisbon in 2019.", "Dev bought a bike."}
    finally:
        manager.teardown()
    with pytest.raises(ValueError, match="agent: 'critic' is not one of"):
        RLStatesDataModule(locomo_args(), "critic", RECIPE, tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Manager states are cut from ADD-all banks"):
        RLStatesDataModule(locomo_args(), "manager", BankRecipe("locomo", str(FIXTURE), "observation", "manager"), tmp_path)


def test_from_config_reads_the_training_config(tmp_path: Path) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        manager_cfg = compose("train", overrides=["model=manager", f"banks.dir={tmp_path}"])
        answer_cfg = compose("train", overrides=["model=answer", "banks=manager", f"banks.dir={tmp_path}", "precision=fp32"])
    manager = RLStatesDataModule.from_config(manager_cfg)
    assert (manager.agent, manager.window, manager.num_candidates, manager.k_per_speaker) == ("manager", 50, 5, 30)
    loader = manager_cfg.data_loader
    assert (manager.batch_size, manager.val_batch_size, manager.max_steps) == (
        loader.states_per_step, loader.val_batch_size, loader.max_steps
    )
    assert isinstance(manager.bank_policy, AddAllPolicy)  # the ADD-all teacher
    assert manager.banks_dir == tmp_path and manager.recipe.signature().startswith("locomo-observation-add_all-")
    answer = RLStatesDataModule.from_config(answer_cfg)
    assert answer.agent == "answer" and isinstance(answer.bank_policy, LazyPolicy)  # the model loads only if needed
    assert answer.recipe.signature().startswith("locomo-observation-manager-")
    assert answer.recipe.writer["manager"]["precision"] == "fp32"  # the run's, which the Manager decides in
    with pytest.raises(ValueError, match=r"data.kind=msc: RL states need conversations split by id .* MSC is a zero-shot test set"):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            RLStatesDataModule.from_config(compose("train", overrides=["data=msc"]))


# ---- the real file ---------------------------------------------------------------------------------


def test_conv_26_manager_states_and_skipped_turns(real_locomo: Path) -> None:
    locomo = LoCoMoDataModule(path=real_locomo)
    locomo.setup()
    states = ManagerStates(locomo.conversations("train"), lambda cid: pytest.fail("no state is built"), window=50)
    # 152 questions, 2 without evidence, 133 distinct evidence turns: 92 hold 104 facts, 41 hold none.
    assert len(states) == 104
    assert states.skipped_turns == 41


# ---- teacher trajectories on the fixture ---------------------------------------------------------------


def test_teacher_rows_for_the_fixture_conversation(conversations, teachers) -> None:
    """Checked by hand against tests/fixtures/locomo_mini.json: "What is the name of Ana's dog?" cites
    D1:1 and D1:3, whose facts are ADOPTED (D1:1) and PARK (D1:1, D1:3), both of session 1."""
    from memr1.agents.answer import AnswerAgent
    from memr1.envs.answer import AnswerEnv
    from memr1.teachers import EvidenceAnswerTeacher, RuleManagerTeacher

    answer_states = AnswerStates(conversations[:1], teachers, k_per_speaker=3)
    state = next(answer_states[i] for i in range(len(answer_states)) if answer_states[i].question.qid == "mini-1/q1")
    lines = EvidenceAnswerTeacher().target(state, AnswerEnv(AnswerAgent()).prompt(state)).splitlines()
    assert lines[0] == "**Relevant memories:**" and lines[-1] == "**Answer:** Rex"
    assert sorted(lines[1:-1]) == [f"[1:56 pm on 8 May, 2023] {ADOPTED}", f"[1:56 pm on 8 May, 2023] {PARK}"]
    # Ben's memories were retrieved too (3 per speaker) but cite no evidence turn: not copied.
    assert any(m.speaker == "Ben" for m in state.memories["Ben"])

    manager_states = ManagerStates(conversations[:1], teachers.__getitem__, window=2, num_candidates=5)
    rule = RuleManagerTeacher(duplicate_score=0.85)
    # D1:3's fact (PARK) against its window bank {ADOPTED, RUNNING}: ADOPTED is Ana's, similar but not a
    # duplicate (cosine < 0.85), so the fact is ADDed under the next temporary id, 1.
    park = manager_states[2]
    assert [(c.text, c.score < 0.85) for c in park.candidates] == [(ADOPTED, True)]
    assert rule.target(park, []) == json.dumps({"memory": [{"id": "1", "text": PARK, "event": "ADD"}]})
    # With a threshold under that similarity the same candidate counts as a duplicate: NONE on id 0.
    loose = RuleManagerTeacher(duplicate_score=park.candidates[0].score - 1e-6)
    assert loose.target(park, []) == json.dumps({"memory": [{"id": "0", "text": ADOPTED, "event": "NONE"}]})
