"""The Answer Agent's environment: a question with its retrieved memories; reward = the answer's EM."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memr1.agents.answer import AnswerAgent
from memr1.envs.base import Reward, check_aligned
from memr1.envs.rewards import answer_reward, answer_rewards, check_reward, reward_weights
from memr1.metrics.judge import Judge
from memr1.types import MemoryEntry, Question


@dataclass(frozen=True)
class AnswerState:
    """A question and the memories retrieved for it, per speaker, best first (the paper: 30 each)."""

    question: Question
    memories: dict[str, list[MemoryEntry]]


class AnswerEnv:
    """Scores the Answer Agent: parse the response, reward its answer against the gold one.

    `format_penalty` (<= 0) is added when the parser reports a format error (no `**Answer:**` marker,
    empty answer). The default 0 is the paper's setting, which has no format reward: a malformed
    response is still scored on the answer the parser recovers.
    """

    def __init__(
        self, agent: AnswerAgent, reward: str = "em", format_penalty: float = 0.0, judge: Judge | None = None
    ) -> None:
        check_reward(reward, judge)
        self.weights = reward_weights(format_penalty)
        self.agent = agent
        self.reward = reward
        self.judge = judge

    def prompt(self, state: AnswerState) -> list[dict[str, str]]:
        return self.agent.build_messages(state.question.question, state.memories)

    def score(self, states: Sequence[AnswerState], responses: Sequence[str]) -> list[Reward]:
        check_aligned(states, responses)
        parses = [self.agent.parse(response) for response in responses]
        golds = [state.question.answer for state in states]
        answers = [parse.answer for parse in parses]
        scores = answer_rewards([state.question.question for state in states], answers, golds, self.reward, self.judge)
        rewards = []
        for parse, gold, score in zip(parses, golds, scores):
            info: dict[str, float | str] = {
                "em": answer_reward(parse.answer, gold, "em"),
                "f1": answer_reward(parse.answer, gold, "f1"),
                "answer": parse.answer,
                "answer_words": float(len(parse.answer.split())),  # the agent must answer in a few words
            }
            if self.reward == "judge":
                info["judge"] = score
            terms = {"answer": score, "malformed": float(parse.format_error is not None)}
            rewards.append(Reward(terms, self.weights, parse.format_error, info))
        return rewards
