"""The RL environments on real Milvus Lite banks (tmp_path) and the real MiniLM embedder.

The frozen Answer Agent is either a tiny random Llama over the real SmolLM2 tokenizer (its answers are
garbage: the test checks that scoring survives them) or `MemoryReader`, a stand-in answerer written
here that answers from the memories its prompt shows, so that the rewards can be computed by hand.
About 20 s on 2 cores (the tokenizer and the embedder load once).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from memr1.agents import AnswerAgent, ManagerAgent
from memr1.embed import Embedder
from memr1.envs import (
    CREDIT_TERMS,
    MANAGER_FORMAT_PENALTY,
    REJECTED_OP,
    AnswerEnv,
    AnswerState,
    ManagerEnv,
    ManagerState,
    Reward,
    answer_reward,
    answer_rewards,
    reward_weights,
)
from memr1.llm.engines import Generation, HFEngine, Prompt
from memr1.llm.loading import load_tokenizer
from memr1.llm.sampling import SamplingConfig
from memr1.llm.testing import tiny_causal_lm
from memr1.memory import MemoryBank, MemoryView
from memr1.metrics.judge import Verdict
from memr1.types import Fact, MemoryEntry, MemoryOp, OpKind, Question

GREEDY = SamplingConfig(max_new_tokens=16, temperature=0.0)
DATE = "2:01 pm on 3 April, 2023"
DOGS = Question("q-dogs", "conv-x", "What are the names of Andrew's dogs?", "Buddy and Scout", ("D4:2",), 1)
CATS = Question("q-cats", "conv-x", "What pets does Audrey have?", "two cats", ("D4:2",), 1)
SCOUT = Fact("Andrew adopted another dog, Scout", "Andrew", ("D4:2",), 4, DATE)
MERGED = "Andrew adopted two dogs, Buddy and Scout"


# ---- rewards ---------------------------------------------------------------------------------------


def test_answer_reward_em_normalises_and_f1_counts_tokens() -> None:
    assert answer_reward("The park.", "park") == 1.0  # articles and punctuation dropped (our choice)
    assert answer_reward("park", "The Park!", "em") == 1.0
    assert answer_reward("parks", "park") == 0.0
    assert answer_reward("", "park") == 0.0
    assert answer_reward("a dog named Rex", "Rex", "f1") == pytest.approx(0.4)  # P 1/4, R 1
    assert answer_reward("Buddy and Scout", "Scout and Buddy", "f1") == 1.0  # token sets
    with pytest.raises(ValueError, match="needs a Judge"):
        answer_reward("x", "x", "judge")
    with pytest.raises(ValueError, match="unknown kind 'bleu'"):
        answer_reward("x", "x", "bleu")


def lenient_judge(questions: Sequence[str], golds: Sequence[str], answers: Sequence[str]) -> list[Verdict]:
    """A judge for the tests: CORRECT when the gold answer's words all appear in the answer; an answer
    of "???" gets an unreadable verdict."""
    verdicts = []
    for gold, answer in zip(golds, answers):
        readable = answer != "???"
        verdicts.append(Verdict(correct=readable and set(gold.split()) <= set(answer.split()), readable=readable))
    return verdicts


def test_answer_rewards_with_a_judge_scores_verdicts_and_unreadable_is_wrong() -> None:
    answers = ["it was a park", "a beach", "???"]
    scores = answer_rewards(["q1", "q2", "q3"], answers, ["park", "park", "park"], "judge", lenient_judge)
    assert scores == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="needs judge="):
        answer_rewards(["q"], ["a"], ["a"], "judge")
    with pytest.raises(ValueError, match="must align"):
        answer_rewards(["q"], ["a", "b"], ["a"], "em")


# ---- the answer environment ------------------------------------------------------------------------


def entry(memory_id: str, text: str, speaker: str) -> MemoryEntry:
    return MemoryEntry(memory_id, text, speaker, timestamp=DATE)


PARK = Question("q-park", "conv-x", "Where did Ana take Rex?", "the park", ("D1:3",), 1)
PARK_STATE = AnswerState(PARK, {"Ana": [entry("m1", "Ana took Rex to the park.", "Ana")], "Ben": []})


def test_answer_env_rewards_the_parsed_answer_and_penalises_format_errors() -> None:
    env = AnswerEnv(AnswerAgent(), format_penalty=-0.5)
    assert env.prompt(PARK_STATE) == AnswerAgent().build_messages(PARK.question, PARK_STATE.memories)
    responses = [
        "**Relevant memories:**\n- Ana took Rex to the park.\n**Answer:** The park.",
        "Ana took Rex to the park.\nPark",  # no marker: the last line is the answer, a format error
        "**Answer:** a dog park",  # no memory list: the distilling agent skipped its distillation
        "",
        "\x00{{{ ]]] **Answer:**",  # nothing after the marker
    ]
    rewards = env.score([PARK_STATE] * len(responses), responses)
    assert [r.score for r in rewards] == [1.0, 0.5, -0.5, -0.5, -0.5]
    assert [r.format_error for r in rewards] == [None, "missing_answer_marker", "missing_memory_list", "empty_output", "empty_answer"]
    assert rewards[0].info == {"em": 1.0, "f1": 1.0, "answer": "The park", "answer_words": 2.0}
    assert rewards[2].info["f1"] == pytest.approx(0.4)  # {a, dog, park} vs {the, park}: P 1/3, R 1/2
    assert rewards[2].info["em"] == 0.0


def test_answer_env_f1_and_judge_rewards() -> None:
    f1_env = AnswerEnv(AnswerAgent(), reward="f1")
    [reward] = f1_env.score([PARK_STATE], ["**Answer:** to the park"])
    # tokens {to, the, park} vs {the, park}: P 2/3, R 1, F1 0.8; the default penalty is 0.
    assert reward.score == pytest.approx(0.8)
    judge_env = AnswerEnv(AnswerAgent(), reward="judge", judge=lenient_judge)
    rewards = judge_env.score([PARK_STATE, PARK_STATE], ["**Answer:** the park by the lake", "**Answer:** home"])
    assert [r.score for r in rewards] == [1.0, 0.0]
    assert rewards[0].info["judge"] == 1.0 and rewards[0].info["em"] == 0.0


def test_answer_env_rejects_bad_configuration_and_misaligned_calls() -> None:
    with pytest.raises(ValueError, match="format_penalty: must be <= 0"):
        AnswerEnv(AnswerAgent(), format_penalty=0.1)
    with pytest.raises(ValueError, match="needs judge="):
        AnswerEnv(AnswerAgent(), reward="judge")
    with pytest.raises(ValueError, match="unknown kind 'exact'"):
        AnswerEnv(AnswerAgent(), reward="exact")
    with pytest.raises(ValueError, match="1 states but 2 responses"):
        AnswerEnv(AnswerAgent()).score([PARK_STATE], ["a", "b"])


# ---- the manager environment -----------------------------------------------------------------------


class MemoryReader:
    """A deterministic stand-in for the frozen Answer Agent's model (not the code under test).

    For a prompt asking `question`, it answers `answer` for the first (question, memory, answer) rule
    whose memory text the prompt shows, "I do not know" when none is shown. It records every call.
    """

    RULES = [
        (DOGS.question, MERGED, "Buddy and Scout"),
        (DOGS.question, "Andrew adopted a dog named Buddy", "Buddy"),
        (CATS.question, "Audrey has two cats", "two cats"),
    ]

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    records_trunk = False

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig, trunk_depth: int = 0) -> list[list[Generation]]:
        contents = [prompt[-1]["content"] for prompt in prompts]  # type: ignore[index]
        self.calls.append(contents)
        return [[Generation(self._answer(content), [1], [2], [0.0], "stop")] for content in contents]

    def _answer(self, content: str) -> str:
        for question, memory, answer in self.RULES:
            if f"Question: {question}" in content and f"] {memory}\n" in content:
                return f"**Relevant memories:**\n- {memory}\n**Answer:** {answer}"
        return "**Relevant memories:**\n**Answer:** I do not know"


@pytest.fixture
def bank(tmp_path: Path, embedder: Embedder) -> Iterator[MemoryBank]:
    with MemoryBank.open(tmp_path / "banks.db", "conv_x", embedder) as opened:
        for text, speaker, turn in [
            ("Andrew adopted a dog named Buddy", "Andrew", "D1:3"),
            ("Andrew enjoys hiking in the mountains", "Andrew", "D1:5"),
            ("Audrey has two cats", "Audrey", "D1:7"),
        ]:
            opened.apply(MemoryOp(OpKind.ADD, text, speaker=speaker, timestamp=DATE, provenance=(turn,)))
        yield opened


def scout_state(bank: MemoryView, questions: list[Question]) -> ManagerState:
    candidates = bank.search(SCOUT.text, speaker="Andrew", k=5)
    return ManagerState(SCOUT, "conv-x", ("Andrew", "Audrey"), bank, candidates, questions)


def snapshot(view: MemoryView) -> list[tuple]:
    return [(e.id, e.text, e.speaker, e.timestamp, e.provenance, e.updated_step) for e in view.entries()]


def op_json(event: str, temp_id: str = "", text: str = "") -> str:
    return f'{{"memory": [{{"id": "{temp_id}", "text": "{text}", "event": "{event}"}}]}}'


def test_manager_env_scores_a_group_on_independent_forks_in_one_answer_call(bank: MemoryBank) -> None:
    state = scout_state(bank, [DOGS, CATS])
    buddy = str([c.text for c in state.candidates].index("Andrew adopted a dog named Buddy"))
    reader = MemoryReader()
    env = ManagerEnv(ManagerAgent(), AnswerAgent(), reader, GREEDY, k_per_speaker=30)
    assert env.prompt(state) == ManagerAgent().build_messages(SCOUT, state.candidates)
    before = snapshot(bank)
    responses = [
        op_json("UPDATE", buddy, MERGED),  # the merge: both questions answered
        "I would update memory 0 with Scout.",  # no JSON: NOOP + penalty
        op_json("ADD", text=SCOUT.text),  # Buddy and Scout apart: the reader answers "Buddy"
        op_json("DELETE", buddy),  # Buddy gone: the dogs question is lost
        '{"memory": [{"id": "0", "event": "UPD',  # truncated: NOOP + penalty, same prompts as the NOOP
    ]
    rewards = env.score([state] * len(responses), responses)

    # Each score is the mean over (dogs, cats) of the EM; cats is right whatever the op.
    assert [r.score for r in rewards] == pytest.approx([1.0, 0.5 - 0.1, 0.5, 0.5, 0.5 - 0.1])
    assert [r.format_error for r in rewards] == [None, "no_json", None, None, "truncated_json"]
    assert [r.info["op"] for r in rewards] == ["UPDATE", "NOOP", "ADD", "DELETE", "NOOP"]
    assert rewards[0].info == {"op": "UPDATE", "em": 1.0, "f1": 1.0, "questions": 2.0, "answer_format_errors": 0.0}
    # f1 of "Buddy" vs "Buddy and Scout": P 1, R 1/3 -> 0.5; of "I do not know": 0. Means with cats' 1.0:
    assert [r.info["f1"] for r in rewards[1:4]] == pytest.approx([0.75, 0.75, 0.5])
    # One generate call; the two NOOPs see the same memories, so their 2 prompts are generated once.
    assert len(reader.calls) == 1 and len(reader.calls[0]) == 2 * len(responses) - 2
    # The forks were independent: the ADD's prompt still shows Buddy, the UPDATE's the merged memory only.
    dogs_prompts = [content for content in reader.calls[0] if DOGS.question in content]
    assert sum(MERGED in p for p in dogs_prompts) == 1
    assert sum("Andrew adopted another dog, Scout" in p for p in dogs_prompts) == 1
    assert sum("named Buddy" in p for p in dogs_prompts) == 2  # the ADD and the (shared) NOOP
    assert snapshot(bank) == before and bank.step == 3


def test_counterfactual_credit_scores_each_operation_against_the_same_state_under_noop(bank: MemoryBank) -> None:
    state = scout_state(bank, [DOGS, CATS])
    buddy = str([c.text for c in state.candidates].index("Andrew adopted a dog named Buddy"))
    reader = MemoryReader()
    env = ManagerEnv(ManagerAgent(), AnswerAgent(), reader, GREEDY, k_per_speaker=30, credit="counterfactual")
    responses = [op_json("UPDATE", buddy, MERGED), "no JSON here", op_json("ADD", text=SCOUT.text), op_json("DELETE", buddy)]
    rewards = env.score([state] * len(responses), responses)
    # Under NOOP the reader answers "Buddy" (EM 0) and "two cats" (EM 1): the NOOP score is 0.5. The
    # outcome scores are 1.0, 0.5 - 0.1, 0.5, 0.5 (see the test above); each minus 0.5:
    assert [r.score for r in rewards] == pytest.approx([0.5, -0.1, 0.0, 0.0])
    assert {r.terms["noop"] for r in rewards} == {0.5}
    # The terms, weighed in one place: the answers' score, minus the NOOP score, plus the penalty.
    assert rewards[1].terms == {"answer": 0.5, "noop": 0.5, "malformed": 1.0}
    assert rewards[1].weights == reward_weights(-0.1, "counterfactual") == {"answer": 1.0, "noop": -1.0, "malformed": -0.1}
    # What validation compares runs of either credit on: the outcome, the credit's term left out.
    assert [r.score_without(*CREDIT_TERMS) for r in rewards] == pytest.approx([1.0, 0.4, 0.5, 0.5])
    # The NOOP baseline is the malformed response's own prompts: no extra answer was generated.
    assert len(reader.calls) == 1 and len(reader.calls[0]) == 2 * len(responses)
    # Cached per state: scoring the same state again asks only for the new response's answers.
    [again] = env.score([state], [op_json("UPDATE", buddy, MERGED)])
    assert again.score == pytest.approx(0.5) and len(reader.calls[1]) == 2
    # A group with no NOOP of its own pays one more prompt per question for the baseline.
    fresh = ManagerEnv(ManagerAgent(), AnswerAgent(), MemoryReader(), GREEDY, k_per_speaker=30, credit="counterfactual")
    [added] = fresh.score([state], [op_json("ADD", text=SCOUT.text)])
    assert added.score == pytest.approx(0.0) and len(fresh.answer_engine.calls[0]) == 4
    with pytest.raises(ValueError, match="credit: 'noop' is not one of"):
        ManagerEnv(ManagerAgent(), AnswerAgent(), MemoryReader(), GREEDY, k_per_speaker=5, credit="noop")


def test_manager_env_rejected_op_is_a_noop_with_the_penalty(bank: MemoryBank) -> None:
    state = scout_state(bank, [DOGS])
    # the model's own text, which the bank refuses (with add_text="fact" an ADD stores the fact)
    env = ManagerEnv(ManagerAgent(add_text="model"), AnswerAgent(), MemoryReader(), GREEDY, k_per_speaker=5)
    too_long = "dog " * 20_000  # 80 000 bytes, over the bank's 65 535-byte text limit
    lone_surrogate = "Scout \ud800"  # parses (JSON allows the escape) but is no valid Unicode
    rewards = env.score([state, state], [op_json("ADD", text=too_long), op_json("ADD", text=lone_surrogate)])
    assert [r.format_error for r in rewards] == [REJECTED_OP, REJECTED_OP]
    assert [r.info["op"] for r in rewards] == ["NOOP", "NOOP"]
    # Applied as NOOPs: the reader answers "Buddy" from the bank as it was.
    assert [r.score for r in rewards] == pytest.approx([MANAGER_FORMAT_PENALTY] * 2)
    assert len(bank) == 3


def test_manager_env_aggregates_per_state_across_states_with_different_question_counts(bank: MemoryBank) -> None:
    two = scout_state(bank, [DOGS, CATS])
    one = scout_state(bank, [CATS])
    buddy = str([c.text for c in two.candidates].index("Andrew adopted a dog named Buddy"))
    env = ManagerEnv(ManagerAgent(), AnswerAgent(), MemoryReader(), GREEDY, k_per_speaker=30, reward="f1")
    none = op_json("NONE", "0", "")
    rewards = env.score([two, two, one, one], [op_json("UPDATE", buddy, MERGED), none, none, "??"])
    assert [r.info["questions"] for r in rewards] == [2.0, 2.0, 1.0, 1.0]
    # f1 reward: UPDATE (1 + 1) / 2; NONE (0.5 + 1) / 2; the cats state: 1; 1 - 0.1 for the malformed one.
    assert [r.score for r in rewards] == pytest.approx([1.0, 0.75, 1.0, 0.9])
    assert [r.format_error for r in rewards] == [None, None, None, "no_json"]


def test_manager_env_survives_a_random_model_as_answerer(bank: MemoryBank) -> None:
    tokenizer = load_tokenizer("embedded:smollm2-135m-instruct")
    engine = HFEngine(tiny_causal_lm(tokenizer), tokenizer, batch_size=8)
    state = scout_state(bank, [DOGS, CATS])
    env = ManagerEnv(ManagerAgent(), AnswerAgent(), engine, GREEDY, k_per_speaker=30)
    rewards = env.score([state, state], [op_json("UPDATE", "0", MERGED), "\ufffd\x00garbage"])
    assert all(isinstance(r, Reward) for r in rewards)
    # Garbage answers match nothing; every answer misses its marker (a format error of the answerer).
    assert [r.score for r in rewards] == pytest.approx([0.0, MANAGER_FORMAT_PENALTY])
    assert [r.info["answer_format_errors"] for r in rewards] == [2.0, 2.0]
    assert len(bank) == 3


def test_manager_env_and_state_reject_bad_configuration(bank: MemoryBank) -> None:
    with pytest.raises(ValueError, match="questions is empty"):
        scout_state(bank, [])
    with pytest.raises(ValueError, match="answer_sampling.n"):
        ManagerEnv(ManagerAgent(), AnswerAgent(), MemoryReader(), SamplingConfig(n=2), k_per_speaker=5)
    with pytest.raises(ValueError, match="k_per_speaker: must be >= 1"):
        ManagerEnv(ManagerAgent(), AnswerAgent(), MemoryReader(), GREEDY, k_per_speaker=0)
    with pytest.raises(ValueError, match="needs judge="):
        ManagerEnv(ManagerAgent(), AnswerAgent(), MemoryReader(), GREEDY, k_per_speaker=5, reward="judge")


def test_a_reward_is_the_weighted_sum_of_its_terms_in_order() -> None:
    reward = Reward({"answer": 0.75, "malformed": 1.0}, {"answer": 1.0, "malformed": -0.25})
    assert reward.score == 0.5 and reward.score_without("malformed") == 0.75
    shaped = reward.with_term("overlong", -0.2, 1.0)
    assert shaped.score == pytest.approx(0.3) and list(shaped.terms) == ["answer", "malformed", "overlong"]
    assert Reward({"answer": 1.0, "judge": 1.0}, {"answer": 1.0}).score == 1.0  # a term without a weight counts 0
    assert Reward.of(0.25).score == 0.25 and Reward.of(0.25).terms == {"answer": 0.25}
    with pytest.raises(ValueError, match="reward term 'overlong' is set already"):
        shaped.with_term("overlong", -0.1, 1.0)
    with pytest.raises(ValueError, match="format_penalty: must be <= 0"):
        reward_weights(0.1)
