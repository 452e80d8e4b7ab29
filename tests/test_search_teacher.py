"""The search teacher (memr1/search_teacher.py) on real Milvus Lite banks and the real MiniLM embedder,
through the real `ManagerEnv`. The frozen answerer is `RuleReader`, a stand-in written here that answers
from the memories its prompt shows, so that every option's F1 and the teacher's choice are computed by
hand: ADD leaves Buddy and Scout in two memories (the reader names only Buddy), a MERGE into Buddy's
memory names both."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from torch.utils.data import DataLoader

from memr1.agents import AnswerAgent, ManagerAgent
from memr1.embed import Embedder
from memr1.envs import ManagerEnv, ManagerState
from memr1.llm.engines import Generation, Prompt, encode_prompts
from memr1.llm.loading import load_tokenizer
from memr1.llm.testing import tiny_causal_lm
from memr1.llm.sampling import SamplingConfig
from memr1.memory import MemoryBank
from memr1.modules.enumerated import ManagerEnumeratedModule
from memr1.rl import core
from memr1.rl.algorithms import AlgoConfig
from memr1.banks.build import build_banks
from memr1.search_teacher import OraclePolicy, SearchManagerTeacher, label, options
from memr1.teachers import TeacherTrajectories
from memr1.types import Conversation, Fact, MemoryOp, OpKind, Question, Session, Turn

DATE = "2:01 pm on 3 April, 2023"
DOGS = Question("q-dogs", "conv-x", "What are the names of Andrew's dogs?", "Buddy and Scout", ("D4:2",), 1)
HIKES = Question("q-hikes", "conv-x", "Where does Andrew hike?", "the Alps", ("D4:2",), 1)
SCOUT = Fact("Andrew adopted another dog, Scout", "Andrew", ("D4:2",), 4, DATE)
BUDDY = "Andrew adopted a dog named Buddy"
STALE = "Andrew hikes in the Rockies"


class RuleReader:
    """Answers the dogs question "Buddy and Scout" when one memory names both, "Buddy" when one names
    Buddy; the hikes question "I do not know" when a memory about Scout is shown (a distracted reader),
    else "the Rockies" when the stale Rockies memory is, else "the Alps". `noisy`: a full stop at the
    end of Scout's memory leaves it answering the dogs question "I do not know"."""

    records_trunk = False

    def __init__(self, noisy: bool = False) -> None:
        self.noisy = noisy

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig, trunk_depth: int = 0) -> list[list[Generation]]:
        return [[Generation(f"**Answer:** {self._answer(prompt[-1]['content'])}", [1], [2], [0.0], "stop")] for prompt in prompts]

    def _answer(self, content: str) -> str:
        lines = [line.split("] ", 1)[1] for line in content.splitlines() if line.startswith("[")]
        if "Andrew's dogs" in content:
            if self.noisy and f"{SCOUT.text}." in lines:
                return "I do not know"
            if any("Buddy" in line and "Scout" in line for line in lines):
                return "Buddy and Scout"
            return "Buddy" if any("Buddy" in line for line in lines) else "I do not know"
        if any("Scout" in line for line in lines):
            return "I do not know"
        return "the Rockies" if any("Rockies" in line for line in lines) else "the Alps"


@pytest.fixture
def bank(tmp_path: Path, embedder: Embedder) -> Iterator[MemoryBank]:
    with MemoryBank.open(tmp_path / "banks.db", "conv_x", embedder) as opened:
        for text, turn in [(BUDDY, "D1:3"), (STALE, "D1:5")]:
            opened.apply(MemoryOp(OpKind.ADD, text, speaker="Andrew", timestamp=DATE, provenance=(turn,)))
        yield opened


def teacher(reader: RuleReader, **kwargs: float | str) -> SearchManagerTeacher:
    def env(add_text: str) -> ManagerEnv:
        return ManagerEnv(ManagerAgent(add_text), AnswerAgent(distill=False), reader, SamplingConfig(max_new_tokens=8, temperature=0.0),
                          k_per_speaker=5, reward="f1")
    return SearchManagerTeacher(env("fact"), env("model"), answerer="rule-reader", **kwargs)


def state(bank: MemoryBank, questions: list[Question]) -> ManagerState:
    return ManagerState(SCOUT, "conv-x", ("Andrew", "Audrey"), bank, bank.search(SCOUT.text, speaker="Andrew", k=5), questions)


