"""Constrained decoding (memr1/llm/constraints.py) in HFEngine's own loop: a tiny random model, whose
free replies are never JSON, writes only replies that fit the schema, sampling or greedy; a reply cut
at its budget says "length"; the recorded log-probs are those of the masked distribution."""

from __future__ import annotations

import json
import math

import pytest

from memr1.llm.constraints import JSONGrammars
from memr1.llm.engines import HFEngine
from memr1.llm.loading import load_tokenizer
from memr1.llm.sampling import SamplingConfig
from memr1.llm.testing import tiny_causal_lm

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9},
                   "colour": {"enum": ["red", "green", "blue"]}},
    "required": ["ok", "n", "colour"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine() -> HFEngine:
    tokenizer = load_tokenizer("embedded:smollm2-135m-instruct")
    return HFEngine(tiny_causal_lm(tokenizer, seed=0), tokenizer, batch_size=4)


@pytest.fixture(scope="module")
def grammars(engine) -> JSONGrammars:
    return JSONGrammars(engine.tokenizer, engine.model.config.vocab_size, sorted(engine.eos_token_ids))


def test_every_sampled_reply_fits_the_schema(engine, grammars):
    free = engine.generate(["Say something."], SamplingConfig(max_new_tokens=12, seed=3))[0][0].text
    with pytest.raises(json.JSONDecodeError):
        json.loads(free)  # without the grammar the random model writes no JSON
    replies = engine.generate(["Say something.", "Anything?"], SamplingConfig(max_new_tokens=40, n=4, seed=3, constraint=grammars.json_schema(SCHEMA)))
    for reply in (generation for row in replies for generation in row):
        value = json.loads(reply.text)
        assert list(value) == ["ok", "n", "colour"], reply.text  # the schema's order
        assert isinstance(value["ok"], bool) and 0 <= value["n"] <= 9 and value["colour"] in ("red", "green", "blue")
        assert reply.finish_reason == "stop" and reply.response_ids[-1] in engine.eos_token_ids
        assert all(math.isfinite(logprob) and logprob <= 0 for logprob in reply.logprobs)


def test_greedy_replies_fit_and_a_cut_reply_says_length(engine, grammars):
    greedy = SamplingConfig.greedy_up_to(40)
    (reply,) = engine.generate(["Say something."], SamplingConfig(max_new_tokens=40, temperature=0.0, constraint=grammars.json_schema(SCHEMA)))[0]
    assert set(json.loads(reply.text)) == {"ok", "n", "colour"}
    # Cut at 3 tokens, the object is unfinished: "length", and what there is follows the grammar.
    (cut,) = engine.generate(["Say something."], SamplingConfig(max_new_tokens=3, temperature=0.0, constraint=grammars.json_schema(SCHEMA)))[0]
    assert cut.finish_reason == "length" and reply.text.startswith(cut.text)
    (anything,) = engine.generate(["Say something."], SamplingConfig(max_new_tokens=40, temperature=0.0, constraint=grammars.json_object()))[0]
    assert anything.text.startswith("{")
    assert greedy.constraint is None  # a config without a grammar decodes freely, as before


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_reply_closes_within_its_budget_whenever_a_complete_value_fits(engine, grammars, temperature):
    # The tiny random model left to the grammar alone opens strings and objects until its budget runs
    # out; with the budget in the mask every reply that has room for "{}" and EOS is a complete value.
    tokens = lambda text: len(engine.tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    smallest = tokens("{}") + 1  # and the EOS
    for budget in range(smallest, 30):
        sampling = SamplingConfig(max_new_tokens=budget, temperature=temperature, n=2, seed=budget, constraint=grammars.json_object())
        for reply in engine.generate(["Say something.", "Reply in JSON."], sampling)[0] + engine.generate(["Reply in JSON."], sampling)[0]:
            assert reply.finish_reason == "stop", (budget, reply.text)
            assert isinstance(json.loads(reply.text), dict) and len(reply.response_ids) <= budget
    # The schema's smallest value needs more tokens than these: cut, and what there is fits the grammar.
    (cut,) = engine.generate(["Say something."], SamplingConfig(max_new_tokens=4, temperature=temperature, seed=1, constraint=grammars.json_schema(SCHEMA)))[0]
    assert cut.finish_reason == "length" and cut.text.startswith('{"')
    needed = tokens('{"ok": true, "n": 0, "colour": "red"}') + 4  # room for the value, a few tokens spare
    (fits,) = engine.generate(["Say something."], SamplingConfig(max_new_tokens=needed, temperature=temperature, seed=1, constraint=grammars.json_schema(SCHEMA)))[0]
    assert fits.finish_reason == "stop" and set(json.loads(fits.text)) == {"ok", "n", "colour"}, fits.text


def test_a_schema_that_cannot_compile_is_named(grammars):
    with pytest.raises(ValueError, match="json_schema: cannot be compiled"):
        grammars.json_schema({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})
