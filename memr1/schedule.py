"""Multi-stage schedules as one resumable command: `memr1 pipeline NAME` (memr1/conf/pipeline/NAME.yaml).

A schedule is a list of stages, each one `train.py` or `evaluate.py` run with its own overrides in its
own directory `<root>/<stage>` (train.py's `run_dir`, evaluate.py's `hydra.run.dir`). An argument may
name an earlier stage's directory as `{stage-name}` (e.g. `answer.ckpt={answer-sft}/policy/best`) and the
schedule's root as `{root}`. The paper's alternating schedule is `memr1/conf/pipeline/alternating.yaml`;
`make train` runs `memr1/conf/pipeline/demo.yaml`.

Each stage is composed once, by the schedule, right before it runs: its config (the Hydra composition
of its script's YAML with its overrides) is written to `<root>/<stage>/stage.yaml` and the stage's app
runs from that file (`--config-dir <root>/<stage> --config-name stage`), composing nothing itself.

Resuming: a stage that finished has a `STAGE_DONE` file and is skipped; a training stage that was
stopped (SIGTERM is passed on to it, Ctrl-C reaches it from the terminal; it checkpoints) or killed resumes from its newest
checkpoint (`ckpt_path=last`); an evaluation stage keeps the answers it wrote (to its last whole batch)
and answers the rest. So running the same command again after
any interruption finishes the schedule without redoing finished work. A schedule with an `archive:`
folder (tracked in git) also outlives its machine: each finished stage is kept there and restored from
there into a run root that lacks it (`memr1.stage_archive`).

Stages marked `report: <label>` (evaluations) form the closing table, one per split: one row per label,
F1 / BLEU-1 / EM / format errors / mean words from the stage's `report.json`, each row's F1 set against
the first row of its split (the baseline) paired over the same questions with its 95% interval (`memr1 compare`), with a
plain sentence saying whether the trained rows beat it, and how many answers changed. A stage's
`versus: <label>` names an earlier row of its split to set it against as well (SFT+GRPO against the SFT
it was trained from), in a sentence of the same kind; naming the split's base adds nothing and writes
none. "Beats" means the interval excludes 0.
"""

from __future__ import annotations

import csv
import json
import logging
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from memr1.apps import CONFIG_DIR
from memr1.pipeline.report_file import REPORT_FILE
from memr1.pipeline.tables import ScoredRun, compare_labelled, scores_against_base
from memr1.provenance import code_version
from memr1.stage_archive import DONE, archive_stage, archive_unfinished, restore_stage, unfinished_step

SCHEDULES = CONFIG_DIR / "pipeline"
#: A stage's `script` (the paper's command it runs) and the app that is that command.
APPS = {"train.py": "memr1.apps.train", "evaluate.py": "memr1.apps.evaluate"}
SCRIPTS = tuple(APPS)
STAGE_NAME = re.compile(r"[A-Za-z0-9_-]+")  # a directory name, and a `{name}` that str.format reads whole
STAGE_CONFIG = "stage"  # <root>/<stage>/stage.yaml: the stage's config, composed by the schedule
COMMAND_LINE = "#   python "  # heads stage.yaml's second line: the command line it was composed from

log = logging.getLogger("memr1.pipeline")


@dataclass(frozen=True)
class Stage:
    name: str
    script: str
    shared: tuple[str, ...]  # the schedule's overrides for every stage of this script
    own: tuple[str, ...]  # the stage's own
    report: str | None = None
    versus: str | None = None  # an earlier row's label, this row set against it too (e.g. its warm start)


@dataclass(frozen=True)
class Schedule:
    name: str
    root: Path
    stages: tuple[Stage, ...]
    archive: Path | None = None  # where finished stages are kept in git (memr1.stage_archive)