def test_every_operation_of_every_candidate_is_an_option(bank):
    found = options(state(bank, [DOGS]))
    assert [(o.operation, o.target) for o in found] == [
        ("NONE", None), ("ADD", None), ("MERGE", "0"), ("REPLACE", "0"), ("DELETE", "0"), ("MERGE", "1"), ("REPLACE", "1"), ("DELETE", "1"),
    ]
    for option in found:  # each parses as the Manager's own reply would
        op = ManagerAgent().parse(option.reply, SCOUT, state(bank, [DOGS]).candidates)
        assert op.format_error is None and op.kind.value == {"NONE": "NOOP", "MERGE": "UPDATE", "REPLACE": "UPDATE"}.get(option.operation, option.operation)


def test_a_merge_that_answers_better_than_add_by_more_than_the_margin_is_taught(bank):
    dogs = state(bank, [DOGS])
    buddy = str([c.text for c in dogs.candidates].index(BUDDY))
    choice = teacher(RuleReader()).choose(dogs)
    # F1 by hand: ADD -> "Buddy" vs "Buddy and Scout": P 1, R 1/3 -> 0.5; MERGE into Buddy -> 1.0.
    assert choice.add_score == pytest.approx(0.5) and choice.noise == 0.0 and choice.margin == pytest.approx(0.1)
    assert (choice.option.operation, choice.option.target) == ("MERGE", buddy)
    assert choice.scores[f"MERGE:{buddy}"] == pytest.approx(1.0) and choice.scores[f"DELETE:{buddy}"] == 0.0


def test_an_option_that_drops_the_fact_must_earn_drop_factor_times_the_margin(bank):
    hikes = state(bank, [HIKES])
    stale = str([c.text for c in hikes.candidates].index(STALE))
    # F1 by hand against "the Alps": ADD shows Scout -> "I do not know" 0; NONE shows the Rockies ->
    # "the Rockies" 1/2; DELETE of the stale memory -> "the Alps" 1.0; every option storing Scout -> 0.
    choice = teacher(RuleReader(), min_margin=0.3, drop_factor=2.0).choose(hikes)
    assert choice.add_score == 0.0 and choice.scores["NONE"] == pytest.approx(0.5) and choice.scores[f"DELETE:{stale}"] == 1.0
    assert all(score == 0.0 for name, score in choice.scores.items() if name.startswith(("MERGE", "REPLACE")))
    # NONE's +0.5 falls short of 2 x 0.3; the DELETE's +1.0 clears it.
    assert (choice.option.operation, choice.option.target) == ("DELETE", stale)
    # Asked to earn 4 x 0.3, neither does: the fact is ADDed.
    assert teacher(RuleReader(), min_margin=0.3, drop_factor=4.0).choose(hikes).option.operation == "ADD"


def test_the_answerers_own_variation_widens_the_margin(bank):
    # The noisy reader loses the dogs answer when Scout's memory ends in a full stop: the same fact,
    # scored 0 where ADD scores 0.5. The margin becomes 0.5, and the MERGE's 1.0 no longer clears it.
    choice = teacher(RuleReader(noisy=True)).choose(state(bank, [DOGS]))
    assert choice.noise == pytest.approx(0.5) and choice.margin == pytest.approx(0.5)
    assert max(choice.scores.values()) == pytest.approx(1.0) and choice.option.operation == "ADD"


def test_targets_and_their_scores_are_cached_and_read_back(bank, tmp_path):
    dogs = state(bank, [DOGS])
    search = teacher(RuleReader())
    cache = TeacherTrajectories(search, tmp_path / "manager-search.jsonl")
    prompt = ManagerAgent().build_messages(SCOUT, dogs.candidates)
    (target,) = cache.targets([dogs], [prompt])
    assert json.loads(target)["memory"][0]["event"] == "UPDATE"
    (row,) = [json.loads(line) for line in (tmp_path / "manager-search.jsonl").read_text().splitlines()]
    assert row["teacher"] == search.name and row["details"]["operation"] == "MERGE" and row["details"]["add"] == pytest.approx(0.5)
    assert TeacherTrajectories(search, tmp_path / "manager-search.jsonl").targets([dogs], [prompt]) == [target]
    # States judged by more questions score the same prompt otherwise: another name, whose cache reads
    # none of these rows.
    guarded = teacher(RuleReader(), questions="fact_and_candidates")
    assert guarded.name != search.name and len(TeacherTrajectories(guarded, tmp_path / "manager-search.jsonl")) == 0


