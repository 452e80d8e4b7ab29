"""Which library constrains the service's JSON replies (`response_format` json_object / json_schema):
xgrammar, lm-format-enforcer or outlines-core, each driven from memr1's own decoding loop, on the
embedded SmolLM2-135M-Instruct's tokenizer (49,152 tokens).

Per library and schema: the set-up time (tokenizer tables, then the schema's compilation), the mean and
p95 time to compute one step's allowed-token mask and advance by the chosen token (over the tokens of
a valid reply, teacher-forced), the mask size at the first step, and whether the model's greedy reply
under the constraint parses and fits the schema (for `--generate` prompts, with the real model). The
masks run beside a decoding step of the model itself (`decode_step_ms`), which they must not dwarf.

    .venv/bin/python benchmarks/json_constraint.py [--generate 3] [--out docs/bench/json_constraint.json]
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

from memr1.llm.loading import load_policy  # noqa: E402

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
    """One library's per-request state: `allowed(mask)` fills a bool mask of the next tokens, `advance(token)`."""

    def allowed(self, mask: torch.Tensor) -> None: ...

    def advance(self, token: int) -> None: ...


def xgrammar_factory(tokenizer: Any, vocab_size: int) -> Callable[[dict | None], Callable[[], Constraint]]:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    compiler = xgr.GrammarCompiler(info)

    def compile_schema(schema: dict | None) -> Callable[[], Constraint]:
        compiled = compiler.compile_builtin_json_grammar() if schema is None else compiler.compile_json_schema(json.dumps(schema))

        class XG(Constraint):
            def __init__(self) -> None:
                self.matcher = xgr.GrammarMatcher(compiled)
                self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)

            def allowed(self, mask: torch.Tensor) -> None:
                self.matcher.fill_next_token_bitmask(self.bitmask)
                logits = torch.zeros(1, vocab_size)
                xgr.apply_token_bitmask_inplace(logits, self.bitmask)
                mask.copy_(logits[0] == 0)

            def advance(self, token: int) -> None:
                assert self.matcher.accept_token(token), token

        return XG

    return compile_schema


def lmfe_factory(tokenizer: Any, vocab_size: int) -> Callable[[dict | None], Callable[[], Constraint]]:
    from lmformatenforcer import JsonSchemaParser, TokenEnforcer
    from lmformatenforcer.integrations.transformers import build_token_enforcer_tokenizer_data

    data = build_token_enforcer_tokenizer_data(tokenizer)

    def compile_schema(schema: dict | None) -> Callable[[], Constraint]:
        class LMFE(Constraint):
            def __init__(self) -> None:
                self.enforcer = TokenEnforcer(data, JsonSchemaParser(schema))
                self.tokens: list[int] = []

            def allowed(self, mask: torch.Tensor) -> None:
                mask.zero_()
                mask[torch.tensor(self.enforcer.get_allowed_tokens(self.tokens), dtype=torch.long)] = True

            def advance(self, token: int) -> None:
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
    any_json = {"type": "object"}

    def compile_schema(schema: dict | None) -> Callable[[], Constraint]:
        index = Index(build_regex_from_schema(json.dumps(schema or any_json)), vocabulary)

        class OC(Constraint):
            def __init__(self) -> None:
                self.guide = Guide(index)

            def allowed(self, mask: torch.Tensor) -> None:
                mask.zero_()
                mask[torch.tensor(self.guide.get_tokens(), dtype=torch.long)] = True

            def advance(self, token: int) -> None:
                self.guide.advance(token)

        return OC

    return compile_schema


LIBRARIES = {"xgrammar": xgrammar_factory, "lm-format-enforcer": lmfe_factory, "outlines-core": outlines_factory}


def library_version(name: str) -> str:
    from importlib.metadata import version

    return version({"outlines-core": "outlines_core"}.get(name, name))


def greedy_reply(model: Any, tokenizer: Any, prompt: str, constraint: Constraint, vocab_size: int, max_new_tokens: int = 64) -> tuple[str, float]:
    """The model's greedy reply with each step's logits masked by `constraint`; seconds per token."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    out: list[int] = []
    started = time.perf_counter()
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(input_ids=torch.cat([ids, torch.tensor([out], dtype=torch.long)], dim=1)).logits[0, -1, :vocab_size]
            constraint.allowed(mask)
            if not mask.any():
                break
            token = int(torch.where(mask, logits, torch.tensor(float("-inf"))).argmax())
            if token == tokenizer.eos_token_id:
                break
            out.append(token)
            constraint.advance(token)
    return tokenizer.decode(out), (time.perf_counter() - started) / max(len(out), 1)


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
    print_machine()
    model, tokenizer = load_policy("embedded:smollm2-135m-instruct")
    vocab_size = model.config.vocab_size
    results: list[dict[str, Any]] = []
    for name in args.libraries:
        started = time.perf_counter()
        try:
            factory = LIBRARIES[name](tokenizer, vocab_size)
        except Exception as error:  # a library that cannot be set up offline is a result too
            results.append({"library": name, "error": f"{type(error).__name__}: {error}"[:300]})
            print(name, "set-up failed:", results[-1]["error"])
            continue
        setup_s = time.perf_counter() - started
        for schema_name, schema in SCHEMAS.items():
            row: dict[str, Any] = {"library": name, "version": library_version(name), "schema": schema_name, "tokenizer_setup_s": setup_s}
            try:
                started = time.perf_counter()
                make = factory(schema)
                row["compile_s"] = time.perf_counter() - started
                constraint, mask, step_ms = make(), torch.zeros(vocab_size, dtype=torch.bool), []
                tokens = tokenizer(REPLIES[schema_name], add_special_tokens=False).input_ids
                for position, token in enumerate(tokens):
                    started = time.perf_counter()
                    constraint.allowed(mask)
                    if position == 0:
                        row["first_step_allowed"] = int(mask.sum())
                    if not mask[token]:
                        raise ValueError(f"the valid reply's token {position} ({tokenizer.decode([token])!r}) was masked out")
                    constraint.advance(token)
                    step_ms.append(1000 * (time.perf_counter() - started))
                row["mask_ms_mean"] = statistics.mean(step_ms)
                row["mask_ms_p95"] = sorted(step_ms)[int(0.95 * (len(step_ms) - 1))]
                replies = [greedy_reply(model, tokenizer, prompt, make(), vocab_size) for prompt in PROMPTS[: args.generate]]
                row["replies"] = [text for text, _ in replies]
                row["replies_fit"] = sum(fits(text, schema) for text, _ in replies)
                row["decode_step_ms"] = 1000 * statistics.mean(seconds for _, seconds in replies)
            except Exception as error:
                row["error"] = f"{type(error).__name__}: {error}"[:300]
            results.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "replies"}))
    if args.out:
        args.out.write_text(json.dumps({"machine": machine_info(), "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