def load_schedule(
    name_or_path: str, root: str | None = None, overrides: Sequence[str] = (), archive: str | None = None
) -> Schedule:
    """The schedule `memr1/conf/pipeline/<name>.yaml` (or a YAML path), with its run root and archive folder
    (`root`, `archive`: the file's unless given); `overrides` are added to every stage
    of the script they are written for (`train.py:KEY=VALUE`, `evaluate.py:KEY=VALUE`) or of both (an
    `algo.KEY` one reaches only the training stages whose algorithm reads it: `resolve_stage`)."""
    path = Path(name_or_path)
    if not path.suffix:
        path = SCHEDULES / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in SCHEDULES.glob("*.yaml"))
        raise FileNotFoundError(f"pipeline {name_or_path!r}: no file {path} (known schedules: {known})")
    spec = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    if not isinstance(spec, dict) or not isinstance(spec.get("stages"), list) or not spec["stages"]:
        raise ValueError(f"{path}: stages: a non-empty list of stages is required")
    common: dict[str, list[str]] = {script: list(spec.get("overrides", {}).get(script, [])) for script in SCRIPTS}
    for override in overrides:
        prefixed = [script for script in SCRIPTS if override.startswith(script + ":")]
        for target in prefixed or SCRIPTS:
            common[target].append(override[len(target) + 1 :] if prefixed else override)
    stages: list[Stage] = []
    for position, stage in enumerate(spec["stages"]):
        where = f"{path}: stages[{position}]"
        if not isinstance(stage, dict) or "name" not in stage or stage.get("script") not in SCRIPTS:
            raise ValueError(f"{where}: a stage needs a name and a script ({' or '.join(SCRIPTS)})")
        if not STAGE_NAME.fullmatch(str(stage["name"])):
            raise ValueError(
                f"{where}: the stage name {stage['name']!r} may hold only letters, digits, '-' and '_' "
                "(it names the stage's directory and its {placeholder} in later stages' arguments)"
            )
        if any(stage["name"] == earlier.name for earlier in stages):
            raise ValueError(f"{where}: the stage name {stage['name']!r} is used twice")
        own = tuple(str(arg) for arg in stage.get("args", []))
        shared = tuple(common[stage["script"]])
        versus = stage.get("versus")
        if versus is not None and versus not in [earlier.report for earlier in stages if earlier.report]:
            raise ValueError(f"{where}: versus: {versus!r} is not the report label of an earlier stage")
        stages.append(Stage(stage["name"], stage["script"], shared, own, stage.get("report"), versus))
    archive = archive or spec.get("archive")
    return Schedule(
        path.stem, Path(root or spec.get("root") or f"runs/pipeline/{path.stem}"), tuple(stages),
        Path(archive) if archive else None,
    )


def resolve_stage(schedule: Schedule, stage: Stage) -> tuple[list[str], DictConfig]:
    """The stage's overrides as its command line would give them and its config composed from them.

    The overrides: `{root}` / `{stage}` placeholders filled in, the stage's directory (train.py's
    `run_dir`, evaluate.py's `hydra.run.dir`), `ckpt_path=last` for a training stage with a checkpoint
    to resume from, and of the schedule's shared `algo.KEY` overrides only those the stage's algorithm
    reads (GRPO's group size is not the SFT stage's). The stage's own `algo.KEY` that its algorithm
    would ignore is refused (`ConfigError`), as train.py refuses it on a command line. One composition;
    a second only when a shared `algo.KEY` had to be left out."""
    from memr1.preflight import algo_field, check_no_ignored_overrides
    from memr1.rl.algorithms import ALGORITHMS

    places = {"root": str(schedule.root), **{s.name: str(schedule.root / s.name) for s in schedule.stages}}
    try:
        shared, own = ([arg.format(**places) for arg in args] for args in (stage.shared, stage.own))
    except KeyError as missing:
        raise ValueError(f"pipeline {schedule.name}: stage {stage.name}: {missing} names no stage") from None
    directory = schedule.root / stage.name
    if stage.script == "train.py":
        own.append(f"run_dir={directory}")
        if any((directory / "checkpoints").glob("*.ckpt")):
            own.append("ckpt_path=last")
    else:
        own.append(f"hydra.run.dir={directory}")
    config = compose_config(stage.script, [*shared, *own])
    if stage.script == "train.py":
        algorithm = ALGORITHMS[config.algo.name]
        check_no_ignored_overrides(algorithm, own)
        read = [arg for arg in shared if algo_field(arg) not in algorithm.ignores]
        if len(read) < len(shared):
            shared, config = read, compose_config(stage.script, [*read, *own])
    return [*shared, *own], config


def compose_config(script: str, overrides: Sequence[str]) -> DictConfig:
    """`script`'s config (memr1/conf/train.yaml or evaluate.yaml) composed with `overrides`, with the
    two settings of Hydra's own node that memr1's YAML sets (`hydra.run.dir`, `hydra.job.chdir`) and
    every interpolation left for the stage to resolve (`${now:...}` is its start time)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        composed = compose(script.removesuffix(".py"), overrides=list(overrides), return_hydra_config=True)
    everything = OmegaConf.to_container(composed, resolve=False)
    hydra_node = everything.pop("hydra")
    everything["hydra"] = {"run": {"dir": hydra_node["run"]["dir"]}, "job": {"chdir": hydra_node["job"]["chdir"]}}
    return OmegaConf.create(everything)


def stage_arguments(schedule: Schedule, stage: Stage) -> list[str]:
    """The stage's overrides as a command line would give them (`resolve_stage`)."""
    return resolve_stage(schedule, stage)[0]


def stage_command(directory: Path) -> str | None:
    """The command line the stage run in `directory` was composed from, as `prepare_stage` wrote it
    atop its `stage.yaml` ("python train.py KEY=VALUE ..."); None for a run outside a pipeline."""
    config = directory / f"{STAGE_CONFIG}.yaml"
    if not config.is_file():
        return None
    lines = [line for line in config.read_text().splitlines() if line.startswith(COMMAND_LINE)]
    return lines[0].removeprefix("#").strip() if lines else None


