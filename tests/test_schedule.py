"""`memr1 pipeline`: schedules load with clear errors, stages resume after a kill at a stage boundary,
and the closing table says whether the trained rows beat the base."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from memr1.apps import CONFIG_DIR
from memr1.llm.loading import load_tokenizer
from memr1.llm.testing import save_tiny_checkpoint
from memr1.preflight import EVALUATE_GROUPS, TRAIN_GROUPS, ConfigError, check_typed_groups
from memr1.provenance import code_version
from memr1.pipeline.report_file import EvalReport
from memr1.schedule import DONE, STAGE_CONFIG, compose_config, keep_progress, load_schedule, prepare_stage, report_table, stage_arguments
from memr1.stage_archive import UNFINISHED
from tests.processes import ROOT, environment, wait_for_line

# The alternating schedule, sized for a tiny random model: every stage runs in seconds.
TINY_ALTERNATING = (
    "answer.k_per_speaker=1", "answer.max_new_tokens=6", "train.py:algo.micro_batch_size=2",
    "train.py:++algo.group_size=2", "train.py:data_loader.states_per_step=2", "train.py:data_loader.max_steps=2",
    "train.py:data_loader.val_check_interval=2", "train.py:data_loader.limit_val_batches=1",
    "train.py:data_loader.val_batch_size=2", "train.py:data_loader.probe_states=0",
    "train.py:checkpoint.every_n_train_steps=1", "train.py:logging.wandb=false", "train.py:lora.enabled=true",
    "evaluate.py:max_questions=2", "evaluate.py:answer.k_per_speaker=1", "evaluate.py:answer.max_new_tokens=4",
    # The tiny model never writes a whole operation: at the default 128 tokens, building the trained
    # Manager's banks for the answer stages decoded ~45k tokens (most of this test's minutes)
    "manager.max_new_tokens=6",
)


def test_an_unknown_schedule_lists_the_known_ones():
    with pytest.raises(FileNotFoundError, match=r"known schedules: \[.*'alternating'.*'demo'"):
        load_schedule("alternate")


def test_schedule_errors_name_the_file_and_stage(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("stages:\n  - {name: a, script: train.py}\n  - {name: a, script: evaluate.py}\n")
    with pytest.raises(ValueError, match=r"bad.yaml: stages\[1\]: the stage name 'a' is used twice"):
        load_schedule(str(path))
    path.write_text("stages:\n  - {name: sft-weighed-1.5, script: train.py}\n")
    with pytest.raises(ValueError, match=r"stages\[0\]: the stage name 'sft-weighed-1.5' may hold only letters"):
        load_schedule(str(path))
    path.write_text("stages:\n  - {name: a, script: run.py}\n")
    with pytest.raises(ValueError, match=r"stages\[0\]: a stage needs a name and a script"):
        load_schedule(str(path))
    path.write_text("stages:\n  - {name: a, script: train.py, args: ['answer.ckpt={sft}/policy/best']}\n")
    with pytest.raises(ValueError, match="stage a: 'sft' names no stage"):
        stage_arguments(load_schedule(str(path)), load_schedule(str(path)).stages[0])


def test_stage_arguments_fill_in_directories_and_route_overrides(tmp_path):
    schedule = load_schedule("alternating", root=str(tmp_path), overrides=["seed=3", "train.py:lora.enabled=true", "evaluate.py:split=test"])
    grpo = next(s for s in schedule.stages if s.name == "manager-grpo")
    args = stage_arguments(schedule, grpo)
    assert f"manager.ckpt={tmp_path}/manager-sft/policy/best" in args
    assert {"seed=3", "lora.enabled=true", f"run_dir={tmp_path}/manager-grpo"} <= set(args)
    assert "split=test" not in args and "ckpt_path=last" not in args
    (tmp_path / "manager-grpo" / "checkpoints").mkdir(parents=True)
    (tmp_path / "manager-grpo" / "checkpoints" / "step=1.ckpt").write_bytes(b"x")
    assert stage_arguments(schedule, grpo)[-1] == "ckpt_path=last"  # a stopped stage resumes
    evaluation = stage_arguments(schedule, schedule.stages[-1])
    assert {"seed=3", "split=test", f"hydra.run.dir={tmp_path}/evaluate"} <= set(evaluation)
    assert "lora.enabled=true" not in evaluation


def test_a_shared_algo_setting_reaches_only_the_stages_whose_algorithm_reads_it_and_an_own_one_is_refused(tmp_path):
    schedule = load_schedule("alternating", root=str(tmp_path), overrides=["train.py:algo.group_size=4"])
    sft = next(s for s in schedule.stages if s.name == "manager-sft")
    grpo = next(s for s in schedule.stages if s.name == "manager-grpo")
    assert "algo.group_size=4" not in stage_arguments(schedule, sft)  # SFT samples no group
    assert "algo.group_size=4" in stage_arguments(schedule, grpo)
    path = tmp_path / "own.yaml"
    path.write_text("stages:\n  - {name: sft, script: train.py, args: [algo=sft, algo.group_size=4]}\n")
    with pytest.raises(ConfigError, match="algo.group_size=4: algo=sft does not use algo.group_size"):
        stage_arguments(load_schedule(str(path), root=str(tmp_path)), load_schedule(str(path)).stages[0])


def test_a_stage_runs_from_the_config_the_schedule_composed_once(tmp_path):
    """The stage's app reads `<stage>/stage.yaml` and composes nothing of its own: the file holds what
    its overrides compose to, interpolations unresolved (`${now:...}` is the stage's start time)."""
    schedule = load_schedule("alternating", root=str(tmp_path), overrides=["seed=3"])
    grpo = next(s for s in schedule.stages if s.name == "manager-grpo")
    args, command = prepare_stage(schedule, grpo)
    directory = (tmp_path / "manager-grpo").resolve()
    assert command[1:] == ["-m", "memr1.apps.train", "--config-dir", str(directory), "--config-name", STAGE_CONFIG]
    written = OmegaConf.load(directory / f"{STAGE_CONFIG}.yaml")
    assert written == compose_config("train.py", args)
    assert written.seed == 3 and written.run_dir == f"{tmp_path}/manager-grpo" and OmegaConf.to_container(written.hydra)["run"]["dir"] == "${run_dir}"
    # Hydra, as the stage's app runs it, composes the file to the same config.
    with initialize_config_dir(config_dir=str(directory), version_base="1.3"):
        assert OmegaConf.to_container(compose(STAGE_CONFIG), resolve=False) == OmegaConf.to_container(
            OmegaConf.masked_copy(written, [key for key in written if key != "hydra"]), resolve=False
        )


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONFIG_DIR / "pipeline").glob("*.yaml")))
def test_every_stage_of_every_schedule_composes_and_passes_the_typed_checks(name, tmp_path):
    """A misspelt key or a refused value in a late stage's arguments is found now, not hours into
    the schedule (the checkpoints the stages name do not exist yet: those checks run at the stage)."""
    schedule = load_schedule(name, root=str(tmp_path))
    for stage in schedule.stages:
        overrides = [arg for arg in stage_arguments(schedule, stage) if not arg.startswith(("run_dir=", "hydra."))]
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose(stage.script.removesuffix(".py"), overrides=overrides)
        check_typed_groups(cfg, TRAIN_GROUPS if stage.script == "train.py" else EVALUATE_GROUPS)
        if stage.script == "train.py" and cfg.model.get("credit") == "counterfactual":
            assert cfg.algo.name == "reinforce", stage.name


