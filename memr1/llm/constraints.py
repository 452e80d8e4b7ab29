"""Constrained decoding: a grammar decides which tokens may come next, inside memr1's own decoding loop.

The service's `response_format` (`json_object`, `json_schema`) needs replies that parse: the embedded
135M model, asked for JSON, writes prose as often as not. `JSONGrammars` compiles a JSON grammar (any
object, or a JSON Schema) for a tokenizer with xgrammar, once per schema, and hands out a
`TokenConstraint` per reply; `HFEngine` masks every disallowed token's logit to -inf before it samples
(so greedy decoding and sampling alike stay in the grammar), and the reply ends with EOS when the
grammar is complete. xgrammar was chosen by measurement against lm-format-enforcer and outlines-core
(benchmarks/json_constraint.py, docs/performance.md): 0.2-0.3 ms a step against 26-49 and 9-35 ms,
schemas compiled in milliseconds, and HF tokenizers read offline.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch
from transformers import PreTrainedTokenizerBase


class TokenConstraint(Protocol):
    """One reply's grammar state."""

    def mask(self, logits: torch.Tensor) -> None:
        """Set the logits `(V,)` of every token the grammar does not allow next to -inf, in place."""
        ...

    def accept(self, token: int) -> None:
        """The reply continues with `token` (one the mask allowed)."""
        ...


ConstraintFactory = Callable[[], TokenConstraint]  # a fresh state per reply (each sample of a prompt too)


class JSONGrammars:
    """JSON grammars for one tokenizer: `json_object()` (any JSON object) and `json_schema(schema)`
    (a JSON Schema), compiled once each and cached."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        try:
            import xgrammar
        except ImportError:
            raise ImportError("JSON replies need xgrammar: pip install 'memr1[json]' (make setup installs it)") from None

        self._xgrammar = xgrammar
        self.vocab_size = vocab_size
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids))
        self._compiler = xgrammar.GrammarCompiler(info)
        self._compiled: dict[str, Any] = {}

    def json_object(self) -> ConstraintFactory:
        return self.json_schema({"type": "object"})

    def json_schema(self, schema: Mapping[str, Any]) -> ConstraintFactory:
        """A factory for replies that fit `schema`; a schema xgrammar cannot compile is a ValueError.
        Whitespace is JSON's compact form (`{"a": 1}`): a small model let free between tokens can pad
        a reply with blank lines until its budget runs out."""
        text = json.dumps(schema)  # in its own key order: the properties come in that order

        def compile_schema() -> Any:
            try:
                return self._compiler.compile_json_schema(text, any_whitespace=False)
            except Exception as error:  # xgrammar raises RuntimeError (or its own types) with the reason
                raise ValueError(f"json_schema: cannot be compiled into a grammar: {error}") from None

        return self._factory(text, compile_schema)

    def _factory(self, key: str, compile_grammar: Callable[[], Any]) -> ConstraintFactory:
        if key not in self._compiled:
            self._compiled[key] = compile_grammar()
        return functools.partial(XGrammarConstraint, self._xgrammar, self._compiled[key], self.vocab_size)


class XGrammarConstraint:
    """One reply's state in a compiled xgrammar grammar (a `TokenConstraint`)."""

    def __init__(self, xgrammar: Any, compiled: Any, vocab_size: int) -> None:
        self._xgrammar = xgrammar
        self._matcher = xgrammar.GrammarMatcher(compiled)
        self._bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
        self._vocab_size = vocab_size

    def mask(self, logits: torch.Tensor) -> None:
        self._matcher.fill_next_token_bitmask(self._bitmask)
        # The model's head may be wider than the tokenizer (padding rows): those never come next.
        self._xgrammar.apply_token_bitmask_inplace(logits[None, : self._vocab_size], self._bitmask)
        logits[self._vocab_size :] = float("-inf")

    def accept(self, token: int) -> None:
        if not self._matcher.accept_token(token):
            raise ValueError(f"token {token} is not allowed by the grammar here")
