"""A schedule's stages kept in git, so that a schedule spanning sessions outlives its machine.

`runs/` lives on one machine; a session may continue on another, with nothing of it. A schedule with
an `archive:` folder (conf/pipeline/cpu_lift.yaml: `results/cpu_lift`, tracked) copies each stage's
record there as the stage finishes, and copies it back into a run root that lacks the stage, which
then counts as done. A training stage still running can be kept too (`memr1 pipeline NAME --keep`,
with the schedule stopped or paused): its newest checkpoint, which a new machine resumes from.
Committing the folder is what carries a schedule's progress across machines.

A record holds what the closing table, `scripts/lift_report.py`, `scripts/ship_agent.py`, the later
stages and a resumed run read, and nothing of the dataset (LoCoMo is CC BY-NC):

- every finished stage: `STAGE_DONE` (how long it ran, on which code);
- a training stage: `curves.json`, `training_curves.png`, `csv/metrics.csv`, `train.log` (metrics and
  progress lines), and each policy export a later stage names (`{stage}/policy/best`) as its LoRA
  adapter and warm-start pointer (the tokenizer is the backbone's); a pointer into the run root is
  kept relative to it, so the chain holds wherever the root is;
- an unfinished training stage: the same files, its newest checkpoint (trainable weights and optimiser
  state only, ~11 MB for a LoRA policy) and its `policy/best` so far, marked `STAGE_UNFINISHED`;
- an evaluation: `report.json`, Hydra's `.hydra/config.yaml`, and `predictions.jsonl` with only the
  agent's side of each row (`PREDICTION_FIELDS`): the question, gold answer and evidence are joined
  back from the dataset by qid on restore, and the reply's raw text, its listed memories and the
  retrieved ids (which quote or point into the conversations) stay out; report.json keeps the share of
  replies that listed a memory.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from memr1.pipeline.compare import PREDICTIONS
from memr1.pipeline.decisions import DECISIONS
from memr1.pipeline.report_file import REPORT_FILE
from memr1.provenance import code_version
from memr1.shipped import ROOT_PLACEHOLDER, WARM_START_FILE, is_shipped, resolve_root

DONE = "STAGE_DONE"
UNFINISHED = "STAGE_UNFINISHED"  # a training stage kept mid-run: {"checkpoint": its file, "step": N}
TRAINING_FILES = ("curves.json", "training_curves.png", "csv/metrics.csv", "train.log")
CHECKPOINTS = "checkpoints"
BEST_EXPORT = "policy/best"  # a resumed run keeps it unless it validates better
EVALUATION_FILES = (REPORT_FILE, ".hydra/config.yaml", DECISIONS)  # decisions: events by fact index, no text
EXPORT_FILES = ("adapter_config.json", "adapter_model.safetensors")
# The agent's side of a prediction row (memr1.pipeline.answering.Prediction); the rest is the dataset's.
PREDICTION_FIELDS = ("qid", "conversation_id", "prediction", "category", "format_error", "latency_s",
                     "selected_ids", "distill_recall", "distill_precision", "evidence_retrieved", "scores")
# Joined back from the dataset's question of the same qid.
QUESTION_FIELDS = {"question": "question", "gold": "answer", "evidence": "evidence"}


def read_done(stage_dir: Path) -> dict[str, Any]:
    """A finished stage's `STAGE_DONE` (`seconds`, `code`; a kept-from-elsewhere stage's `note`)."""
    return _read_json_object(stage_dir / DONE)


def archive_stage(stage_dir: Path, record_dir: Path, root: Path, exports: Iterable[str] = ()) -> Path:
    """Write the finished `stage_dir`'s record to `record_dir` (see the module docstring), replacing any
    earlier one whole. `exports`: the policy exports under the stage to keep (`policy/best`); `root`:
    the schedule's run root, against which warm-start pointers are made relative."""
    if not (stage_dir / DONE).is_file():
        raise ValueError(f"{stage_dir}: no {DONE}: only a finished stage is archived (or an unfinished training stage's checkpoint)")

    def write(staging: Path) -> None:
        _copy_present(stage_dir, staging, (DONE, *TRAINING_FILES, *EVALUATION_FILES))
        if (stage_dir / PREDICTIONS).is_file():
            _write_jsonl(staging / PREDICTIONS, (_agent_side(row) for row in _read_jsonl(stage_dir / PREDICTIONS)))
        for export in exports:
            _archive_export(stage_dir / export, staging / export, root)

    return _replace(record_dir, write)


def archive_unfinished(stage_dir: Path, record_dir: Path, root: Path) -> Path:
    """Write the record of a training stage still running (or stopped) at its newest checkpoint,
    replacing any earlier one whole; restored, the stage resumes from that checkpoint."""
    from memr1.callbacks.checkpoints import checkpoint_step, latest_checkpoint  # torch: only here

    if (stage_dir / DONE).is_file():
        raise ValueError(f"{stage_dir}: finished; archive it whole (archive_stage)")
    checkpoint = latest_checkpoint(stage_dir / CHECKPOINTS)
    if checkpoint is None:
        raise ValueError(f"{stage_dir}: no checkpoint to resume from; nothing to keep")

    def write(staging: Path) -> None:
        _copy_present(stage_dir, staging, TRAINING_FILES)
        _copy(checkpoint, staging / CHECKPOINTS / checkpoint.name)
        if (stage_dir / BEST_EXPORT / EXPORT_FILES[0]).is_file():
            _archive_export(stage_dir / BEST_EXPORT, staging / BEST_EXPORT, root)
        marker = {"checkpoint": checkpoint.name, "step": checkpoint_step(checkpoint), "code": code_version()}
        (staging / UNFINISHED).write_text(json.dumps(marker) + "\n")

    return _replace(record_dir, write)


