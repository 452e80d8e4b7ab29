"""Which library constrains the service's JSON replies (`response_format` json_object / json_schema):
xgrammar, lm-format-enforcer or outlines-core, each driven from memr1's own decoding loop, on the
embedded SmolLM2-135M-Instruct's tokenizer (49,152 tokens).

Per library and schema: the set-up time (tokenizer tables, then the schema's compilation), the mean and
p95 time to mask one step's logits and advance by the chosen token (over the tokens of a valid reply,
teacher-forced), the mask size at the first step, and, for `--generate` prompts decoded by the real
model through memr1's HFEngine under the constraint (greedy, 96 tokens), how many replies parse and
fit, how many were cut, and the milliseconds per generated token (the same prompts without a
constraint are decoded first: how many of those parse).

    .venv/bin/pip install lm-format-enforcer outlines-core      # the two others (not memr1 dependencies)
    .venv/bin/python benchmarks/json_constraint.py [--generate 3] [--out docs/bench/json_constraint.json]

A library that is not installed, or cannot be set up offline, is reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from machine import machine_info, print_machine  # noqa: E402  (benchmarks/machine.py, beside this script)

from memr1.llm.engines import HFEngine  # noqa: E402
from memr1.llm.loading import load_policy  # noqa: E402
from memr1.llm.precision import choose_precision  # noqa: E402
from memr1.llm.sampling import SamplingConfig  # noqa: E402

# Mem0's fact extraction reply, and an object with typed fields of several kinds.
SCHEMAS: dict[str, dict[str, Any] | None] = {
    "json_object": None,
    "mem0_facts": {"type": "object", "properties": {"facts": {"type": "array", "items": {"type": "string"}}}, "required": ["facts"]},
    "typed_record": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
                       "verified": {"type": "boolean"}},
        "required": ["name", "age", "tags", "verified"],
    },
}
REPLIES = {
    "json_object": '{"answer": "Lisbon", "confidence": 0.9}',
    "mem0_facts": '{"facts": ["Andrew adopted a dog named Buddy", "Buddy is two years old"]}',
    "typed_record": '{"name": "Andrew", "age": 31, "tags": ["dogs", "hiking"], "verified": true}',
}
PROMPTS = ["Extract the facts about the user as JSON: I adopted a dog named Buddy last week.",
           "Reply in JSON with the city Ann moved to: Ann moved to Lisbon in May.",
           "Give a JSON record of Andrew, 31, who likes dogs and hiking."]


class Constraint:
    """One reply's state, as memr1's engine drives it (memr1.llm.constraints.TokenConstraint)."""

    def mask(self, logits: torch.Tensor) -> None: ...

    def accept(self, token: int) -> None: ...


def mask_to(logits: torch.Tensor, allowed: list[int]) -> None:
    """-inf at every token not in `allowed` (the libraries that return token lists)."""
    keep = logits[allowed].clone()
    logits.fill_(float("-inf"))
    logits[allowed] = keep


def xgrammar_factory(tokenizer: Any, vocab_size: int) -> Callable[[dict | None], Callable[[], Constraint]]:
    from memr1.llm.constraints import JSONGrammars

    grammars = JSONGrammars(tokenizer, vocab_size, [tokenizer.eos_token_id])
    return lambda schema: grammars.json_object() if schema is None else grammars.json_schema(schema)


def lmfe_factory(tokenizer: Any, vocab_size: int) -> Callable[[dict | None], Callable[[], Constraint]]:
    from lmformatenforcer import JsonSchemaParser, TokenEnforcer, TokenEnforcerTokenizerData

    # Its transformers integration does not import under transformers 5 (it imports a moved module):
    # the token table is built here the way that integration builds it.
    zero = tokenizer.encode("0", add_special_tokens=False)[-1]
    special = set(tokenizer.all_special_ids)
    regular = []
    for token in range(vocab_size):
        if token in special:
            continue
        after_zero, alone = tokenizer.decode([zero, token])[1:], tokenizer.decode([token])
        regular.append((token, after_zero, len(after_zero) > len(alone)))
    data = TokenEnforcerTokenizerData(regular, lambda tokens: tokenizer.decode(tokens).rstrip("\ufffd"), tokenizer.eos_token_id, False, vocab_size)

    def compile_schema(schema: dict | None) -> Callable[[], Constraint]:
        class LMFE(Constraint):
            def __init__(self) -> None:
                self.enforcer = TokenEnforcer(data, JsonSchemaParser(schema))
                self.tokens: list[int] = []

            def mask(self, logits: torch.Tensor) -> None:
                mask_to(logits, self.enforcer.get_allowed_tokens(self.tokens).allowed_tokens)

            def accept(self, token: int) -> None:
                self.tokens.append(token)

        return LMFE

    return compile_schema


def outlines_factory(tokenizer: Any, vocab_size: int) -> Callable[[dict | None], Callable[[], Constraint]]:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    # outlines-core reads a vocabulary from the hub only; offline it is built here from decoded tokens
    # (tokens that decode to a partial UTF-8 character are left out).
    eos = tokenizer.eos_token_id
    by_text: dict[str, list[int]] = {}
    for token in range(len(tokenizer)):
        if token == eos:
            continue
        text = tokenizer.decode([token])
        if text and "\ufffd" not in text:
            by_text.setdefault(text, []).append(token)
    vocabulary = Vocabulary(eos, by_text)

    def compile_schema(schema: dict | None) -> Callable[[], Constraint]:
        index = Index(build_regex_from_schema(json.dumps(schema or {"type": "object"})), vocabulary)

        class OC(Constraint):
            def __init__(self) -> None:
                self.guide = Guide(index)

            def mask(self, logits: torch.Tensor) -> None:
                mask_to(logits, list(self.guide.get_tokens()))

            def accept(self, token: int) -> None:
                self.guide.advance(token)

        return OC

    return compile_schema


LIBRARIES = {"xgrammar": xgrammar_factory, "lm-format-enforcer": lmfe_factory, "outlines-core": outlines_factory}


def library_version(name: str) -> str:
    from importlib.metadata import version

    return version({"outlines-core": "outlines_core"}.get(name, name))


def fits(text: str, schema: dict | None) -> bool:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    if schema is None:
        return isinstance(value, dict)
    return isinstance(value, dict) and all(key in value for key in schema.get("required", []))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--libraries", nargs="+", choices=tuple(LIBRARIES), default=list(LIBRARIES))
    parser.add_argument("--generate", type=int, default=len(PROMPTS), help="prompts decoded by the model under each constraint")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    print_machine()
    model, tokenizer = load_policy("embedded:smollm2-135m-instruct")
    vocab_size = model.config.vocab_size
    engine = HFEngine(model, tokenizer, batch_size=len(PROMPTS), precision=choose_precision("auto", "cpu"))
    free = engine.generate([[{"role": "user", "content": prompt}] for prompt in PROMPTS[: args.generate]], SamplingConfig.greedy_up_to(96))
    unconstrained = {"replies": [row[0].text for row in free], "replies_parse": sum(fits(row[0].text, None) for row in free)}
    print(json.dumps(unconstrained), flush=True)
    results: list[dict[str, Any]] = []
    for name in args.libraries:
        started = time.perf_counter()
        try:
            factory = LIBRARIES[name](tokenizer, vocab_size)
        except Exception as error:  # a library that cannot be set up offline is a result too
            results.append({"library": name, "error": f"{type(error).__name__}: {error}"[:300]})
            print(name, "set-up failed:", results[-1]["error"], flush=True)
            continue
        setup_s = time.perf_counter() - started
        for schema_name, schema in SCHEMAS.items():
            row: dict[str, Any] = {"library": name, "version": library_version(name), "schema": schema_name, "tokenizer_setup_s": setup_s}
            try:
                started = time.perf_counter()
                make = factory(schema)
                row["compile_s"] = time.perf_counter() - started
                constraint, step_ms = make(), []
                tokens = tokenizer(REPLIES[schema_name], add_special_tokens=False).input_ids
                for position, token in enumerate(tokens):
                    logits = torch.zeros(vocab_size)
                    started = time.perf_counter()
                    constraint.mask(logits)
                    constraint.accept(token) if torch.isfinite(logits[token]) else None
                    step_ms.append(1000 * (time.perf_counter() - started))
                    if position == 0:
                        row["first_step_allowed"] = int(torch.isfinite(logits).sum())
                    if not torch.isfinite(logits[token]):
                        raise ValueError(f"the valid reply's token {position} ({tokenizer.decode([token])!r}) was masked out")
                row["mask_ms_mean"] = statistics.mean(step_ms)
                row["mask_ms_p95"] = sorted(step_ms)[int(0.95 * (len(step_ms) - 1))]
                if args.generate:
                    prompts = [[{"role": "user", "content": prompt}] for prompt in PROMPTS[: args.generate]]
                    started = time.perf_counter()
                    replies = [row[0] for row in engine.generate(prompts, SamplingConfig(max_new_tokens=96, temperature=0.0, constraint=make))]
                    seconds = time.perf_counter() - started
                    row["replies"] = [reply.text for reply in replies]
                    row["replies_fit"] = sum(fits(reply.text, schema) for reply in replies)
                    row["replies_cut"] = sum(reply.finish_reason == "length" for reply in replies)
                    row["generate_ms_per_token"] = 1000 * seconds / sum(len(reply.response_ids) for reply in replies)
            except Exception as error:
                row["error"] = f"{type(error).__name__}: {error}"[:300]
            results.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "replies"}), flush=True)
    if args.out:
        machine = machine_info(load_before, os.getloadavg()[0])
        args.out.write_text(json.dumps({"machine": machine, "unconstrained": unconstrained, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