class CountingReader(RuleReader):
    """The rule reader, counting the answers it gives (a cached score asks it nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = 0

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig, trunk_depth: int = 0) -> list[list[Generation]]:
        self.answered += len(prompts)
        return super().generate(prompts, sampling, trunk_depth)


# With change_margin 1 the rewards are the search's rule's: a merge that beats ADD by 0.5 is worth less
# than ADD where the margin is 0.6, as the search would teach ADD; the margin alone changes nothing.
@pytest.mark.parametrize(("objective", "min_margin", "change_margin", "winner"), [
    ("expected", 0.1, 0.0, "merge"), ("projection", 0.1, 0.0, "merge"), ("projection", 0.6, 0.0, "merge"), ("projection", 0.6, 1.0, "ADD"),
    ("listwise", 0.1, 0.0, "merge"), ("listwise", 0.6, 1.0, "ADD"),
])
def test_the_enumerated_gradient_makes_the_operation_its_rewards_favour_a_tiny_managers_likeliest_reply(
    bank, tmp_path, objective, min_margin, change_margin, winner
):
    dogs = state(bank, [DOGS])
    merge = f"MERGE:{[c.text for c in dogs.candidates].index(BUDDY)}"
    reader = CountingReader()
    search = teacher(reader, min_margin=min_margin)
    tokenizer = load_tokenizer("embedded:smollm2-135m-instruct")
    # The random model's replies differ by hundreds of nats (mostly their lengths): flattened by T = 300
    # every operation gets a share of the push (`core.enumerated_objective`). The projection's target
    # (`core.enumerated_projection`, beta 0.1) weighs the merge's 0.5 over ADD at 5 nats against the
    # reference's ~1 (355 / 300): the merge takes most of it.
    algo = AlgoConfig(name="enumerated", actor_lr=3e-3, kl_coef=0.0, operation_temperature=300.0, operation_objective=objective,
                      change_margin=change_margin)
    module = ManagerEnumeratedModule(tiny_causal_lm(tokenizer), tokenizer, search.env, algo, max_new_tokens=96,
                                     reference=tiny_causal_lm(tokenizer) if objective != "expected" else None,
                                     trajectories=TeacherTrajectories(search, tmp_path / "manager-search.jsonl"))
    (prompt_ids,) = encode_prompts(tokenizer, [search.env.prompt(dogs)])
    (scores,) = [details["scores"] for details in module.trajectories.details([dogs], [search.env.prompt(dogs)])]
    answered_by_the_search = reader.answered

    def policy_over_operations() -> tuple[dict[str, float], float]:
        """log pi of each operation's reply, and E_q[R], under the current policy."""
        found, batch = module._operations(dogs, prompt_ids, scores)
        with torch.no_grad():
            logprobs = module._sequence_logprobs(module.policy, batch)
        expected = core.enumerated_objective(logprobs, batch.scores, temperature=algo.operation_temperature).expected_reward
        return dict(zip([label(option) for option in found], logprobs.tolist())), float(expected)

    before, reward_before = policy_over_operations()
    trainer = Trainer(accelerator="cpu", max_steps=10, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    trainer.fit(module, train_dataloaders=DataLoader([dogs], batch_size=1, collate_fn=list))
    after, reward_after = policy_over_operations()
    # F1 by hand as above: the merge 1.0, ADD 0.5. The random policy gives the merge less than ADD (by
    # 355 nats); ten steps make it the likeliest of the eight replies, or, where the search's margin
    # (0.6 over ADD's 0.5) is charged, leave it below ADD and widen the gap.
    assert before[merge] < before["ADD"]
    if winner == "merge":
        assert max(after, key=after.get) == merge and reward_after > reward_before
    else:
        assert max(after, key=after.get) == "ADD" and after["ADD"] - after[merge] > before["ADD"] - before[merge]
    assert reader.answered == answered_by_the_search  # every step read the search's scores, asked nothing
    metrics = module.last_step.metrics
    assert sum(metrics[f"ops/{kind}_frac"] for kind in ("add", "update", "delete", "noop")) == pytest.approx(1.0)
    assert metrics["enum/states_with_spread"] == 1.0 and metrics["enum/too_long_frac"] == 0.0
    assert metrics["reward/best_mean"] == pytest.approx(1.0) and metrics["reward/add_mean"] == pytest.approx(0.5)


def test_the_oracle_builds_a_bank_with_the_search_of_the_questions_it_is_scored_on(tmp_path, embedder):
    """banks=oracle: the fact the dogs question cites is merged into Buddy's memory (the search's choice,
    by hand above); the facts no question cites are ADDed without a search. A second conversation that
    says the same facts but asks nothing is all ADDs: each fact is decided with its own conversation's
    questions."""
    said = [(BUDDY, "D1:3"), (STALE, "D1:5"), ("Audrey had pasta for lunch", "D2:1")]
    facts = [Fact(text, "Audrey" if "Audrey" in text else "Andrew", (turn,), int(turn[1]), DATE) for text, turn in said] + [SCOUT]
    turns = [Turn(f.dia_ids[0], f.speaker, f.text, f.session, DATE) for f in facts]
    sessions = tuple(Session(index, DATE, tuple(t for t in turns if t.session == index)) for index in (1, 2, 4))
    conversation = Conversation("conv-x", "Andrew", "Audrey", sessions, tuple(facts), (DOGS,))
    silent_twin = Conversation("conv-y", "Andrew", "Audrey", sessions, tuple(facts), ())
    oracle = OraclePolicy(teacher(RuleReader()), [conversation, silent_twin], num_candidates=5)
    with MemoryBank.open(tmp_path / "oracle.db", "conv_x", embedder) as bank, MemoryBank.open(tmp_path / "twin.db", "conv_y", embedder) as twin:
        build_banks({"conv-x": facts, "conv-y": facts}, {"conv-x": bank, "conv-y": twin}, oracle, tmp_path / "oracle.progress.json")
        assert dict(bank.revision_counts()) == {"ADD": 3, "UPDATE": 1}
        assert sorted(memory.text for memory in bank.entries()) == sorted(
            ["Andrew adopted a dog named Buddy; Andrew adopted another dog, Scout", STALE, "Audrey had pasta for lunch"]
        )
        assert dict(twin.revision_counts()) == {"ADD": 4}
    stranger = Fact("Someone else's fact", "Andrew", ("D9:1",), 9, DATE)
    with pytest.raises(ValueError, match="is not a fact of the conversation 'conv-x'"):
        oracle.decide(["conv-x"], [stranger], [[]], [bank])
    with pytest.raises(ValueError, match="the conversation 'conv-z' is not one of those"):
        oracle.decide(["conv-z"], [facts[2]], [[]], [bank])


def test_states_are_weighed_by_the_kind_of_operation_the_search_teaches_there(bank, tmp_path):
    """algo.taught_sampling_alpha: the dogs state is taught a MERGE (an UPDATE), the hikes state a DELETE
    (both by hand above); at alpha 0 each kind gets half the draws, shared by its states."""
    dogs = state(bank, [DOGS])
    # The cache is keyed by the Manager's prompt, which shows no question: the hikes state lists its
    # candidates in the other order, so that it is a prompt of its own.
    hikes = dataclasses.replace(dogs, candidates=dogs.candidates[::-1], questions=[HIKES])
    search = teacher(RuleReader())
    tokenizer = load_tokenizer("embedded:smollm2-135m-instruct")
    algo = AlgoConfig(name="enumerated", kl_coef=0.0, operation_objective="projection", taught_sampling_alpha=0.0)
    module = ManagerEnumeratedModule(tiny_causal_lm(tokenizer), tokenizer, search.env, algo, max_new_tokens=96,
                                     reference=tiny_causal_lm(tokenizer),
                                     trajectories=TeacherTrajectories(search, tmp_path / "manager-search.jsonl"))
    assert module.taught_kind_weights([dogs, hikes, dogs]) == pytest.approx([0.25, 0.5, 0.25])
    # A data module that cannot draw by weight is refused before the first step, not trained uniformly.
    trainer = Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    with pytest.raises(ValueError, match="algo.taught_sampling_alpha=0.0: the data module .* cannot draw its training states by weight"):
        trainer.fit(module, train_dataloaders=DataLoader([dogs], batch_size=1, collate_fn=list))
