"""scripts/lift_report.py on a small fixture of finished runs (two evaluations, one training run),
written the way evaluate.py and train.py write them: the rows, the paired comparison worked by hand,
the training summary, the markdown and the figure."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from memr1.pipeline.report_file import EvalReport

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "lift_report.py"
GOLD = {"q1": ("Where did Ann move?", "Lisbon", 1), "q2": ("What did Bo adopt?", "a dog", 1), "q3": ("When?", "in May", 2)}


def evaluation(directory: Path, answers: dict[str, str], f1: float, operations: dict | None = None) -> Path:
    directory.mkdir(parents=True)
    rows = [{"qid": qid, "conversation_id": "conv-x", "question": question, "gold": gold, "prediction": answers[qid], "category": category}
            for qid, (question, gold, category) in GOLD.items()]
    (directory / "predictions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    scores = {"f1": f1, "bleu1": f1, "em": 0.0, "count": 3.0, "format_error_rate": 0.0, "mean_answer_words": 1.0,
              "distill_recall": 50.0, "distill_recall/cat2": 25.0, "memory_listed": 200 / 3,
              **{f"{key}/cat{c}": f1 for key in ("f1", "bleu1", "em") for c in (1, 2)}, "count/cat1": 2.0, "count/cat2": 1.0}
    settings = {"data": "locomo", "split": "test", "memory": "observation", "wall_time_s": 30.0, "bank_sizes": {"conv-x": 5},
                "bank_recipe": {"policy": "add_all", "writer": {}},
                "answer": {"ckpt": None, "k_per_speaker": 5, "max_new_tokens": 64, "distill": True}}
    if operations is not None:  # reports written before evaluate.py counted them have none
        settings["bank_operations"] = operations
    EvalReport("fixture", scores, {"answer": {"p50_s": 1.0, "p95_s": 2.0}}, settings).write(directory)
    return directory


def training(directory: Path, manager: bool = False) -> Path:
    (directory / "csv").mkdir(parents=True)
    (directory / "curves.json").write_text(json.dumps({"train": {"reward/mean": [[1, 0.1], [2, 0.3]]}, "val": {"val/f1": [[0, 20.0], [2, 25.0]]}}))
    (directory / "csv" / "metrics.csv").write_text(
        "step,reward/mean,time/rollout_s,time/update_s,reward/zero_std_group_frac,response/format_error_rate,train/probe_reward,val/f1\n"
        "0,,,,,,,20.0\n1,0.1,30.0,10.0,0.5,0.25,0.2,\n2,0.3,34.0,12.0,0.0,0.0,,\n2,,,,,,,25.0\n"
    )
    if manager:  # the sampled operations' shares a Manager run logs
        (directory / "csv" / "metrics.csv").write_text(
            "step,reward/mean,time/rollout_s,ops/add_frac,ops/update_frac,ops/delete_frac,ops/noop_frac\n"
            "1,0.1,30.0,0.75,0.0,0.0,0.25\n2,0.3,34.0,1.0,0.0,0.0,0.0\n"
        )
    (directory / "train.log").write_text("[2026-12-02 10:00:00,000][memr1][INFO] - start\n[2026-12-02 10:01:30,000][memr1][INFO] - end\n")
    return directory


def test_the_report_of_a_fixture_run(tmp_path, monkeypatch):
    base = evaluation(tmp_path / "base", {"q1": "Porto", "q2": "a dog", "q3": ""}, 33.33)
    operations = {"ADD": 6, "UPDATE": 1, "DELETE": 1, "NOOP": 2, "malformed": 1, "rejected": 0}
    trained = evaluation(tmp_path / "trained", {"q1": "Lisbon", "q2": "a dog", "q3": "May"}, 88.89, operations)
    run, manager_run = training(tmp_path / "grpo"), training(tmp_path / "manager-grpo", manager=True)
    out = tmp_path / "out"
    spec = importlib.util.spec_from_file_location("lift_report", SCRIPT)
    lift_report = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "lift_report", lift_report)  # its dataclasses look their module up
    spec.loader.exec_module(lift_report)
    monkeypatch.setattr(sys, "argv", [
        str(SCRIPT), "--eval", f"SFT={base}", "--eval", f"SFT -> GRPO={trained}", "--train", f"GRPO={run}", "--train", f"Manager GRPO={manager_run}",
        "--base", "SFT", "--trained", "SFT -> GRPO", "--samples", "3",
        "--json", str(out / "lift.json"), "--markdown-out", str(out / "lift.md"), "--figure", str(out / "curves.png"),
    ])
    lift_report.main()

    report = json.loads((out / "lift.json").read_text())
    assert [row["label"] for row in report["eval"]] == ["SFT", "SFT -> GRPO"]
    assert report["eval"][1]["per_category"]["2"]["count"] == 1
    # Whether the distilling agent kept its memory list, and its distillation, per row and category.
    assert report["eval"][0]["memory_listed_pct"] == pytest.approx(200 / 3)
    assert (report["eval"][0]["distill_recall"], report["eval"][0]["distill_precision"]) == (50.0, None)
    assert report["eval"][0]["per_category"]["2"]["distill_recall"] == 25.0
    # Per question F1: SFT 0, 100, 0; SFT -> GRPO 100, 100, 66.67 ("May" against "in May": P 1, R 1/2).
    (comparison,) = report["comparisons"]
    assert (comparison["a"], comparison["b"], comparison["common"], comparison["changed"]) == ("SFT", "SFT -> GRPO", 3, 2)
    assert comparison["overall"]["f1"]["delta"] == pytest.approx((100 + 0 + 200 / 3) / 3)
    assert [sample["qid"] for sample in report["comparison"]["samples"]] != [] and len(report["comparison"]["samples"]) == 3
    summary, manager_summary = report["train"]
    assert summary["sampled_operation_pct"] is None
    assert manager_summary["sampled_operation_pct"]["ADD"] == {"first_quarter": 75.0, "last_quarter": 100.0}
    assert (summary["steps"], summary["wall_time_s"], summary["best_val"]) == (2, 90.0, {"key": "val/f1", "value": 25.0, "step": 2})
    assert summary["seconds_per_step"] == {"rollout": 32.0, "update": 11.0}
    assert summary["probe_reward_by_step"] == [[1, 0.2]]
    assert summary["zero_std_group_pct"] == {"first_quarter": 50.0, "last_quarter": 0.0}
    markdown = (out / "lift.md").read_text()
    assert "### SFT -> GRPO against SFT (paired, 95% bootstrap interval)" in markdown and "### Training" in markdown
    # The closing table: each row's scores and, for a row with a starting point, its paired ΔF1 from it.
    assert "| SFT | 33.33 | 33.33 | 0.00 |  |  |  |" in markdown
    # Resampling 3 differences (100, 0, 66.67): all three 0 or all three 100 each have chance 1/27 > 2.5%,
    # so the interval is [0, 100] and the row is within noise of its start.
    assert "| SFT -> GRPO | 88.89 | 88.89 | 0.00 | SFT | +55.56 [+0.00, +100.00] (within noise) | 2 of 3 |" in markdown
    assert "| Memory listed % | Distill R | Distill P |" in markdown and "| 66.7 | 50.0 | – |" in markdown
    assert "| 75/0/0/25 → 100/0/0/0 |" in markdown
    # What wrote the banks, as shares of the facts: none known for the first report.
    assert "| add_all | 60.0 / 10.0 / 10.0 / 20.0 (malformed 1) | 5 |" in markdown and "| add_all |  | 5 |" in markdown
    assert (out / "curves.png").stat().st_size > 0


def test_the_report_of_a_pipeline_reads_its_finished_stages(tmp_path, monkeypatch, capsys):
    """`--pipeline` takes the rows, the pairs and the commands from a schedule: finished evaluation
    stages with a report label, finished RL training stages (not SFT's), each `versus`; a stage that
    has not finished is left out and named."""
    root = tmp_path / "runs"
    schedule = tmp_path / "lift.yaml"
    schedule.write_text(f"""root: {root}
overrides:
  evaluate.py: [split=test]
stages:
  - {{name: sft, script: train.py, args: [algo=sft]}}
  - {{name: grpo, script: train.py, args: ["answer.ckpt={{sft}}/policy/last"]}}
  - {{name: test-sft, script: evaluate.py, args: ["ckpt={{sft}}/policy/last"], report: SFT}}
  - {{name: test-grpo, script: evaluate.py, args: ["ckpt={{grpo}}/policy/best"], report: SFT -> GRPO, versus: SFT}}
  - {{name: test-later, script: evaluate.py, report: Later, versus: SFT}}
""")
    (root / "sft").mkdir(parents=True)
    (root / "sft" / "curves.json").write_text(json.dumps({"train": {"sft/loss": [[1, 2.0]]}, "val": {}}))
    training(root / "grpo")
    evaluation(root / "test-sft", {"q1": "Porto", "q2": "a dog", "q3": ""}, 33.33)
    evaluation(root / "test-grpo", {"q1": "Lisbon", "q2": "a dog", "q3": "May"}, 88.89)
    for stage in ("sft", "grpo", "test-sft", "test-grpo"):
        (root / stage / "STAGE_DONE").write_text('{"seconds": 1.0}\n')
    (root / "grpo" / "checkpoints").mkdir()
    (root / "grpo" / "checkpoints" / "last.ckpt").write_text("")  # a resumed run: its command stays as scheduled
    out = tmp_path / "out"
    spec = importlib.util.spec_from_file_location("lift_report", SCRIPT)
    lift_report = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "lift_report", lift_report)
    spec.loader.exec_module(lift_report)
    monkeypatch.setattr(sys, "argv", [
        str(SCRIPT), "--pipeline", str(schedule), "--samples", "3",
        "--json", str(out / "lift.json"), "--markdown-out", str(out / "lift.md"), "--figure", str(out / "curves.png"),
    ])
    lift_report.main()

    report = json.loads((out / "lift.json").read_text())
    assert [row["label"] for row in report["eval"]] == ["SFT", "SFT -> GRPO"]
    assert [(pair["a"], pair["b"]) for pair in report["comparisons"]] == [("SFT", "SFT -> GRPO")]
    assert report["eval"][1]["command"] == f"python evaluate.py split=test ckpt={root}/grpo/policy/best hydra.run.dir={root}/test-grpo"
    (run,) = report["train"]
    assert (run["label"], run["command"]) == ("grpo", f"python train.py answer.ckpt={root}/sft/policy/last run_dir={root}/grpo")
    assert "not finished yet, left out: test-later" in capsys.readouterr().out


def test_a_run_resumed_across_sessions_counts_only_the_time_its_processes_ran(tmp_path, monkeypatch):
    """Two starts of train.py an hour apart: 90 s, then 30 s; the hour between is not the run's, the
    lines its second start logs just before `torch uses` are."""
    spec = importlib.util.spec_from_file_location("lift_report", SCRIPT)
    lift_report = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "lift_report", lift_report)
    spec.loader.exec_module(lift_report)
    log = tmp_path / "train.log"
    log.write_text(
        "[2026-12-02 10:00:00,000][memr1.llm.precision][INFO] - precision bf16\n"
        "[2026-12-02 10:00:00,010][memr1.training][INFO] - torch uses 2 CPU thread(s) of 2 core(s) (threads=None)\n"
        "[2026-12-02 10:01:30,000][memr1.step][INFO] - step 1/4\n"
        "[2026-12-02 11:00:00,000][memr1.llm.precision][INFO] - precision bf16\n"
        "[2026-12-02 11:00:00,002][memr1.training][INFO] - torch uses 2 CPU thread(s) of 2 core(s) (threads=None)\n"
        "[2026-12-02 11:00:30,000][memr1.step][INFO] - step 2/4\n"
    )
    assert lift_report.log_wall_time_s(log) == 120.0


def test_the_tables_go_between_the_marker_lines_of_a_page_and_nowhere_else(tmp_path, monkeypatch):
    """docs/cpu_lift.md holds prose around the generated tables: a rerun replaces only what lies
    between the two marker lines, and a page without them is refused before anything is written."""
    base = evaluation(tmp_path / "base", {"q1": "Porto", "q2": "a dog", "q3": ""}, 33.33)
    trained = evaluation(tmp_path / "trained", {"q1": "Lisbon", "q2": "a dog", "q3": "May"}, 88.89)
    run = training(tmp_path / "grpo")
    spec = importlib.util.spec_from_file_location("lift_report", SCRIPT)
    lift_report = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "lift_report", lift_report)
    spec.loader.exec_module(lift_report)

    def report_into(page: Path) -> None:
        monkeypatch.setattr(sys, "argv", [
            str(SCRIPT), "--eval", f"SFT={base}", "--eval", f"SFT -> GRPO={trained}", "--train", f"GRPO={run}",
            "--base", "SFT", "--trained", "SFT -> GRPO", "--samples", "3", "--json", str(page.with_suffix(".json")),
            "--markdown-out", str(page), "--figure", str(page.with_suffix(".png")),
        ])
        lift_report.main()

    page = tmp_path / "lift.md"
    page.write_text(f"# The lift\n\nProse before.\n\n{lift_report.TABLES_BEGIN}\nstale tables\n{lift_report.TABLES_END}\n\nProse after.\n")
    report_into(page)
    first = page.read_text()
    assert first.startswith("# The lift\n\nProse before.\n\n" + lift_report.TABLES_BEGIN + "\n\n### Every row against its starting point")
    assert first.endswith(lift_report.TABLES_END + "\n\nProse after.\n") and "stale tables" not in first
    report_into(page)
    assert page.read_text() == first  # a rerun on the same runs changes nothing

    prose = tmp_path / "prose.md"
    prose.write_text("# Only prose\n")
    with pytest.raises(SystemExit, match="no .* line before a .* line"):
        report_into(prose)
    assert prose.read_text() == "# Only prose\n" and not prose.with_suffix(".json").exists()
