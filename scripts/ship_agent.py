"""Ship a trained agent with the package: copy a run's LoRA policy export to `memr1/trained/NAME/` and
write its card, so that anyone can score, serve or fine-tune it as `trained:NAME` (memr1/shipped.py).

    .venv/bin/python scripts/ship_agent.py --name answer-agent-sft --agent answer \\
        --export runs/cpu_lift/answer-sft/policy/last --train-run runs/cpu_lift/answer-sft \\
        --eval runs/cpu_lift/test-answer-sft --versus runs/cpu_lift/test-answer-base \\
        --train-command "memr1 pipeline cpu_lift (stage answer-sft)"
    .venv/bin/python scripts/ship_agent.py --name answer-agent --agent answer \\
        --export runs/cpu_lift/answer-sft-grpo/policy/best --warm-start trained:answer-agent-sft ...

An export trained from a warm start (its `warm_start.json`) is shipped after that warm start, named by
`--warm-start trained:PARENT`; the parent's adapter must be the very file the run started from (their
digests are compared), so the shipped chain is the trained one. The card records the test scores of
`--eval` (an `evaluate.py` run of this export), its paired comparison with `--versus` (the run of the
agent it started from), the first answers of that evaluation (a spot check any machine can re-run),
the precision they were decoded in, the commands that trained and scored it, and the limits measured
where it was not trained (`--limit`, each with its file), so that no one ships it where it does harm.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from memr1.schedule import stage_command
from memr1.shipped import CARD_FILE, TRAINED_PREFIX, WARM_START_FILE, shipped_path, trained_root
from memr1.pipeline.compare import compare_runs, read_predictions
from memr1.pipeline.report_file import EvalReport

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
SPOT_CHECK_QUESTIONS = 8
SCORE_KEYS = ("f1", "bleu1", "em", "count", "format_error_rate", "distill_recall", "distill_precision", "mean_answer_words")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def adapter_digest(export: Path) -> str:
    return digest(export / "adapter_model.safetensors")


def check_warm_start(export: Path, warm_start: str | None) -> None:
    """`warm_start` (a `trained:` name) holds the adapter `export`'s run started from, or there is none."""
    pointer = export / WARM_START_FILE
    if not pointer.is_file():
        if warm_start:
            raise ValueError(f"--warm-start {warm_start}: {export} names no warm start (no {WARM_START_FILE})")
        return
    started_from = shipped_path(json.loads(pointer.read_text())["init"])
    if not warm_start:
        raise ValueError(f"{export} was trained from {started_from}: ship that first and name it with --warm-start trained:NAME")
    shipped = shipped_path(warm_start)
    if adapter_digest(shipped) != adapter_digest(started_from):
        raise ValueError(f"--warm-start {warm_start}: its adapter is not the one {export} was trained from ({started_from})")


def evaluation_summary(eval_dir: Path, versus: Path | None) -> dict[str, Any]:
    report = EvalReport.read(eval_dir)
    scores = report.scores
    predictions = read_predictions(eval_dir)
    summary: dict[str, Any] = {
        "split": report.split,
        "settings": dict(report.settings),
        "scores": {key: scores[key] for key in SCORE_KEYS if key in scores},
        "by_category": {key: value for key, value in scores.items() if "/cat" in key},
        "spot_check": [
            {"qid": qid, "prediction": row["prediction"]} for qid, row in list(predictions.items())[:SPOT_CHECK_QUESTIONS]
        ],
    }
    if versus is not None:
        summary["versus"] = compare_runs(versus, eval_dir).to_json()
    return summary


def card_markdown(card: dict[str, Any]) -> str:
    scores = card["evaluation"]["scores"]
    lines = [
        f"# {TRAINED_PREFIX}{card['name']}",
        "",
        f"The {card['agent']} agent for `{card['backbone']}`: a LoRA adapter"
        + (f" trained on top of `{card['warm_start']}`." if card["warm_start"] else " trained from the base model."),
        "",
        "## Scores",
        "",
        f"{card['evaluation']['split']} split, {scores.get('count', 0):.0f} questions, greedy, "
        f"{card['evaluation']['settings'].get('precision', 'fp32')}: "
        + ", ".join(f"{key} {scores[key]:.2f}" for key in ("f1", "bleu1", "em") if key in scores),
    ]
    versus = card["evaluation"].get("versus")
    if versus:
        f1 = versus["overall"]["f1"]
        lines += ["", f"Against `{versus['a']}` over {versus['common']} questions: ΔF1 {f1['delta']:+.2f} "
                      f"[{f1['low']:+.2f}, {f1['high']:+.2f}] (95% paired bootstrap), {f1['verdict']}; "
                      f"{versus['changed']} answers changed."]
    lines += ["", "## How it was trained", "", f"    {card['trained']['command']}"]
    if card["trained"].get("steps"):
        lines.append(f"\n{card['trained']['steps']} optimiser steps.")
    if card.get("limits"):
        lines += ["", "## Limits", "", *(f"- {limit}" for limit in card["limits"])]
    lines += ["", "## Re-score", "", f"    {card['rescore']}", ""]
    return "\n".join(lines)