def unfinished_step(record_dir: Path) -> int | None:
    """The step an unfinished stage's record resumes from; None when the record is not one."""
    if not (record_dir / UNFINISHED).is_file():
        return None
    return int(_read_json_object(record_dir / UNFINISHED)["step"])


def restore_stage(record_dir: Path, stage_dir: Path, root: Path) -> None:
    """Lay `record_dir`'s stage into `stage_dir` (which must hold no finished stage): predictions joined
    with their questions from the dataset that the evaluation's config names, warm-start pointers made
    absolute under `root`. A finished record's `STAGE_DONE` is written last, so an interrupted restore
    is redone next time; an unfinished one's checkpoint lands in `checkpoints/`, where the stage's
    next run resumes from it (the files it replaces are the same run's, older)."""
    if (stage_dir / DONE).is_file():
        raise ValueError(f"{stage_dir}: already finished; a record is restored only into an unfinished stage")
    if stage_dir.exists():
        shutil.rmtree(stage_dir)  # an attempt that got less far than the record (the caller checks)
    for path in sorted(record_dir.rglob("*")):
        relative = path.relative_to(record_dir)
        if path.is_dir() or relative.name in (DONE, UNFINISHED, PREDICTIONS):
            continue
        if relative.name == WARM_START_FILE:
            _restore_pointer(path, stage_dir / relative, root)
        else:
            _copy(path, stage_dir / relative)
    if (record_dir / PREDICTIONS).is_file():
        questions = _questions(record_dir / ".hydra" / "config.yaml")
        rows = (_with_question(row, questions, record_dir / PREDICTIONS) for row in _read_jsonl(record_dir / PREDICTIONS))
        _write_jsonl(stage_dir / PREDICTIONS, rows)
    if (record_dir / DONE).is_file():
        _copy(record_dir / DONE, stage_dir / DONE)


# --- the parts -------------------------------------------------------------------------------------


def _replace(record_dir: Path, write: Callable[[Path], None]) -> Path:
    """Run `write(staging)` on a new folder beside `record_dir`, then rename it into place: a reader
    (or a commit) never sees half of a record."""
    record_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{record_dir.name}.", dir=record_dir.parent))
    try:
        write(staging)
        previous = record_dir.with_name(f".{record_dir.name}.replaced")
        if record_dir.exists():
            record_dir.rename(previous)
        staging.rename(record_dir)
        shutil.rmtree(previous, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return record_dir


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error.msg})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: not a JSON object")
    return value


def _copy_present(source_dir: Path, target_dir: Path, names: Iterable[str]) -> None:
    for name in names:
        if (source_dir / name).is_file():
            _copy(source_dir / name, target_dir / name)


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not JSON ({error.msg})") from None
    return rows


def _write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _agent_side(row: Mapping[str, Any]) -> dict[str, Any]:
    return {key: row[key] for key in PREDICTION_FIELDS if key in row}


def _archive_export(export: Path, target: Path, root: Path) -> None:
    missing = [name for name in EXPORT_FILES if not (export / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{export}: no {', '.join(missing)}: not a LoRA policy export (a full "
                                "checkpoint is too large to archive)")
    for name in EXPORT_FILES:
        _copy(export / name, target / name)
    pointer = export / WARM_START_FILE
    if pointer.is_file():
        init = str(json.loads(pointer.read_text())["init"])
        if not is_shipped(init):
            path = Path(init).resolve()
            if path.is_relative_to(root.resolve()):
                init = f"{ROOT_PLACEHOLDER}/{path.relative_to(root.resolve()).as_posix()}"
        (target / WARM_START_FILE).write_text(json.dumps({"init": init}) + "\n")


def _restore_pointer(source: Path, target: Path, root: Path) -> None:
    init = resolve_root(str(json.loads(source.read_text())["init"]), root)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"init": init}) + "\n")


def _questions(config_path: Path) -> dict[str, Any]:
    """qid -> Question of the split the evaluation (its saved Hydra config) answered."""
    from omegaconf import OmegaConf

    from memr1.pipeline.evaluation import load_split

    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path}: missing: the record's questions cannot be joined back")
    cfg = OmegaConf.load(config_path)
    return {q.qid: q for c in load_split(cfg.data, cfg.split, cfg.conversations) for q in c.questions}


def _with_question(row: Mapping[str, Any], questions: Mapping[str, Any], where: Path) -> dict[str, Any]:
    question = questions.get(row.get("qid"))
    if question is None:
        raise ValueError(f"{where}: qid {row.get('qid')!r} is not a question of the dataset the record "
                         "names (its .hydra/config.yaml): a different file or split")
    joined = {field: getattr(question, attribute) for field, attribute in QUESTION_FIELDS.items()}
    joined["evidence"] = list(joined["evidence"])
    return {**joined, **row}