def prepare_stage(schedule: Schedule, stage: Stage) -> tuple[list[str], list[str]]:
    """Compose the stage and write its config to `<root>/<stage>/stage.yaml`; its overrides
    (`resolve_stage`) and its command line: its app in a fresh interpreter, reading that file."""
    args, config = resolve_stage(schedule, stage)
    directory = schedule.root / stage.name
    directory.mkdir(parents=True, exist_ok=True)
    header = f"# memr1 pipeline {schedule.name}, stage {stage.name}: composed from\n{COMMAND_LINE}{stage.script} {' '.join(args)}\n"
    (directory / f"{STAGE_CONFIG}.yaml").write_text(header + OmegaConf.to_yaml(config))
    return args, [sys.executable, "-m", APPS[stage.script], "--config-dir", str(directory.resolve()), "--config-name", STAGE_CONFIG]


def run_schedule(schedule: Schedule) -> int:
    """Run the stages that have not finished, in order; 0 when all have, else the failing stage's
    exit status (a stop by signal is 128 + its number, as train.py's own). With an archive, a stage
    missing from the run root but kept there is restored instead of run (a training stage kept
    unfinished is restored and resumed), and each finished stage is kept there (one that finished
    before the archive was named, or whose kept record lacks an export a stage names now, at the next
    start)."""
    schedule.root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for number, stage in enumerate(schedule.stages, start=1):
        directory = schedule.root / stage.name
        position = f"stage {number}/{len(schedule.stages)} {stage.name}"
        if (directory / DONE).is_file():
            log.info("%s: done before, skipped", position)
            if schedule.archive and not kept(schedule, stage):
                keep(schedule, stage)
            continue
        if restore(schedule, stage):
            if (directory / DONE).is_file():
                log.info("%s: restored from %s, skipped", position, schedule.archive)
                continue
            log.info("%s: its checkpoint restored from %s", position, schedule.archive)
        try:
            args, command = prepare_stage(schedule, stage)
        except Exception as error:  # noqa: BLE001 - a stage whose overrides do not compose fails by name, as its run would
            log.error("stage %s: its config does not compose: %s", stage.name, error)
            return 2
        log.info("%s: python %s %s (composed into %s)", position, stage.script, " ".join(args), directory / f"{STAGE_CONFIG}.yaml")
        stage_started = time.perf_counter()
        # The commit the stage's process starts from: the tree may move on while it runs.
        started_from = code_version()
        code = _run_forwarding_signals(command)
        if code != 0:
            log.error(
                "stage %s failed with exit status %d; its log is in %s. Run the same command again to resume.",
                stage.name, code, directory,
            )
            return code
        done = {"seconds": round(time.perf_counter() - stage_started, 1), "code": started_from}
        (directory / DONE).write_text(json.dumps(done) + "\n")
        log.info("stage %s finished in %.0f s", stage.name, time.perf_counter() - stage_started)
        if schedule.archive:
            keep(schedule, stage)
    log.info("pipeline %s finished in %.0f s (stages run now)", schedule.name, time.perf_counter() - started)
    table = report_table(schedule)
    if table:
        (schedule.root / "report.md").write_text(table + "\n")
        print(table, flush=True)
    return 0


def restore(schedule: Schedule, stage: Stage) -> bool:
    """Lay the archive's record of the unfinished `stage` into the run root: a finished record always,
    an unfinished one where it got further than the run root's own checkpoints. True if one was."""
    from memr1.callbacks.checkpoints import checkpoint_step, latest_checkpoint

    record = schedule.archive / stage.name if schedule.archive else None
    if record is None or not record.is_dir():
        return False
    directory = schedule.root / stage.name
    if not (record / DONE).is_file():
        kept_step = unfinished_step(record)
        local = latest_checkpoint(directory / "checkpoints")
        if kept_step is None or (local is not None and checkpoint_step(local) >= kept_step):
            return False
    restore_stage(record, directory, schedule.root)
    return True


def kept(schedule: Schedule, stage: Stage) -> bool:
    """Whether the archive holds the finished `stage` with every export that the schedule's stages name
    now (a schedule edited to score `policy/last` where it scored `policy/best` needs the stage kept again)."""
    assert schedule.archive is not None
    record = schedule.archive / stage.name
    return (record / DONE).is_file() and all((record / export).is_dir() for export in referenced_exports(schedule)[stage.name])