def train_summary(train_run: Path | None, command: str) -> dict[str, Any]:
    summary: dict[str, Any] = {"command": command}
    if train_run is None:
        return summary
    # What the command set; the config is the commit's. A pipeline stage is composed from its schedule's
    # overrides into stage.yaml (Hydra's own list is then empty): the command line it was composed from.
    composed_from = stage_command(train_run)
    if composed_from is not None:
        summary["composed_from"] = composed_from
    overrides = train_run / ".hydra" / "overrides.yaml"
    if overrides.is_file():
        summary["overrides"] = [str(override) for override in OmegaConf.load(overrides)]
    curves = train_run / "curves.json"
    if curves.is_file():
        series = json.loads(curves.read_text())["train"].values()
        summary["steps"] = max((int(points[-1][0]) for points in series if points), default=None)
    return summary


def same_adapter_card(target: Path, adapter_sha256: str) -> dict[str, Any] | None:
    """The card shipped at `target`, when it is of the same adapter: re-scoring an agent (a new
    `--eval`) keeps how it was trained after its train run's files are gone, and its measured limits."""
    if not target.exists():
        return None
    shipped = json.loads((target / CARD_FILE).read_text())
    return shipped if shipped.get("adapter_sha256") == adapter_sha256 else None


def ship(args: argparse.Namespace) -> Path:
    export = Path(args.export)
    missing = [name for name in ADAPTER_FILES if not (export / name).is_file()]
    if missing:
        raise FileNotFoundError(f"--export {export}: not a LoRA policy export (missing {', '.join(missing)})")
    check_warm_start(export, args.warm_start)
    target = trained_root() / args.name
    if target.exists() and not args.replace:
        raise FileExistsError(f"{target} exists: pass --replace to ship over it")
    staging = target.with_name(f".{args.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in ADAPTER_FILES:
        shutil.copy2(export / name, staging / name)
    if args.warm_start:
        (staging / WARM_START_FILE).write_text(json.dumps({"init": args.warm_start}) + "\n")
    adapter_sha256 = adapter_digest(staging)
    trained = train_summary(Path(args.train_run) if args.train_run else None, args.train_command)
    previous = same_adapter_card(target, adapter_sha256)
    if args.train_run is None and previous is not None:
        trained = previous["trained"]
    # A re-score that names no limit keeps those measured before: a warning is not lost by re-shipping.
    limits = list(args.limit) or (previous.get("limits", []) if previous is not None else [])
    evaluation = evaluation_summary(Path(args.eval), Path(args.versus) if args.versus else None)
    # The precision the answers were decoded in, named: `auto` would pick fp32 on a CPU without bf16 units.
    overrides = [*args.eval_overrides, f"precision={evaluation['settings'].get('precision', 'fp32')}"]
    rescore = args.rescore or f"python evaluate.py {' '.join(overrides)} ckpt={TRAINED_PREFIX}{args.name}"
    card = {
        "name": args.name,
        "agent": args.agent,
        "backbone": evaluation["settings"]["backbone"],
        "warm_start": args.warm_start,
        "adapter_sha256": adapter_sha256,
        "trained": trained,
        "evaluation": evaluation,
        "rescore": rescore,
        "limits": limits,
    }
    (staging / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n")
    (staging / "card.md").write_text(card_markdown(card))
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="the agent's name: it is then trained:NAME")
    parser.add_argument("--agent", required=True, choices=("answer", "manager"))
    parser.add_argument("--export", required=True, help="the run's LoRA policy export (policy/best or policy/last)")
    parser.add_argument("--warm-start", help="trained:PARENT, the shipped agent the run started from")
    parser.add_argument("--eval", required=True, help="an evaluate.py run directory that scored this export")
    parser.add_argument("--versus", help="the evaluate.py run of the agent it started from (paired comparison)")
    parser.add_argument("--train-run", help="the train.py run directory (its config and step count go on the card); "
                                            "without it, a --replace of the same adapter keeps the card's record of its training")
    parser.add_argument("--train-command", required=True, help="the command that trained it")
    parser.add_argument("--eval-overrides", nargs="*", default=[], help="evaluate.py overrides of the scoring run, for the card's re-score command")
    parser.add_argument("--rescore", help="the full re-score command, in place of one built from --eval-overrides")
    parser.add_argument("--limit", action="append", default=[],
                        help="a measured limit a user should know before choosing it, with its file under results/ (repeatable)")
    parser.add_argument("--replace", action="store_true", help="ship over an agent of the same name")
    target = ship(parser.parse_args(argv))
    print(f"shipped {TRAINED_PREFIX}{target.name} -> {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
