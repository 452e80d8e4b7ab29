"""The Answer Agent's RL module: validation answers greedily and scores F1 / BLEU-1 / EM."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from memr1.agents.answer import MISSING_MEMORY_LIST
from memr1.envs.answer import AnswerEnv, AnswerState
from memr1.envs.base import Reward
from memr1.metrics.qa import QAMetrics
from memr1.modules.base import RLModule


class AnswerRLModule(RLModule):
    env: AnswerEnv

    def on_validation_epoch_start(self) -> None:
        self.val_metrics = QAMetrics().to(self.device)

    @torch.no_grad()
    def validation_step(self, states: list[AnswerState], batch_idx: int) -> None:
        outputs = self.engine.generate([self.env.prompt(state) for state in states], self.validation_sampling())
        answers = [self.env.agent.parse(samples[0].text).answer for samples in outputs]
        self.val_metrics.update(answers, [s.question.answer for s in states], [s.question.category for s in states])
        self.sample_validation_rewards(states)

    def on_validation_epoch_end(self) -> None:
        scores = self.val_metrics.compute()
        self.log_dict({f"val/{key}": scores[key] for key in ("f1", "bleu1", "em")}, prog_bar=True, sync_dist=False)
        self.log_sampled_validation_reward()

    def extra_metrics(self, rewards: Sequence[Reward]) -> dict[str, float]:
        words = [float(r.info.get("answer_words", 0.0)) for r in rewards]
        if not words:
            return {}
        metrics = {"response/answer_words_mean": sum(words) / len(words)}
        if self.env.agent.distill:  # the distilling agent that stops listing memories has dropped distillation
            metrics["response/missing_memory_list_frac"] = sum(r.format_error == MISSING_MEMORY_LIST for r in rewards) / len(rewards)
        return metrics
