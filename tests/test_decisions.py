"""Two Managers' decisions fact by fact (`memr1 decisions`): precision and recall per operation, by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memr1.cli import main
from memr1.datasets.locomo import load_locomo
from memr1.pipeline.decisions import agreement, by_citation, read_decisions


def write_run(run_dir: Path, events: list[str], conversation: str = "c") -> Path:
    run_dir.mkdir()
    rows = [{"conversation": conversation, "item": n, "event": event, "malformed": False, "rejected": False} for n, event in enumerate(events)]
    (run_dir / "decisions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run_dir


def test_precision_and_recall_of_each_operation_by_hand(tmp_path):
    reference = read_decisions(write_run(tmp_path / "oracle", ["ADD", "UPDATE", "UPDATE", "DELETE", "ADD", "ADD"]))
    manager = read_decisions(write_run(tmp_path / "manager", ["ADD", "UPDATE", "ADD", "UPDATE", "UPDATE", "ADD"]))
    rows, left_out = agreement(reference, manager)
    by_event = {row.event: row for row in rows}
    # UPDATE: the Manager chose it on facts 1, 3, 4; the oracle on 1, 2: both on 1 -> 1/3, 1/2.
    assert (by_event["UPDATE"].chosen, by_event["UPDATE"].reference, by_event["UPDATE"].agreed) == (3, 2, 1)
    assert by_event["UPDATE"].precision == pytest.approx(1 / 3) and by_event["UPDATE"].recall == pytest.approx(1 / 2)
    # DELETE: never chosen (precision undefined), the oracle's one missed.
    assert (by_event["DELETE"].precision, by_event["DELETE"].recall) == (None, 0.0)
    # ADD: the Manager on 0, 2, 5; the oracle on 0, 4, 5 -> 2/3 both ways. NOOP: neither.
    assert by_event["ADD"].precision == pytest.approx(2 / 3) and by_event["ADD"].recall == pytest.approx(2 / 3)
    assert (by_event["NOOP"].precision, by_event["NOOP"].recall) == (None, None)
    assert left_out == 0


def test_memr1_decisions_sets_runs_against_the_first_and_names_what_is_wrong(tmp_path, capsys):
    reference = write_run(tmp_path / "oracle", ["ADD", "UPDATE", "ADD"])
    manager = write_run(tmp_path / "manager", ["ADD", "UPDATE"])  # one fact fewer: left out, counted
    assert main(["decisions", str(reference), str(manager), "--json", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    assert "(1 facts decided by only one left out)" in out
    assert "| UPDATE | 1 | 1 | 1 | 100.0% | 100.0% |" in out
    (result,) = json.loads((tmp_path / "out.json").read_text())
    assert result["left_out"] == 1 and result["operations"][1]["event"] == "UPDATE"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "decisions.jsonl").write_text('{"conversation": "c", "item": 0, "event": "MERGE"}\n')
    with pytest.raises(ValueError, match=r"bad/decisions.jsonl:1: unknown event 'MERGE'"):
        read_decisions(tmp_path / "bad")
    with pytest.raises(FileNotFoundError, match="no decisions kept"):
        read_decisions(tmp_path)


def test_operations_counted_by_what_cites_the_fact_by_hand(tmp_path, capsys):
    """tests/fixtures/locomo_mini.json, mini-1's six facts in bank order: D1:1 (q1, category 1), D1:2
    (q0, 2), D1:1+D1:3 (q1, 1), D2:1 (q3, 4), D2:2 and one of no turn (cited by none)."""
    fixture = Path(__file__).parent / "fixtures" / "locomo_mini.json"
    run = write_run(tmp_path / "manager", ["ADD", "UPDATE", "UPDATE", "ADD", "UPDATE", "NOOP"], conversation="mini-1")
    table = by_citation(read_decisions(run), load_locomo(fixture))
    assert table == {
        "1": {"ADD": 1, "UPDATE": 1, "DELETE": 0, "NOOP": 0},
        "2": {"ADD": 0, "UPDATE": 1, "DELETE": 0, "NOOP": 0},
        "4": {"ADD": 1, "UPDATE": 0, "DELETE": 0, "NOOP": 0},
        "none": {"ADD": 0, "UPDATE": 1, "DELETE": 0, "NOOP": 1},
    }
    assert main(["decisions", str(run), "--data", str(fixture)]) == 0
    assert "| none | 2 | 0 | 1 | 0 | 1 |" in capsys.readouterr().out
    stray = write_run(tmp_path / "stray", ["ADD"] * 7, conversation="mini-1")
    with pytest.raises(ValueError, match="conversation 'mini-1' item 6 is no fact of the data given"):
        by_citation(read_decisions(stray), load_locomo(fixture))
