"""Constrained decoding: a grammar decides which tokens may come next, inside memr1's own decoding loop.

The service's `response_format` (`json_object`, `json_schema`) needs replies that parse: the embedded
135M model, asked for JSON, writes prose as often as not. `JSONGrammars` compiles a JSON grammar (any
object, or a JSON Schema) for a tokenizer with xgrammar, once per schema, and hands out a
`TokenConstraint` per reply; `HFEngine` masks every disallowed token's logit to -inf before it samples
(so greedy decoding and sampling alike stay in the grammar), and the reply ends with EOS when the
grammar is complete. A reply also closes within its budget: near the end of `max_new_tokens`,
`XGrammarConstraint.mask` lets through only a token after which the value can still be closed (and
EOS sent) in the tokens left, so a reply is a complete JSON value whenever one fits, and is cut
("length") only when none does. xgrammar was chosen by measurement against lm-format-enforcer and outlines-core
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

    def mask(self, logits: torch.Tensor, remaining: int) -> None:
        """Set the logits `(V,)` of every token not allowed next to -inf, in place. `remaining`: the
        tokens this reply may still take, this one included (the EOS that ends it counts as one)."""
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
        self._closers = _closing_tokens(tokenizer)
        self._encode = functools.partial(tokenizer.encode, add_special_tokens=False)
        self._stop_token_ids = frozenset(stop_token_ids)

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
        return functools.partial(
            XGrammarConstraint, self._xgrammar, self._compiled[key], self.vocab_size, self._closers, self._stop_token_ids, self._encode
        )


def _closing_tokens(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids of the short pieces that end a JSON value, in the order a closing path tries them
    (after any that completes the value at once): end the string, the object, the array; a colon
    after a key; the shortest values. Pieces the tokenizer cannot write as one token are left out."""
    tokens = []
    for piece in ('"', "}", "]", '"}', "}}", ":", "0", '""', "null", "{}", "[]", "true"):
        ids = tokenizer.encode(piece, add_special_tokens=False)
        if len(ids) == 1 and ids[0] not in tokens:
            tokens.append(ids[0])
    return tokens


_BITS = torch.arange(32, dtype=torch.int32)


def _unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """xgrammar's packed bitmask `(1, ceil(V / 32))` int32 as booleans `(V,)`: token i is allowed
    where bit i % 32 of word i // 32 is set."""
    return ((bitmask[0, :, None] >> _BITS) & 1).flatten()[:vocab_size].bool()


class XGrammarConstraint:
    """One reply's state in a compiled xgrammar grammar (a `TokenConstraint`) that closes within its
    budget: while the tokens left exceed what closing needs by more than `SLACK`, the grammar alone
    masks; closer than that, the best-scoring allowed tokens are tried in order and the first after
    which the value still closes in time is the only one let through (decoding is greedy there)."""

    SLACK = 16  # more than one token can open: '{"' costs '"', ':', '0', '}' to close
    MAX_CLOSING = 64  # a closing path longer than this counts as none (nothing is forced)
    TRIED = 16  # the best-scoring allowed tokens tried before the closing path's own token is forced

    def __init__(
        self,
        xgrammar: Any,
        compiled: Any,
        vocab_size: int,
        closers: list[int],
        stop_token_ids: frozenset[int],
        encode: Callable[[str], list[int]],
    ) -> None:
        self._xgrammar = xgrammar
        self._matcher = xgrammar.GrammarMatcher(compiled)
        self._bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
        self._trial_bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)  # the closing paths' scratch
        self._vocab_size = vocab_size
        self._closers = closers
        self._stop_token_ids = stop_token_ids
        self._encode = encode

    def mask(self, logits: torch.Tensor, remaining: int) -> None:
        self._matcher.fill_next_token_bitmask(self._bitmask)
        # The model's head may be wider than the tokenizer (padding rows): those never come next.
        self._xgrammar.apply_token_bitmask_inplace(logits[None, : self._vocab_size], self._bitmask)
        logits[self._vocab_size :] = float("-inf")
        closing = self._closing_path(self._matcher)
        if closing is None or remaining > len(closing) + 1 + self.SLACK:
            return
        allowed = torch.isfinite(logits).nonzero().squeeze(-1)
        order = allowed[logits[allowed].argsort(descending=True)][: self.TRIED].tolist()
        chosen = next((token for token in order if self._closes_in_time(token, remaining)), None)
        if chosen is None:  # none of the best closes in time: the closing path's own step (or EOS)
            chosen = closing[0] if closing else min(self._stop_token_ids)
        kept = logits[chosen].clone()
        logits.fill_(float("-inf"))
        logits[chosen] = kept

    def _closes_in_time(self, token: int, remaining: int) -> bool:
        """After `token`, the value closes and EOS fits in the `remaining - 1` tokens then left."""
        if token in self._stop_token_ids:
            return True
        trial = self._matcher.fork()
        if not trial.accept_token(token):
            return False
        closing = self._closing_path(trial)
        return closing is not None and len(closing) + 1 <= remaining - 1

    def _closing_path(self, matcher: Any) -> list[int] | None:
        """A short token path from `matcher`'s state to a complete value (empty if it is complete),
        found greedily: text the grammar forces (a required key) as the tokenizer writes it, else the
        first closer the grammar allows, else the first token it allows. None when no path of at most
        MAX_CLOSING tokens was found."""
        trial = matcher.fork()
        path: list[int] = []
        bitmask = self._trial_bitmask
        while not trial.is_completed():
            if len(path) >= self.MAX_CLOSING:
                return None
            forced = trial.find_jump_forward_string()
            if forced:
                for token in self._encode(forced):
                    if not trial.accept_token(token):
                        break
                    path.append(token)
                else:
                    continue
            trial.fill_next_token_bitmask(bitmask)
            allowed = _unpack(bitmask, self._vocab_size)
            closers = [t for t in self._closers if allowed[t]]
            token = next((t for t in closers if self._completes(trial, t)), closers[0] if closers else None)
            if token is None:
                token = next((t for t in allowed.nonzero().squeeze(-1).tolist() if t not in self._stop_token_ids), None)
            if token is None or not trial.accept_token(token):
                return None
            path.append(token)
        return path

    @staticmethod
    def _completes(matcher: Any, token: int) -> bool:
        trial = matcher.fork()
        return trial.accept_token(token) and trial.is_completed()

    def accept(self, token: int) -> None:
        if not self._matcher.accept_token(token):
            raise ValueError(f"token {token} is not allowed by the grammar here")
