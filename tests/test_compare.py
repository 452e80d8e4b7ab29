"""`memr1 compare` against cases worked by hand: two tiny evaluation runs whose paired differences and
percentile interval follow from counting, questions only one run answered left out and counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memr1.cli import main
from memr1.pipeline.compare import compare_runs, paired_bootstrap


def write_run(directory: Path, answers: dict[str, tuple[str, str, int]]) -> Path:
    """predictions.jsonl rows as evaluate.py writes them: qid -> (prediction, gold, category)."""
    directory.mkdir(parents=True)
    lines = [
        json.dumps({"qid": qid, "conversation_id": "c", "question": "?", "gold": gold, "prediction": prediction, "category": category})
        for qid, (prediction, gold, category) in answers.items()
    ]
    (directory / "predictions.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def test_a_constant_difference_has_no_spread():
    interval = paired_bootstrap([2.0, 2.0, 2.0, 2.0])
    assert (interval.delta, interval.low, interval.high, interval.verdict()) == (2.0, 2.0, 2.0, "B better")
    assert paired_bootstrap([-1.0, -1.0]).verdict() == "A better"


def test_one_question_in_three_decides_by_hand():
    # Differences [0, 0, 100]: a resample's mean is 100 k / 3 with k ~ Binomial(3, 1/3) the times the
    # third question is drawn. P(k = 0) = 8/27 = 30% > 2.5%, so the 2.5th percentile is 0; P(k = 3) =
    # 1/27 = 3.7% > 2.5%, so the 97.5th is 100. Mean 33.33, interval [0, 100]: within noise.
    interval = paired_bootstrap([0.0, 0.0, 100.0], resamples=10_000, seed=0)
    assert interval.delta == pytest.approx(100 / 3)
    assert (interval.low, interval.high, interval.verdict()) == (0.0, 100.0, "within noise")


def test_two_runs_are_paired_over_the_questions_both_answered(tmp_path):
    a = write_run(tmp_path / "a", {
        "q1": ("blue", "blue", 1), "q2": ("red", "green", 1), "q3": ("Paris", "Rome", 2), "q4": ("cat", "cat", 2),
    })
    b = write_run(tmp_path / "b", {
        "q1": ("blue", "blue", 1), "q2": ("green", "green", 1), "q3": ("Rome", "Rome", 2), "q5": ("x", "y", 1), "q6": ("y", "y", 3),
    })
    comparison = compare_runs(a, b)
    # Common: q1 (100 -> 100), q2 (0 -> 100), q3 (0 -> 100); q4 only in A, q5 and q6 only in B.
    assert (comparison.common, comparison.only_a, comparison.only_b, comparison.changed) == (3, 1, 2, 2)
    f1 = comparison.overall["f1"]
    assert (f1.mean_a, f1.mean_b) == pytest.approx((100 / 3, 100.0))
    # Differences [0, 100, 100]: P(k = 0 draws of a 100) = 1/27 = 3.7% > 2.5%, so the interval starts
    # at 0; P(k = 3) = 8/27 > 2.5%, so it ends at 100.
    assert f1.interval.delta == pytest.approx(200 / 3)
    assert (f1.interval.low, f1.interval.high, f1.interval.verdict()) == (0.0, 100.0, "within noise")
    assert comparison.overall["em"].interval.delta == pytest.approx(200 / 3)
    # Per category: category 1 holds q1, q2 (differences 0, 100); category 2 holds q3 (100).
    n1, category1 = comparison.by_category[1]
    n2, category2 = comparison.by_category[2]
    assert (n1, category1["f1"].interval.delta, n2, category2["f1"].interval.delta) == (2, 50.0, 1, 100.0)
    assert category2["f1"].interval.verdict() == "B better"
    assert comparison.verdict() == f"{comparison.run_b} is within noise of {comparison.run_a}: F1 +66.67 [+0.00, +100.00]; 2 of 3 answers differ."


def test_scores_stored_with_the_answers_are_read_not_scored_again(tmp_path):
    # evaluate.py stores each answer's F1 / BLEU-1 / EM (x100) with it. Rows whose stored F1 says 50 where
    # scoring "no" against "yes" would give 0: compare reads 50; a row without stored scores is scored.
    stored = {"f1": 50.0, "bleu1": 40.0, "em": 0.0}
    a = write_run(tmp_path / "a", {"q1": ("no", "yes", 1), "q2": ("no", "yes", 1)})
    b = tmp_path / "b"
    b.mkdir()
    rows = [{"qid": qid, "gold": "yes", "prediction": "no", "category": 1, "scores": stored} for qid in ("q1", "q2")]
    (b / "predictions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    f1 = compare_runs(a, b).overall["f1"]
    assert (f1.mean_a, f1.mean_b) == (0.0, 50.0)


def test_the_command_prints_the_table_and_writes_json(tmp_path, capsys):
    a = write_run(tmp_path / "a", {f"q{i}": ("no", "yes", 1) for i in range(4)})
    b = write_run(tmp_path / "b", {f"q{i}": ("yes", "yes", 1) for i in range(4)})
    out = tmp_path / "compare.json"
    assert main(["compare", str(a), str(b), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "+100.00 [+100.00, +100.00] (B better)" in printed and f"{b} beats {a}: F1 +100.00 [+100.00, +100.00]" in printed
    assert json.loads(out.read_text())[0]["overall"]["f1"]["verdict"] == "B better"


def test_the_command_names_categories_as_the_runs_dataset_does(tmp_path, capsys):
    # The names come from the reports: as a run wrote them (A's first), else from A's dataset's SPEC;
    # runs without a report are shown by number.
    from memr1.pipeline.report_file import EvalReport

    a = write_run(tmp_path / "a", {"q1": ("no", "yes", 1), "q2": ("Oslo", "Oslo", 2)})
    b = write_run(tmp_path / "b", {"q1": ("yes", "yes", 1), "q2": ("Oslo", "Oslo", 2)})
    assert main(["compare", str(a), str(b)]) == 0
    assert "| 1 | 1 |" in capsys.readouterr().out
    EvalReport("t", {}, {}, {"data": "knowledge_update"}).write(a)
    assert main(["compare", str(a), str(b)]) == 0
    assert "| 1 replaced | 1 |" in capsys.readouterr().out
    EvalReport("t", {}, {}, {"data": "locomo", "categories": {"1": "first", "2": "second"}}).write(a)
    assert main(["compare", str(a), str(b)]) == 0
    printed = capsys.readouterr().out
    assert "| 1 first | 1 |" in printed and "| 2 second | 1 |" in printed
    # A's report predates written names (its data guessed wrong): B's written names win.
    EvalReport("t", {}, {}, {"data": "locomo"}).write(a)
    EvalReport("t", {}, {}, {"data": "knowledge_update", "categories": {"1": "replaced", "2": "cancelled"}}).write(b)
    assert main(["compare", str(a), str(b)]) == 0
    printed = capsys.readouterr().out
    assert "| 1 replaced | 1 |" in printed and "| 2 cancelled | 1 |" in printed


def test_a_bad_run_directory_or_line_is_named(tmp_path, capsys):
    a = write_run(tmp_path / "a", {"q1": ("a", "a", 1)})
    assert main(["compare", str(a), str(tmp_path / "missing")]) == 1
    assert f"{tmp_path / 'missing' / 'predictions.jsonl'}: no such file" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "predictions.jsonl").write_text('{"qid": "q1", "gold": "a", "prediction": "a", "category": 1}\n{"qid": "q2"}\n')
    assert main(["compare", str(a), str(bad)]) == 1
    assert f"{bad / 'predictions.jsonl'}:2: missing gold, prediction, category" in capsys.readouterr().err
