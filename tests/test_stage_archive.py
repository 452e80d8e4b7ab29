"""A schedule's finished stages kept in a tracked folder and restored from it (memr1.stage_archive):
records written the way evaluate.py and train.py lay out their runs, over the LoCoMo-format fixture.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from memr1.datasets.locomo_file import load_locomo_split
from memr1.llm.loading import checkpoint_chain
from memr1.metrics.lexical import answer_scores
from memr1.pipeline.compare import PREDICTIONS, compare_runs, read_predictions
from memr1.pipeline.report_file import EvalReport
from memr1.schedule import keep_progress, load_schedule, referenced_exports, report_table, restore, run_schedule
from memr1.stage_archive import DONE, PREDICTION_FIELDS, archive_stage, archive_unfinished, restore_stage

FIXTURE = Path(__file__).parent / "fixtures" / "locomo_mini.json"
DATA = {"kind": "locomo", "path": str(FIXTURE), "download": False, "sha256": None, "exclude_categories": [5],
        "splits": {"test": None}}


def fixture_questions():
    return [q for c in load_locomo_split(FIXTURE, "test", sha256=None, download=False, splits={"test": None},
                                         exclude_categories=[5]) for q in c.questions]


def evaluation_stage(directory: Path, answers: dict[str, str] | None = None) -> Path:
    """A finished evaluate.py stage over the fixture's 7 questions: every row as answering.Prediction
    writes it, the reply quoting the memory it lists."""
    directory.mkdir(parents=True)
    rows = []
    for number, question in enumerate(fixture_questions()):
        memory = f"memory {number}: {question.question} -> {question.answer}"
        rows.append({
            "qid": question.qid, "conversation_id": question.conversation_id, "question": question.question,
            "gold": question.answer, "prediction": (answers or {}).get(question.qid, question.answer),
            "category": question.category, "retrieved_ids": [f"m{number}", "m99"], "selected_memories": [memory],
            "format_error": None, "raw_output": f"Memories: {memory}\nAnswer: {question.answer}",
            "latency_s": {"answer": 0.5}, "evidence": list(question.evidence), "selected_ids": [f"m{number}"],
            "distill_recall": 1.0, "distill_precision": 0.5, "evidence_retrieved": 1.0,
            "scores": answer_scores((answers or {}).get(question.qid, question.answer), question.answer),
        })
    (directory / PREDICTIONS).write_text("".join(json.dumps(row) + "\n" for row in rows))
    (directory / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.create({"data": DATA, "split": "test", "conversations": None}), directory / ".hydra" / "config.yaml")
    EvalReport("fixture", {"f1": 100.0, "count": 7.0}, {}, {"split": "test", "data": "locomo"}).write(directory)
    (directory / DONE).write_text(json.dumps({"seconds": 12.5, "code": "abc"}) + "\n")
    return directory


def export(directory: Path, weights: bytes, init: str | None = None) -> Path:
    """A LoRA policy export as ExportPolicy writes one (with its tokenizer), `init` its warm start."""
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text(json.dumps({"r": 8}))
    (directory / "adapter_model.safetensors").write_bytes(weights)
    (directory / "tokenizer.json").write_text("{}")
    if init is not None:
        (directory / "warm_start.json").write_text(json.dumps({"init": init}) + "\n")
    return directory


def test_an_evaluation_record_holds_no_dataset_text_and_restores_the_same_scores(tmp_path):
    stage = evaluation_stage(tmp_path / "runs" / "test-sft")
    record = archive_stage(stage, tmp_path / "results" / "test-sft", tmp_path / "runs")

    kept = sorted(str(path.relative_to(record)) for path in record.rglob("*") if path.is_file())
    assert kept == [".hydra/config.yaml", DONE, PREDICTIONS, "report.json"]
    text = "\n".join(path.read_text() for path in record.rglob("*") if path.is_file())
    for question in fixture_questions():
        assert question.question not in text  # no question, no quoted memory, no raw reply
    rows = [json.loads(line) for line in (record / PREDICTIONS).read_text().splitlines()]
    assert all(set(row) == set(PREDICTION_FIELDS) for row in rows)

    restored = tmp_path / "elsewhere" / "test-sft"
    restore_stage(record, restored, tmp_path / "elsewhere")
    original, back = read_predictions(stage), read_predictions(restored)
    dropped = {"selected_memories", "raw_output", "retrieved_ids"}
    assert back == {qid: {key: value for key, value in row.items() if key not in dropped} for qid, row in original.items()}
    comparison = compare_runs(stage, restored)
    assert (comparison.common, comparison.changed, comparison.overall["f1"].interval.delta) == (7, 0, 0.0)
    assert json.loads((restored / DONE).read_text()) == {"seconds": 12.5, "code": "abc"}


def test_a_record_of_other_questions_is_refused_by_name(tmp_path):
    stage = evaluation_stage(tmp_path / "runs" / "test-sft")
    record = archive_stage(stage, tmp_path / "results" / "test-sft", tmp_path / "runs")
    lines = (record / PREDICTIONS).read_text().splitlines()
    (record / PREDICTIONS).write_text("\n".join([*lines, json.dumps({"qid": "mini-9/q0", "prediction": "x"})]) + "\n")
    with pytest.raises(ValueError, match=r"predictions.jsonl: qid 'mini-9/q0' is not a question of the dataset"):
        restore_stage(record, tmp_path / "elsewhere" / "test-sft", tmp_path / "elsewhere")
    assert not (tmp_path / "elsewhere" / "test-sft" / DONE).exists()  # not restored: retried next time


def test_a_training_record_keeps_the_named_exports_and_their_chain_wherever_the_root_is(tmp_path):
    runs = tmp_path / "runs"
    sft = runs / "sft"
    export(sft / "policy" / "last", b"sft weights")
    (sft / DONE).write_text("{}\n")
    grpo = runs / "grpo"
    export(grpo / "policy" / "best", b"best weights", init=str((sft / "policy" / "last").resolve()))
    export(grpo / "policy" / "last", b"last weights", init=str((sft / "policy" / "last").resolve()))
    (grpo / "csv").mkdir()
    (grpo / "csv" / "metrics.csv").write_text("step,reward/mean\n1,0.5\n")
    (grpo / "curves.json").write_text("{}")
    (grpo / "samples.jsonl").write_text('{"response": "quotes the conversation"}\n')
    (grpo / DONE).write_text("{}\n")
    archive_stage(sft, tmp_path / "results" / "sft", runs, ["policy/last"])
    record = archive_stage(grpo, tmp_path / "results" / "grpo", runs, ["policy/best"])

    kept = sorted(str(path.relative_to(record)) for path in record.rglob("*") if path.is_file())
    assert kept == [DONE, "csv/metrics.csv", "curves.json", "policy/best/adapter_config.json",
                    "policy/best/adapter_model.safetensors", "policy/best/warm_start.json"]
    assert json.loads((record / "policy/best/warm_start.json").read_text()) == {"init": "{root}/sft/policy/last"}
    # Read from the archive itself (a clean clone, nothing restored), the chain resolves inside it.
    assert checkpoint_chain(record / "policy" / "best") == [(tmp_path / "results" / "sft" / "policy" / "last").resolve(),
                                                            record / "policy" / "best"]

    moved = tmp_path / "another" / "clone" / "runs"
    for name in ("sft", "grpo"):
        restore_stage(tmp_path / "results" / name, moved / name, moved)
    best = moved / "grpo" / "policy" / "best"
    assert checkpoint_chain(best) == [(moved / "sft" / "policy" / "last").resolve(), best]
    assert (best / "adapter_model.safetensors").read_bytes() == b"best weights"


def test_a_shipped_warm_start_and_an_unfinished_stage(tmp_path):
    stage = tmp_path / "runs" / "grpo"
    export(stage / "policy" / "best", b"w", init="trained:answer-agent-sft")
    with pytest.raises(ValueError, match="no STAGE_DONE: only a finished stage is archived"):
        archive_stage(stage, tmp_path / "results" / "grpo", tmp_path / "runs", ["policy/best"])
    (stage / DONE).write_text("{}\n")
    record = archive_stage(stage, tmp_path / "results" / "grpo", tmp_path / "runs", ["policy/best"])
    assert json.loads((record / "policy/best/warm_start.json").read_text()) == {"init": "trained:answer-agent-sft"}
    # Archived again (a rerun): the new record replaces the old whole, and nothing is left beside it.
    (stage / "policy" / "best" / "adapter_model.safetensors").write_bytes(b"newer")
    archive_stage(stage, record, tmp_path / "runs", ["policy/best"])
    assert (record / "policy/best/adapter_model.safetensors").read_bytes() == b"newer"
    assert sorted(path.name for path in record.parent.iterdir()) == ["grpo"]


def test_the_schedule_keeps_finished_stages_and_restores_kept_ones_instead_of_running_them(tmp_path):
    """Two evaluation stages: one finished in this run root (kept at the start), one only in the
    archive, as on a new machine (restored, not run); the closing table reads both."""
    spec = tmp_path / "two.yaml"
    spec.write_text(
        "stages:\n"
        "  - {name: test-base, script: evaluate.py, report: base}\n"
        "  - {name: test-sft, script: evaluate.py, report: SFT, versus: base}\n"
    )
    schedule = load_schedule(str(spec), root=str(tmp_path / "runs"), archive=str(tmp_path / "results"))
    evaluation_stage(tmp_path / "runs" / "test-base", answers={q.qid: "no" for q in fixture_questions()})
    other_machine = tmp_path / "other" / "test-sft"
    archive_stage(evaluation_stage(other_machine), tmp_path / "results" / "test-sft", tmp_path / "other")

    assert run_schedule(schedule) == 0  # nothing run: evaluate.py would fail on this config
    assert (tmp_path / "results" / "test-base" / DONE).is_file()
    assert read_predictions(tmp_path / "runs" / "test-sft").keys() == read_predictions(other_machine).keys()
    # Base answers "no" to every question (F1 0), SFT the gold answer (F1 100).
    assert "SFT beats base: F1 +100.00 [+100.00, +100.00]; 7 of 7 answers differ." in report_table(schedule).splitlines()


def test_keeping_needs_an_archive():
    with pytest.raises(ValueError, match="pipeline demo: no archive to keep stages in"):
        keep_progress(load_schedule("demo"))


def test_only_the_exports_a_later_stage_names_are_kept():
    schedule = load_schedule("cpu_lift")
    exports = referenced_exports(schedule)
    assert exports["answer-sft"] == ["policy/last"]
    assert exports["answer-sft-grpo"] == ["policy/best"]
    assert exports["test-answer-sft"] == []


def test_an_unfinished_record_is_restored_only_where_it_got_further_than_the_run_root(tmp_path):
    spec = tmp_path / "one.yaml"
    spec.write_text("stages:\n  - {name: sft, script: train.py, args: [algo=sft]}\n")
    schedule = load_schedule(str(spec), root=str(tmp_path / "runs"), archive=str(tmp_path / "results"))
    stage = schedule.stages[0]
    elsewhere = tmp_path / "elsewhere" / "sft"
    (elsewhere / "checkpoints").mkdir(parents=True)
    torch.save({"loops": {}, "state_dict": {}}, elsewhere / "checkpoints" / "interrupted-step=3.ckpt")
    export(elsewhere / "policy" / "best", b"best so far")
    archive_unfinished(elsewhere, tmp_path / "results" / "sft", tmp_path / "elsewhere")

    local = tmp_path / "runs" / "sft" / "checkpoints"
    local.mkdir(parents=True)
    torch.save({"loops": {}, "state_dict": {}}, local / "step=5.ckpt")
    assert not restore(schedule, stage)  # this machine's run is further: kept as it is
    assert sorted(path.name for path in local.iterdir()) == ["step=5.ckpt"]

    shutil.rmtree(tmp_path / "runs")
    assert restore(schedule, stage)
    assert sorted(path.name for path in local.iterdir()) == ["interrupted-step=3.ckpt"]
    assert (tmp_path / "runs" / "sft" / "policy" / "best" / "adapter_model.safetensors").read_bytes() == b"best so far"
    assert not (tmp_path / "runs" / "sft" / DONE).exists()  # it runs, resuming from step 3


def test_a_kept_stage_is_kept_again_when_a_stage_names_an_export_its_record_lacks(tmp_path):
    """A schedule edited after its training stage was kept (with policy/best) to score policy/last:
    the next start keeps the stage again with the export now named, so a clean clone can run that
    evaluation from the archive."""
    runs, results = tmp_path / "runs", tmp_path / "results"
    export(runs / "rl" / "policy" / "best", b"best weights")
    export(runs / "rl" / "policy" / "last", b"last weights")
    (runs / "rl" / DONE).write_text("{}\n")
    archive_stage(runs / "rl", results / "rl", runs, ["policy/best"])
    evaluation_stage(runs / "test-rl")
    spec = tmp_path / "edited.yaml"
    spec.write_text(
        "stages:\n"
        "  - {name: rl, script: train.py}\n"
        "  - {name: test-rl, script: evaluate.py, args: ['manager.ckpt={rl}/policy/last'], report: RL}\n"
    )
    schedule = load_schedule(str(spec), root=str(runs), archive=str(results))
    assert not (results / "rl" / "policy" / "last").exists()

    assert run_schedule(schedule) == 0  # both stages done before: nothing run
    assert (results / "rl" / "policy" / "last" / "adapter_model.safetensors").read_bytes() == b"last weights"
    assert (results / "test-rl" / DONE).is_file()
    assert keep_progress(schedule) == []  # everything named is kept now