def keep(schedule: Schedule, stage: Stage) -> None:
    """Archive the finished `stage` with the policy exports that later stages name."""
    assert schedule.archive is not None
    exports = referenced_exports(schedule)[stage.name]
    archive_stage(schedule.root / stage.name, schedule.archive / stage.name, schedule.root, exports)
    log.info("stage %s kept in %s%s", stage.name, schedule.archive / stage.name,
             f" (with {', '.join(exports)})" if exports else "")


def keep_progress(schedule: Schedule) -> list[str]:
    """`memr1 pipeline NAME --keep`: archive every finished stage not kept yet, and each unfinished
    training stage's newest checkpoint; run nothing. The stages kept, in order. Run it with the
    schedule stopped or paused (SIGSTOP), so that no file is caught mid-write."""
    from memr1.callbacks.checkpoints import latest_checkpoint

    if schedule.archive is None:
        raise ValueError(f"pipeline {schedule.name}: no archive to keep stages in (archive: in its file, or --archive)")
    newly_kept = []
    for stage in schedule.stages:
        directory, record = schedule.root / stage.name, schedule.archive / stage.name
        if (directory / DONE).is_file():
            if not kept(schedule, stage):
                keep(schedule, stage)
                newly_kept.append(stage.name)
        elif stage.script == "train.py" and latest_checkpoint(directory / "checkpoints") is not None:
            archive_unfinished(directory, record, schedule.root)
            log.info("stage %s kept unfinished in %s (step %s)", stage.name, record, unfinished_step(record))
            newly_kept.append(stage.name)
    return newly_kept


def referenced_exports(schedule: Schedule) -> dict[str, list[str]]:
    """Per stage, the exports under it that some stage's arguments name (`{answer-sft}/policy/last`)."""
    named: dict[str, set[str]] = {stage.name: set() for stage in schedule.stages}
    for stage in schedule.stages:
        for arg in (*stage.shared, *stage.own):
            for name, export in re.findall(r"\{([^{}]+)\}/(policy/\w+)", arg):
                if name in named:
                    named[name].add(export)
    return {name: sorted(exports) for name, exports in named.items()}


def _run_forwarding_signals(command: list[str]) -> int:
    """Run `command` so that a stop reaches it once, and it checkpoints before it exits: SIGTERM
    (schedulers, `kill`) is passed on to it; Ctrl-C already reaches it from the terminal, being in
    the same process group, so the runner only waits (a second copy would make it stop at once)."""
    process = subprocess.Popen(command)  # in this directory, where the schedule's root is
    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, lambda signum, frame: process.send_signal(signum)),
        signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
    }
    try:
        return process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def report_rows(schedule: Schedule) -> list[ScoredRun]:
    """Every finished stage marked `report` (its label, directory and report.json), in schedule order."""
    return [
        ScoredRun.read(stage.report, schedule.root / stage.name)
        for stage in schedule.stages
        if stage.report and (schedule.root / stage.name / REPORT_FILE).is_file()
    ]


def report_table(schedule: Schedule) -> str:
    """The closing table (see the module docstring; `memr1.pipeline.tables`), a sentence per comparison
    and the training stages' probe rewards; "" when no stage reports."""
    rows = report_rows(schedule)
    if not rows:
        return ""
    lines: list[str] = []
    bases: set[str] = set()  # each split's base label: its table already sets every row against it
    # One table per split, its first row the base: rows of different splits share no question.
    for split in dict.fromkeys(row.report.split for row in rows):
        same_split = [row for row in rows if row.report.split == split]
        table, comparisons = scores_against_base(same_split)
        base = same_split[0].report
        bases.add(same_split[0].label)
        lines += [*([""] if lines else []), table, ""]
        lines.append(f"{int(base.scores.get('count', 0))} {split} questions, greedy decoding, the same questions and banks in "
                     "every row; Δ paired over the questions, its 95% interval by bootstrap.")
        lines += [comparison.verdict() for comparison in comparisons]
    by_label = {row.label: row for row in rows}
    for stage in schedule.stages:
        if stage.versus in by_label and stage.report in by_label and stage.versus not in bases:
            lines.append(compare_labelled(by_label[stage.versus], by_label[stage.report]).verdict())
    for stage in schedule.stages:
        probes = probe_rewards(schedule.root / stage.name) if stage.script == "train.py" else []
        if len(probes) > 1:
            shown = ", ".join(f"{reward:.3f} at step {step}" for step, reward in probes)
            lines.append(f"{stage.name}: probe reward (the same training questions, sampled with one seed) {shown}.")
    return "\n".join(lines)


def probe_rewards(run_dir: Path) -> list[tuple[int, float]]:
    """(step, train/probe_reward) of a training run's csv/metrics.csv, in step order."""
    path = run_dir / "csv" / "metrics.csv"
    if not path.is_file():
        return []
    with path.open(newline="") as file:
        return [(int(row["step"]), float(row["train/probe_reward"])) for row in csv.DictReader(file) if row.get("train/probe_reward")]
