"""LLM-as-a-Judge (J): a generous CORRECT / WRONG verdict on (question, gold, answer).

The protocol of Mem0's LoCoMo evaluation, which the paper's J column uses: the judge sees the question,
the gold answer and the generated answer, is told to be generous (same topic, same date in another
format counts), answers in JSON at temperature 0. Two back ends: a local model through a generation
engine, or any OpenAI-compatible chat endpoint. A verdict that cannot be read counts as WRONG and is
flagged, so a flaky judge lowers J rather than stopping an evaluation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol, Sequence

from memr1.llm.engines import GenerationEngine
from memr1.llm.openai_client import OpenAICompatibleClient
from memr1.llm.sampling import SamplingConfig

JUDGE_PROMPT = """\
Label an answer to a question about a conversation as CORRECT or WRONG.
You get the question, the gold answer, and the generated answer. Be generous: the generated answer is \
CORRECT if it touches the same topic or fact as the gold answer, even if it is longer or worded \
differently. For time questions, the same date or period in another format ("May 7th" vs "7 May") \
is CORRECT.

Question: {question}
Gold answer: {gold}
Generated answer: {answer}

Reply with JSON only: {{"label": "CORRECT"}} or {{"label": "WRONG"}}"""

_LABEL = re.compile(r'"?label"?\s*:\s*"?(CORRECT|WRONG)', re.IGNORECASE)
_BARE = re.compile(r"\b(CORRECT|WRONG)\b")


@dataclass(frozen=True)
class Verdict:
    correct: bool
    readable: bool  # False: the judge's reply had no label, counted WRONG


def read_verdict(text: str) -> Verdict:
    """The label in a judge's reply: the JSON field, else a bare CORRECT / WRONG word."""
    match = _LABEL.search(text) or _BARE.search(text)
    if match is None:
        return Verdict(correct=False, readable=False)
    return Verdict(correct=match.group(1).upper() == "CORRECT", readable=True)


def judge_messages(question: str, gold: str, answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": JUDGE_PROMPT.format(question=question, gold=gold, answer=answer)}]


class Judge(Protocol):
    def __call__(self, questions: Sequence[str], golds: Sequence[str], answers: Sequence[str]) -> list[Verdict]: ...


class EngineJudge:
    """A local model judges, greedy, in batches."""

    def __init__(self, engine: GenerationEngine, max_new_tokens: int = 32, batch_size: int = 8) -> None:
        self.engine = engine
        self.sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0)
        self.batch_size = batch_size

    def __call__(self, questions: Sequence[str], golds: Sequence[str], answers: Sequence[str]) -> list[Verdict]:
        prompts = [judge_messages(q, g, a) for q, g, a in zip(questions, golds, answers)]
        verdicts = []
        for start in range(0, len(prompts), self.batch_size):
            outputs = self.engine.generate(prompts[start : start + self.batch_size], self.sampling)
            verdicts.extend(read_verdict(samples[0].text) for samples in outputs)
        return verdicts


class OpenAICompatibleJudge:
    """A chat-completions endpoint (`{url}/chat/completions`) judges, one request per question."""

    def __init__(self, url: str, model: str, api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 60) -> None:
        self.client = OpenAICompatibleClient(url, model, api_key_env, timeout_s)

    def __call__(self, questions: Sequence[str], golds: Sequence[str], answers: Sequence[str]) -> list[Verdict]:
        return [read_verdict(self.client.chat(judge_messages(q, g, a))) for q, g, a in zip(questions, golds, answers)]
