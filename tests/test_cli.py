"""The `memr1` command line, run as a subprocess (`python -m memr1.cli`).

Time budget: about 4 s on 2 CPU cores (seven subprocesses of ~0.5 s each).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memr1.cli import SUBCOMMANDS, main, parse_split

pytestmark = pytest.mark.slow  # most tests here run `memr1` as a subprocess

REPO = Path(__file__).parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "locomo_mini.json"
FIXTURE_SPLITS = ["--split", "train=mini-1", "--split", "test=*"]


def memr1(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memr1.cli", *map(str, args)],
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_parse_split() -> None:
    assert parse_split("train=conv-26") == ("train", ("conv-26",))
    assert parse_split("dev=conv-26, conv-30") == ("dev", ("conv-26", "conv-30"))
    assert parse_split("test=*") == ("test", None)
    with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=ID"):
        parse_split("train")


@pytest.mark.parametrize("command", [[], *([subcommand.name] for subcommand in SUBCOMMANDS)], ids=lambda c: " ".join(["memr1", *c, "--help"]))
def test_every_help_page_prints(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # argparse formats a help string with %: a bare "95%" once made `memr1 --help` raise ValueError.
    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    page = capsys.readouterr().out
    assert "usage: memr1" in page
    assert "%%" not in page  # a description prints as written: an escape meant for help strings shows


def test_data_summary_json_on_the_fixture() -> None:
    result = memr1("data-summary", FIXTURE, "--json", *FIXTURE_SPLITS)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["path"] == str(FIXTURE)
    assert summary["categories"] == {"1": "single-hop", "2": "temporal", "3": "multi-hop", "4": "open-domain"}
    # Hand counts of tests/fixtures/locomo_mini.json (category 5 excluded).
    assert summary["splits"] == {
        "train": {
            "conversations": 1,
            "sessions": 2,
            "turns": 5,
            "facts": 6,
            "questions": {"1": 1, "2": 1, "3": 1, "4": 1, "total": 4},
            "questions_without_evidence": 1,
            "evidence_repaired": 2,
            "evidence_dropped_malformed": 1,
            "evidence_dropped_unknown": 0,
            "fact_dia_id_repaired": 1,
            "fact_dia_id_dropped_malformed": 0,
            "fact_dia_id_dropped_unknown": 1,
        },
        "test": {
            "conversations": 1,
            "sessions": 3,
            "turns": 4,
            "facts": 4,
            "questions": {"1": 1, "2": 1, "3": 0, "4": 1, "total": 3},
            "questions_without_evidence": 0,
            "evidence_repaired": 1,
            "evidence_dropped_malformed": 0,
            "evidence_dropped_unknown": 1,
            "fact_dia_id_repaired": 1,
            "fact_dia_id_dropped_malformed": 1,
            "fact_dia_id_dropped_unknown": 0,
        },
    }
    assert summary["all"]["questions"] == {"1": 2, "2": 2, "3": 1, "4": 2, "total": 7}
    assert summary["all"]["evidence_dropped_malformed"] + summary["all"]["evidence_dropped_unknown"] == 2
    assert [(issue["json_path"], issue["kind"]) for issue in summary["issues"]] == [
        ("$[0].observation.session_2_observation.Ben[0][1]", "fact_dia_id_repaired"),
        ("$[0].observation.session_2_observation.Ben[1][1]", "fact_dia_id_dropped_unknown"),
        ("$[0].qa[1].evidence[0]", "evidence_repaired"),
        ("$[0].qa[3].evidence[0]", "evidence_repaired"),
        ("$[0].qa[3].evidence[1]", "evidence_dropped_malformed"),
        ("$[1].observation.session_2_observation.Dev[0][1]", "fact_dia_id_dropped_malformed"),
        ("$[1].observation.session_2_observation.Dev[0][1]", "fact_dia_id_repaired"),
        ("$[1].qa[0].evidence[0]", "evidence_repaired"),
        ("$[1].qa[1].evidence[1]", "evidence_dropped_unknown"),
    ]


def test_data_summary_include_adversarial() -> None:
    result = memr1("data-summary", FIXTURE, "--json", "--include-adversarial", *FIXTURE_SPLITS)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["categories"]["5"] == "adversarial"
    assert summary["splits"]["train"]["questions"] == {"1": 1, "2": 1, "3": 1, "4": 1, "5": 1, "total": 5}
    assert summary["all"]["questions"] == {"1": 2, "2": 2, "3": 1, "4": 2, "5": 2, "total": 9}


def test_data_summary_table() -> None:
    result = memr1("data-summary", FIXTURE, *FIXTURE_SPLITS)
    assert result.returncode == 0, result.stderr
    table_lines = [line.split("│") for line in result.stdout.splitlines() if "│" in line]
    rows = {cells[1].strip(): [cell.strip() for cell in cells[2:-1]] for cells in table_lines}
    assert rows["turns"] == ["5", "4", "9"]  # train, test, all
    assert rows["evidence dropped unknown"] == ["0", "1", "1"]
    assert "mini-2 $[1].qa[1].evidence[1]: 'D4:4': no turn D4:4" in result.stdout


def test_data_summary_errors_are_one_line(tmp_path: Path) -> None:
    # The paper's default split names conversations the fixture does not have.
    result = memr1("data-summary", FIXTURE)
    assert result.returncode == 1
    assert result.stderr.startswith("memr1 data-summary: error: splits.train: no conversation 'conv-26'")
    broken = tmp_path / "locomo10.json"
    broken.write_text(json.dumps([{"sample_id": "x", "qa": []}]))
    result = memr1("data-summary", broken, "--json")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"memr1 data-summary: error: {broken}: $[0].conversation: missing\n"


def test_serve_refuses_what_an_add_stores_when_there_is_no_manager(tmp_path: Path) -> None:
    result = memr1("serve", "--path", tmp_path / "memories", "--manager-add-text", "model")
    assert result.returncode == 1
    assert result.stderr.startswith("memr1 serve: error: --manager-add-text: there is no Manager (--manager none)")
    assert not (tmp_path / "memories").exists()  # refused before anything was opened


def test_mcp_over_stdio_refuses_http_options_before_opening_anything(tmp_path: Path, capsys) -> None:
    for option in (["--port", "9000"], ["--host", "0.0.0.0"], ["--api-key-env", "KEY"]):
        assert main(["mcp", "--path", str(tmp_path / "memories"), *option]) == 1
        assert capsys.readouterr().err.startswith("memr1 mcp: error: --host / --port / --api-key-env: HTTP options; the stdio transport has none")
    assert not (tmp_path / "memories").exists()


def test_memr1_without_a_command_shows_usage() -> None:
    result = memr1()
    assert result.returncode == 2
    assert "usage: memr1" in result.stderr and "data-summary" in result.stderr


def test_pipeline_keep_archives_the_finished_stages_and_runs_nothing(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    (root / "base-eval").mkdir(parents=True)
    (root / "base-eval" / "STAGE_DONE").write_text("{}\n")  # the demo's first stage, finished
    result = memr1("pipeline", "demo", "--root", root, "--archive", tmp_path / "results", "--keep")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"kept in {tmp_path / 'results'}: base-eval\n"
    assert (tmp_path / "results" / "base-eval" / "STAGE_DONE").read_text() == "{}\n"
    assert sorted(path.name for path in root.iterdir()) == ["base-eval"]  # no stage ran


def test_data_summary_json_on_the_real_file(real_locomo: Path) -> None:
    result = memr1("data-summary", real_locomo, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert {name: split["questions"]["total"] for name, split in summary["splits"].items()} == {
        "train": 152,
        "validation": 81,
        "test": 1307,
    }
    assert summary["splits"]["test"]["questions"] == {"1": 239, "2": 258, "3": 83, "4": 727, "total": 1307}
    dropped = summary["all"]["evidence_dropped_malformed"], summary["all"]["evidence_dropped_unknown"]
    assert dropped == (1, 2)
