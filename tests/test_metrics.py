"""The Mem0 LoCoMo answer metrics against values worked out by hand, and QAMetrics under DDP."""

from __future__ import annotations

import json
import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from memr1.metrics.lexical import bleu1, bleu_tokens, exact_match, f1_tokens, normalize_answer, token_f1
from memr1.metrics.qa import QAMetrics

E_INV = math.exp(-1)  # BLEU brevity penalty exp(1 - 4/2) for 2 predicted tokens against 4 gold ones


# --- tokenisation ----------------------------------------------------------------------------------


def test_f1_tokens_replace_only_the_four_marks():
    # ". , ! ?" become spaces; other punctuation (the apostrophe, the colon) stays inside tokens.
    assert f1_tokens("Hi, Bob! It's 7:30. Ok?") == ["hi", "bob", "it's", "7:30", "ok"]
    assert f1_tokens(2022) == ["2022"]


def test_bleu_tokens_split_sentences_like_word_tokenize():
    # word_tokenize splits sentences first, so an inner sentence-final period is its own token;
    # the Treebank tokenizer alone would have kept "paris." whole.
    assert bleu_tokens("He went to Paris. Then London.") == ["he", "went", "to", "paris", ".", "then", "london", "."]
    assert bleu_tokens("Caroline's dog, Buddy") == ["caroline", "'s", "dog", ",", "buddy"]


def test_bleu_tokens_know_the_trained_english_abbreviations():
    # The trained English Punkt keeps "u.s." inside its sentence (an untrained Punkt cuts after it and
    # the Treebank tokenizer then splits "u.s" from "."); "dr." and "mrs." stay whole mid-sentence,
    # while a real sentence end still splits ("so" "."), as nltk.word_tokenize does.
    assert bleu_tokens("She moved to the U.S. like her sister") == [
        "she", "moved", "to", "the", "u.s.", "like", "her", "sister"
    ]
    assert bleu_tokens("Dr. Smith said so. Then he left.") == [
        "dr.", "smith", "said", "so", ".", "then", "he", "left", "."
    ]
    assert bleu_tokens("Mr. and Mrs. Lee adopted two dogs.") == ["mr.", "and", "mrs.", "lee", "adopted", "two", "dogs", "."]


def test_bleu1_of_a_gold_with_an_abbreviation_by_hand():
    # pred 5 tokens, 4 in the 8-token gold: precision 4/5, brevity penalty exp(1 - 8/5).
    # (With "u.s" "." as two tokens the gold would have 9 tokens: exp(1 - 9/5), the old, wrong value.)
    expected = 0.8 * math.exp(1 - 8 / 5)
    assert bleu1("she moved to the us", "She moved to the U.S. like her sister") == pytest.approx(expected, abs=1e-12)


def test_normalize_answer_is_squad_style():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple a day, THE end.") == "apple day end"
    assert normalize_answer(2022) == "2022"


# --- exact match -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ("  PARIS ", "paris", 1.0),  # case and surrounding space do not matter
        ("Paris.", "paris", 0.0),  # punctuation does: the reported EM is strict
        ("2022", 2022, 1.0),  # int gold compared through str()
        ("3.5", 3.5, 1.0),
        ("", "paris", 0.0),
        ("paris", "", 0.0),
        ("", "", 0.0),  # empty on both sides still scores 0
        ("   ", "   ", 0.0),
    ],
)
def test_exact_match_strict(pred, gold, expected):
    assert exact_match(pred, gold) == expected


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ("The Eiffel Tower.", "eiffel tower", 1.0),  # articles and punctuation dropped for the reward
        ("Paris.", "paris", 1.0),
        ("two dogs", "three dogs", 0.0),
        ("the", "a", 0.0),  # both normalise to "": empty side scores 0
    ],
)
def test_exact_match_normalized_reward(pred, gold, expected):
    assert exact_match(pred, gold, normalized=True) == expected


