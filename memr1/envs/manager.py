"""The Memory Manager's environment: apply the chosen operation to a copy of the bank, let the frozen
Answer Agent answer the questions that depend on the fact's turn, reward = their mean EM.

There are no operation labels (as in the paper): an operation is good when the answers it leads to are
right. Every response gets its own copy-on-write fork of the state's bank, so the G responses of a
GRPO group are scored independently and the bank itself never changes.

Counterfactual credit (`credit="counterfactual"`, memr1's, for a limit the paper names): the reward is
the answers' score minus the score of the same state under NOOP, so an operation is credited for what it
changed, not for what the bank already answered. The NOOP score costs one more frozen-answerer prompt
per question of a state (none when a sampled response is itself a NOOP) and is cached per state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memr1.agents.answer import AnswerAgent
from memr1.agents.manager import ManagerAgent
from memr1.envs.base import Reward, check_aligned
from memr1.envs.rewards import answer_reward, answer_rewards, check_reward, reward_weights
from memr1.llm.engines import GenerationEngine, Prompt
from memr1.llm.sampling import SamplingConfig
from memr1.memory import BankFork, InvalidOpError, MemoryView
from memr1.metrics.judge import Judge
from memr1.memory.retrieval import retrieve_memories
from memr1.types import Fact, MemoryEntry, OpKind, Question

# The format error of a well-formed operation that the bank refused (e.g. a text over Milvus' limit).
REJECTED_OP = "rejected_op"
# Default penalty for a malformed or rejected operation, see ManagerEnv.
MANAGER_FORMAT_PENALTY = -0.1


@dataclass(frozen=True, eq=False)
class ManagerState:
    """One fact arriving at its turn, and what the Manager sees and is judged on.

    bank: the memories as they stood before the fact's turn (a view the environment only forks).
    candidates: the k memories of the fact's speaker in `bank` most similar to the fact (k = 5), shown
        to the Manager with temporary ids 0..k-1.
    questions: the training questions whose evidence includes the fact's turn; the reward averages
        over them, so there must be at least one.
    """

    fact: Fact
    conversation_id: str
    speakers: tuple[str, str]
    bank: MemoryView
    candidates: list[MemoryEntry]
    questions: list[Question]

    def __post_init__(self) -> None:
        if not self.questions:
            raise ValueError(
                f"ManagerState {self.conversation_id} {self.fact.dia_ids}: questions is empty; the reward "
                "averages over the questions whose evidence is the fact's turn"
            )


@dataclass(frozen=True)
class _Applied:
    """A response's operation after parsing and applying it to its own fork."""

    kind: OpKind  # NOOP when malformed or rejected
    format_error: str | None
    fork: BankFork


