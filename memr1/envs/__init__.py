"""The RL environments: prompts for the policy and rewards for its responses."""

from memr1.envs.answer import AnswerEnv, AnswerState
from memr1.envs.base import Environment, Reward
from memr1.envs.manager import MANAGER_FORMAT_PENALTY, REJECTED_OP, ManagerEnv, ManagerState
from memr1.envs.rewards import CREDIT_TERMS, CREDITS, REWARD_KINDS, answer_reward, answer_rewards, reward_weights

__all__ = [
    "CREDITS",
    "CREDIT_TERMS",
    "MANAGER_FORMAT_PENALTY",
    "REJECTED_OP",
    "REWARD_KINDS",
    "AnswerEnv",
    "AnswerState",
    "Environment",
    "ManagerEnv",
    "ManagerState",
    "Reward",
    "answer_reward",
    "answer_rewards",
    "reward_weights",
]