def test_wrong_answer_type_names_the_argument():
    with pytest.raises(TypeError, match=r"pred: expected str, int or float, got NoneType"):
        exact_match(None, "paris")
    with pytest.raises(TypeError, match=r"gold: expected str, int or float, got list"):
        token_f1("paris", ["paris"])


# --- token F1 --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ("", "paris", 0.0),
        ("paris", "", 0.0),
        ("...", "paris", 0.0),  # only punctuation: no tokens
        ("Paris.", "paris", 1.0),  # the period is a separator
        ("PARIS", "paris", 1.0),
        ("cat", "dog", 0.0),
        # int gold: pred {in, 2022}, gold {2022}; P = 1/2, R = 1, F1 = 2 * 1/2 * 1 / (3/2) = 2/3
        ("in 2022", 2022, 2 / 3),
        # sets: pred {dog}, gold {dog, cat}; P = 1, R = 1/2, F1 = 2/3 (a multiset F1 would give 0.4)
        ("dog dog dog", "dog cat", 2 / 3),
        # pred {she, adopted, two, dogs, buddy, and, scout} (7), gold {two, dogs, named, buddy, and,
        # scout} (6), common 5: P = 5/7, R = 5/6, F1 = 2 * 25/42 / (65/42) = 50/65 = 10/13
        ("She adopted two dogs, Buddy and Scout", "two dogs named Buddy and Scout", 10 / 13),
        # multi-sentence: pred {he, went, to, paris, then, london} (6), gold {paris, and, london} (3),
        # common 2: P = 1/3, R = 2/3, F1 = 2 * 2/9 / 1 = 4/9
        ("He went to Paris. Then London.", "Paris and London", 4 / 9),
    ],
)
def test_token_f1(pred, gold, expected):
    assert token_f1(pred, gold) == pytest.approx(expected)


# --- BLEU-1 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ("", "paris", 0.0),
        ("paris", "", 0.0),
        ("Paris", "paris", 1.0),  # one token, no bigrams: weights (1, 0, 0, 0) ignore the empty orders
        # no unigram in common: NLTK returns 0 before smoothing (method 1 only lifts zero counts of
        # the higher orders, which weigh 0 here)
        ("cat", "dog", 0.0),
        # [paris, .] vs [paris]: clipped unigram precision 1/2; pred longer than gold, so BP = 1
        ("Paris.", "paris", 0.5),
        # [in, 2022] vs [2022]: precision 1/2, BP = 1
        ("in 2022", 2022, 0.5),
        # brevity: both pred tokens match, precision 1, BP = exp(1 - 4/2) = e^-1
        ("buddy scout", "two dogs buddy scout", E_INV),
        # clipping: "dog" counts once against the one "dog" of the gold: precision 1/3, BP = 1
        ("dog dog dog", "dog cat", 1 / 3),
        # [he, went, to, paris, ., then, london, .] (8) vs [paris, and, london] (3): matches paris and
        # london, precision 2/8, BP = 1
        ("He went to Paris. Then London.", "Paris and London", 0.25),
    ],
)
def test_bleu1(pred, gold, expected):
    assert bleu1(pred, gold) == pytest.approx(expected)


# --- QAMetrics -------------------------------------------------------------------------------------