class ManagerEnv:
    """Scores Memory Manager responses through a frozen Answer Agent.

    answer_engine / answer_sampling: the frozen Answer Agent's model and its (greedy) decoding; all the
        answer prompts of one `score` call go to it in one `generate` call. With greedy decoding,
        identical prompts (a NOOP and a malformed response see the same memories) are generated once.
    k_per_speaker: memories retrieved per speaker for each question (the paper: 30).
    reward: "em" (the paper), "f1" or "judge" (needs `judge`), see `memr1.envs.rewards`.
    format_penalty: added to the reward of a response that does not parse or whose operation the bank
        rejects (both are applied as NOOP). The default -0.1 is our choice; the paper has no format
        reward. A malformed response would otherwise earn exactly what a deliberate NONE earns, and in a
        GRPO group whose answers all score alike (the bank already answers the question, or nothing
        could) every advantage is zero: the penalty is then the only signal towards well-formed JSON. At
        a tenth of one correct answer it never outweighs answering right.
    credit: "outcome" (the paper: the answers' score) or "counterfactual" (minus the state's NOOP score,
        the reward's term "noop": `memr1.envs.rewards.reward_weights`). A constant per state, the NOOP
        score cancels in GRPO's group-normalised advantage: pair it with `algo=reinforce`, where it is
        the baseline. The environment measures the NOOP score only when the credit weighs it.
    """

    def __init__(
        self,
        manager_agent: ManagerAgent,
        answer_agent: AnswerAgent,
        answer_engine: GenerationEngine,
        answer_sampling: SamplingConfig,
        k_per_speaker: int,
        reward: str = "em",
        format_penalty: float = MANAGER_FORMAT_PENALTY,
        judge: Judge | None = None,
        credit: str = "outcome",
    ) -> None:
        check_reward(reward, judge)
        self.weights = reward_weights(format_penalty, credit)
        if k_per_speaker < 1:
            raise ValueError(f"k_per_speaker: must be >= 1, got {k_per_speaker}")
        if answer_sampling.n != 1:
            raise ValueError(
                f"answer_sampling.n: the frozen Answer Agent answers once per prompt, got n={answer_sampling.n}"
            )
        self.manager_agent = manager_agent
        self.answer_agent = answer_agent
        self.answer_engine = answer_engine
        self.answer_sampling = answer_sampling
        self.k_per_speaker = k_per_speaker
        self.reward = reward
        self.format_penalty = format_penalty
        self.judge = judge
        self.credit = credit
        self._noop_scores: dict[tuple, float] = {}  # state key -> NOOP score (greedy answers: deterministic)

    def variant(self, manager_agent: ManagerAgent, credit: str) -> ManagerEnv:
        """The same answerer, reward, penalty and judge, with another Manager agent and credit."""
        return ManagerEnv(
            manager_agent, self.answer_agent, self.answer_engine, self.answer_sampling, self.k_per_speaker,
            self.reward, self.format_penalty, self.judge, credit,
        )

    def prompt(self, state: ManagerState) -> list[dict[str, str]]:
        return self.manager_agent.build_messages(state.fact, state.candidates)

    def score(self, states: Sequence[ManagerState], responses: Sequence[str]) -> list[Reward]:
        check_aligned(states, responses)
        applied = [self._apply(state, response) for state, response in zip(states, responses)]
        # The states whose NOOP score is not known yet are answered in the same call, on unchanged forks.
        baselines: dict[tuple, ManagerState] = {}
        if "noop" in self.weights:
            for state in states:
                key = _state_key(state)
                if key not in self._noop_scores:
                    baselines.setdefault(key, state)
        forks = [(state, outcome.fork) for state, outcome in zip(states, applied)]
        forks += [(state, state.bank.fork()) for state in baselines.values()]
        # One row per (fork, question): row r asks asked[r] on fork owner[r].
        owner: list[int] = []
        asked: list[Question] = []
        prompts: list[Prompt] = []
        for index, (state, fork) in enumerate(forks):
            for question in state.questions:
                memories = retrieve_memories(fork, question.question, state.speakers, self.k_per_speaker)
                prompts.append(self.answer_agent.build_messages(question.question, memories))
                asked.append(question)
                owner.append(index)
        parses = [self.answer_agent.parse(text) for text in self._answer(prompts)]
        answers = [parse.answer for parse in parses]
        golds = [question.answer for question in asked]
        scores = answer_rewards([question.question for question in asked], answers, golds, self.reward, self.judge)

        rows: list[list[int]] = [[] for _ in forks]
        for row, index in enumerate(owner):
            rows[index].append(row)
        means = [sum(scores[row] for row in own) / len(own) for own in rows]
        noop = dict(zip(baselines, means[len(states):]))
        if self.answer_sampling.greedy:
            self._noop_scores.update(noop)
        rewards = []
        for state, outcome, own, mean_score in zip(states, applied, rows, means):
            info: dict[str, float | str] = {
                "op": outcome.kind.value,
                "em": sum(answer_reward(answers[row], golds[row], "em") for row in own) / len(own),
                "f1": sum(answer_reward(answers[row], golds[row], "f1") for row in own) / len(own),
                "questions": float(len(own)),
                "answer_format_errors": float(sum(parses[row].format_error is not None for row in own)),
            }
            if self.reward == "judge":
                info["judge"] = mean_score
            terms = {"answer": mean_score}
            if "noop" in self.weights:
                key = _state_key(state)
                terms["noop"] = noop[key] if key in noop else self._noop_scores[key]
            terms["malformed"] = float(outcome.format_error is not None)
            rewards.append(Reward(terms, self.weights, outcome.format_error, info))
        return rewards

    def _apply(self, state: ManagerState, response: str) -> _Applied:
        """Parse `response` and apply its operation to a fresh fork of the state's bank."""
        op = self.manager_agent.parse(response, state.fact, state.candidates)
        fork = state.bank.fork()
        if op.format_error is not None:
            return _Applied(OpKind.NOOP, op.format_error, fork)
        try:
            fork.apply(op)
        except InvalidOpError:  # a refused write changes nothing: the fork is still the state's bank
            return _Applied(OpKind.NOOP, REJECTED_OP, fork)
        return _Applied(op.kind, None, fork)

    def _answer(self, prompts: list[Prompt]) -> list[str]:
        """The frozen Answer Agent's text for each prompt, from one `generate` call."""
        if not prompts:
            return []
        slot: dict[object, int] = {}  # prompt key -> position among the prompts actually generated
        unique: list[Prompt] = []
        keys: list[object] = []
        for position, prompt in enumerate(prompts):
            # Greedy decoding answers equal prompts equally: generate each once. Sampling must not
            # share one draw between them.
            key = _prompt_key(prompt) if self.answer_sampling.greedy else position
            if key not in slot:
                slot[key] = len(unique)
                unique.append(prompt)
            keys.append(key)
        outputs = self.answer_engine.generate(unique, self.answer_sampling)
        return [outputs[slot[key]][0].text for key in keys]


def _prompt_key(prompt: Prompt) -> object:
    if isinstance(prompt, str):
        return prompt
    return tuple((message["role"], message["content"]) for message in prompt)


def _state_key(state: ManagerState) -> tuple:
    """What a state's NOOP score depends on: its fact (hence its window bank) and its questions."""
    return (state.conversation_id, state.fact.dia_ids, state.fact.text, tuple(q.qid for q in state.questions))