GOLDS = ("Rex", "2022", "three", "Paris")


def write_report(directory: Path, f1: float, words: float, answers: tuple[str, ...], split: str = "validation") -> None:
    """A finished evaluation stage: report.json's scores and the predictions.jsonl they came from."""
    directory.mkdir(parents=True)
    scores = {"f1": f1, "bleu1": f1 / 2, "em": 0.0, "format_error_rate": 50.0, "mean_answer_words": words, "count": 4}
    EvalReport("an evaluation", scores, {}, {"split": split, "wall_time_s": 12.5}).write(directory)
    rows = [{"qid": f"q{i}", "gold": gold, "prediction": answer, "category": 1} for i, (answer, gold) in enumerate(zip(answers, GOLDS))]
    (directory / "predictions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_the_closing_table_sets_each_row_against_the_base_with_paired_intervals(tmp_path):
    spec = tmp_path / "base_sft_grpo.yaml"
    spec.write_text(
        "stages:\n"
        "  - {name: base-eval, script: evaluate.py, report: base}\n"
        "  - {name: sft-eval, script: evaluate.py, report: SFT, versus: base}\n"
        "  - {name: answer-grpo, script: train.py}\n"
        "  - {name: grpo-eval, script: evaluate.py, report: SFT+GRPO, versus: SFT}\n"
    )
    schedule = load_schedule(str(spec), root=str(tmp_path))
    write_report(tmp_path / "base-eval", 0.0, 14.0, ("no", "no", "no", "no"))
    write_report(tmp_path / "sft-eval", 100.0, 3.0, GOLDS)
    write_report(tmp_path / "grpo-eval", 50.0, 2.5, ("Rex", "2022", "no", "no"))
    (tmp_path / "answer-grpo" / "csv").mkdir(parents=True)
    (tmp_path / "answer-grpo" / "csv" / "metrics.csv").write_text(
        "step,reward/mean,train/probe_reward\n1,0.1,0.171\n2,0.2,\n6,0.3,0.2\n"
    )
    lines = report_table(schedule).splitlines()
    assert lines.pop() == "answer-grpo: probe reward (the same training questions, sampled with one seed) 0.171 at step 1, 0.200 at step 6."
    assert lines[2] == "| base | 0.00 | 0.00 | 0.00 | 50.00 | 14.00 | base | 12.5 |"
    # Every question 0 -> 100: each resample's mean is 100, the interval [100, 100].
    assert lines[3] == "| SFT | 100.00 | 50.00 | 0.00 | 50.00 | 3.00 | +100.00 [+100.00, +100.00] | 12.5 |"
    assert "4 validation questions" in lines[6]
    assert "SFT beats base: F1 +100.00 [+100.00, +100.00]; 4 of 4 answers differ." in lines
    # Differences [100, 100, 0, 0]: a resample draws no 100 with probability 1/16 > 2.5%, so the
    # interval reaches 0 (and 100 at the top): within noise, however large the mean.
    assert "SFT+GRPO is within noise of base: F1 +50.00 [+0.00, +100.00]; 2 of 4 answers differ." in lines
    # GRPO started from SFT: against its own warm start, differences [0, 0, -100, -100].
    assert lines[-1] == "SFT+GRPO is within noise of SFT: F1 -50.00 [-100.00, +0.00]; 2 of 4 answers differ."
    # SFT's `versus: base` names the row the table already sets it against: no second sentence.
    assert sum(line.startswith("SFT beats base") for line in lines) == 1


def test_rows_of_another_split_get_their_own_table_and_base(tmp_path):
    """Validation and test rows in one schedule share no question: each split is set against its own
    first row (the test rows answer different questions, by qid, from the validation ones)."""
    spec = tmp_path / "two_splits.yaml"
    spec.write_text(
        "stages:\n"
        "  - {name: val-base, script: evaluate.py, report: val base}\n"
        "  - {name: val-oracle, script: evaluate.py, report: val oracle}\n"
        "  - {name: test-base, script: evaluate.py, report: test base}\n"
        "  - {name: test-oracle, script: evaluate.py, report: test oracle}\n"
    )
    schedule = load_schedule(str(spec), root=str(tmp_path / "runs"))
    write_report(tmp_path / "runs" / "val-base", 0.0, 1.0, ("no", "no", "no", "no"))
    write_report(tmp_path / "runs" / "val-oracle", 100.0, 1.0, GOLDS)
    write_report(tmp_path / "runs" / "test-base", 0.0, 1.0, ("no", "no", "no", "no"), split="test")
    write_report(tmp_path / "runs" / "test-oracle", 100.0, 1.0, GOLDS, split="test")
    for name in ("test-base", "test-oracle"):  # other questions than validation's
        path = tmp_path / "runs" / name / "predictions.jsonl"
        path.write_text(path.read_text().replace('"qid": "q', '"qid": "t'))
    lines = report_table(schedule).splitlines()
    assert "| test base | 0.00 | 0.00 | 0.00 | 50.00 | 1.00 | base | 12.5 |" in lines
    assert "4 validation questions, greedy decoding, the same questions and banks in every row; Δ paired over the questions, its 95% interval by bootstrap." in lines
    assert "4 test questions, greedy decoding, the same questions and banks in every row; Δ paired over the questions, its 95% interval by bootstrap." in lines
    assert "val oracle beats val base: F1 +100.00 [+100.00, +100.00]; 4 of 4 answers differ." in lines
    assert "test oracle beats test base: F1 +100.00 [+100.00, +100.00]; 4 of 4 answers differ." in lines


def test_versus_must_name_an_earlier_report(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        "stages:\n"
        "  - {name: a, script: evaluate.py, report: base, versus: SFT}\n"
        "  - {name: b, script: evaluate.py, report: SFT}\n"
    )
    with pytest.raises(ValueError, match=r"bad.yaml: stages\[0\]: versus: 'SFT' is not the report label of an earlier stage"):
        load_schedule(str(spec))


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model", load_tokenizer("embedded:smollm2-135m-instruct"))


def pipeline_command(backbone: Path, root: Path, banks: Path) -> list[str]:
    return [
        sys.executable, "-m", "memr1.cli", "pipeline", "alternating", "--root", str(root),
        f"backbone.name_or_path={backbone}", f"banks.dir={banks}", *TINY_ALTERNATING,
    ]


@pytest.mark.slow  # a subprocess
@pytest.mark.timeout(900)  # 1:23 alone; five real stages and a rerun, on a machine that may be loaded
def test_the_alternating_pipeline_resumes_after_a_kill_at_a_stage_boundary(backbone, tmp_path):
    root, log = tmp_path / "run", tmp_path / "log.txt"
    command = pipeline_command(backbone, root, tmp_path / "banks")
    first_done = root / "manager-sft" / DONE
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=environment(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 900  # generous: a loaded machine runs this 3x slower than its 1:23
        while process.poll() is None and not first_done.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert first_done.exists(), log.read_text()[-3000:]
        os.killpg(process.pid, signal.SIGKILL)  # the runner and whatever stage it had begun
        process.wait(timeout=60)
    assert not (root / "manager-grpo" / DONE).exists()
    finished_first = first_done.read_text()
    metrics = (root / "manager-sft" / "csv" / "metrics.csv").read_text()

    rerun = subprocess.run(command, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
    assert "stage 1/5 manager-sft: done before, skipped" in rerun.stderr
    assert first_done.read_text() == finished_first
    assert (root / "manager-sft" / "csv" / "metrics.csv").read_text() == metrics  # not trained again
    for stage in ("manager-grpo", "answer-sft", "answer-grpo", "evaluate"):
        assert json.loads((root / stage / DONE).read_text())["code"] == code_version(), stage  # the commit that ran it
    # Each RL stage started from its SFT stage's export, and the answer stages used the trained Manager.
    assert json.loads((root / "answer-grpo" / "policy" / "last" / "warm_start.json").read_text())["init"].endswith("answer-sft/policy/best")
    assert "| alternating |" in rerun.stdout
    print({stage: json.loads((root / stage / DONE).read_text())["seconds"] for stage in ("manager-grpo", "answer-sft", "answer-grpo", "evaluate")})


@pytest.mark.slow  # a subprocess
def test_sigterm_reaches_the_running_stage_which_checkpoints_and_resumes_on_another_machine(backbone, tmp_path):
    """Stopped mid-run, the stage is kept unfinished in the archive (`--keep`); on "another machine"
    (the run root gone) the rerun restores its checkpoint and resumes it, and keeps the finished stage."""
    schedule = tmp_path / "one.yaml"
    schedule.write_text(
        "stages:\n"
        "  - name: answer-sft\n    script: train.py\n"
        "    args: [model=answer, algo=sft, data_loader.max_steps=6, data_loader.limit_val_batches=0]\n"
    )
    root, log, results = tmp_path / "run", tmp_path / "log.txt", tmp_path / "results"
    overrides = [f"backbone.name_or_path={backbone}", f"banks.dir={tmp_path / 'banks'}", *TINY_ALTERNATING]
    command = [sys.executable, "-m", "memr1.cli", "pipeline", str(schedule), "--root", str(root), "--archive", str(results), *overrides]
    checkpoints = root / "answer-sft" / "checkpoints"
    with log.open("w") as out:
        # The stage waits at its 3rd step until the signal reaches it (a fault point, memr1/faults.py):
        # it cannot finish before the signal, however fast the machine.
        process = subprocess.Popen(command, cwd=ROOT, env=environment("train_step:3:WAIT"), stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        wait_for_line(process, log, "memr1 fault: WAIT at train_step #3")
        process.send_signal(signal.SIGTERM)  # to the runner only, as a scheduler sends it
        assert process.wait(timeout=120) == 128 + signal.SIGTERM, log.read_text()[-3000:]
    (interrupted,) = checkpoints.glob("interrupted-step=*.ckpt")
    assert not (root / "answer-sft" / DONE).exists()

    # `memr1 pipeline ... --keep`, in this process (a subprocess would only add its imports)
    assert keep_progress(load_schedule(str(schedule), str(root), overrides, str(results))) == ["answer-sft"]
    record = results / "answer-sft"
    assert json.loads((record / UNFINISHED).read_text())["checkpoint"] == interrupted.name
    assert (record / "checkpoints" / interrupted.name).read_bytes() == interrupted.read_bytes()

    shutil.rmtree(root)  # another machine: nothing of the run but the archive
    rerun = subprocess.run(command, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
    assert "stage 1/1 answer-sft: its checkpoint restored from" in rerun.stderr
    assert "ckpt_path=last" in rerun.stderr and (root / "answer-sft" / DONE).exists()
    steps = [line.split(",")[0] for line in (root / "answer-sft" / "csv" / "metrics.csv").read_text().splitlines()[1:]]
    assert steps == [str(step) for step in range(1, 7)]  # every step logged once across the two machines
    # Kept finished: the record replaced whole, without the checkpoint it no longer needs.
    assert (record / DONE).is_file() and not (record / UNFINISHED).exists() and not (record / "checkpoints").exists()