# (pred, gold, category) with (EM, F1, BLEU-1) from the cases above:
#   cat 1: ("Paris", "paris")                 -> 1, 1,   1
#   cat 2: ("in 2022", 2022)                  -> 0, 2/3, 1/2
#   cat 1: ("cat", "dog")                     -> 0, 0,   0
#   cat 4: ("buddy scout", "two dogs buddy scout") -> 0, P 1 R 1/2 so 2/3, e^-1
PREDS = ["Paris", "in 2022", "cat", "buddy scout"]
GOLDS = ["paris", 2022, "dog", "two dogs buddy scout"]
CATEGORIES = [1, 2, 1, 4]
EXPECTED = {
    "em": 100 * 1 / 4,
    "f1": 100 * (1 + 2 / 3 + 0 + 2 / 3) / 4,  # 58.33
    "bleu1": 100 * (1 + 0.5 + 0 + E_INV) / 4,  # 46.70
    "count": 4,
    "em/cat1": 50.0,
    "f1/cat1": 50.0,
    "bleu1/cat1": 50.0,
    "count/cat1": 2,
    "em/cat2": 0.0,
    "f1/cat2": 100 * 2 / 3,
    "bleu1/cat2": 50.0,
    "count/cat2": 1,
    "em/cat4": 0.0,
    "f1/cat4": 100 * 2 / 3,
    "bleu1/cat4": 100 * E_INV,
    "count/cat4": 1,
}


def assert_report(report: dict[str, float], expected: dict[str, float]) -> None:
    assert set(report) == set(expected)
    for key, value in expected.items():
        assert report[key] == pytest.approx(value), key


def test_qa_metrics_per_category_means():
    metric = QAMetrics()
    metric.update(PREDS, GOLDS, CATEGORIES)
    assert_report(metric.compute(), EXPECTED)


def test_qa_metrics_accumulates_across_updates_and_resets():
    metric = QAMetrics()
    metric.update(PREDS[:1], GOLDS[:1], CATEGORIES[:1])
    metric.update(PREDS[1:], GOLDS[1:], CATEGORIES[1:])
    assert_report(metric.compute(), EXPECTED)
    metric.reset()
    metric.update(["cat"], ["dog"], [3])
    assert_report(metric.compute(), {"em": 0, "f1": 0, "bleu1": 0, "count": 1, "em/cat3": 0, "f1/cat3": 0,
                                     "bleu1/cat3": 0, "count/cat3": 1})


def test_qa_metrics_before_any_update_reports_nan_and_zero_count():
    with pytest.warns(UserWarning, match="compute"):  # torchmetrics warns that update was never called
        report = QAMetrics().compute()
    assert report["count"] == 0
    assert all(math.isnan(report[key]) for key in ("em", "f1", "bleu1"))


def test_qa_metrics_rejects_bad_input_with_its_position():
    metric = QAMetrics(max_category=4)
    with pytest.raises(ValueError, match=r"categories\[1\]: 5 is outside 0..max_category=4"):
        metric.update(["a", "b"], ["a", "b"], [1, 5])
    with pytest.raises(TypeError, match=r"categories\[0\]: expected int, got str"):
        metric.update(["a"], ["a"], ["1"])
    with pytest.raises(ValueError, match="equal lengths, got 2, 1, 1"):
        metric.update(["a", "b"], ["a"], [1])
    with pytest.raises(TypeError, match=r"question 1: pred: expected str, int or float, got NoneType"):
        metric.update(["a", None], ["a", "b"], [1, 1])
    # nothing was added by the rejected calls
    metric.update(["a"], ["a"], [1])
    assert metric.compute()["count"] == 1


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _ddp_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        metric = QAMetrics()
        # rank 0 gets questions 0 and 2, rank 1 questions 1 and 3: both ranks see category 1 twice
        # or not at all, so the sums, not local means, must be what is reduced.
        metric.update(PREDS[rank::world_size], GOLDS[rank::world_size], CATEGORIES[rank::world_size])
        report = metric.compute()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
            json.dump(report, handle)
    finally:
        dist.destroy_process_group()


def test_qa_metrics_ddp_sync_equals_single_process(tmp_path):
    single = QAMetrics()
    single.update(PREDS, GOLDS, CATEGORIES)
    expected = single.compute()
    # start_processes is mp.spawn's machinery (mp.spawn itself now forces "spawn"); fork lets the
    # children inherit torch / torchmetrics / nltk instead of re-importing them (~10 s each here).
    mp.start_processes(_ddp_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, start_method="fork")
    for rank in range(2):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert_report(report, expected)
