"""The search teacher's choices on a split's Manager states: how often each operation is best and by how
much it beats ADD. Targets are computed (or read back) through the run's own trajectory cache, so the
states this script searched are the ones SFT then reads without searching again; interrupted, it
resumes where the cache stops.

    .venv/bin/python scripts/search_teacher_report.py experiment=cpu_lift/manager data=knowledge_update \\
        answer.ckpt=trained:answer-agent-no-distill-sft precision=fp32 --split validation --states 60 \\
        --out results/manager/search_teacher_ku_validation.json

The overrides are train.py's (`teacher=search` is implied); `--states N` takes N states in a seeded
order (all by default).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from memr1.apps import CONFIG_DIR  # noqa: E402
from memr1.data_modules.rl_states import RLStatesDataModule  # noqa: E402
from memr1.envs.manager import ManagerState  # noqa: E402
from machine import machine_info, print_machine  # noqa: E402  (benchmarks/machine.py)
from memr1.factories import build_env, build_trajectories  # noqa: E402
from memr1.pipeline.decisions import citation_key  # noqa: E402
from memr1.search_teacher import OPERATIONS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="train.py overrides (KEY=VALUE)")
    parser.add_argument("--split", choices=("train", "validation"), default="validation")
    parser.add_argument("--states", type=int, help="how many states, in a seeded order (default: all)")
    parser.add_argument("--out", type=Path, help="write the counts and every choice as JSON here")
    args = parser.parse_args()
    print_machine()
    load_before = os.getloadavg()[0]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["model=manager", "algo=sft", "teacher=search", *args.overrides])
    data = RLStatesDataModule.from_config(cfg)
    data.setup()
    states = data.train_states if args.split == "train" else data.val_states
    order = np.random.default_rng(cfg.seed).permutation(len(states))[: args.states]
    picked = [states[int(index)] for index in order]
    env = build_env(cfg)
    trajectories = build_trajectories(cfg, env)
    started = time.perf_counter()
    for number, state in enumerate(picked, start=1):  # one at a time: each is appended as it is chosen
        trajectories.targets([state], [env.prompt(state)])
        if number % 10 == 0 or number == len(picked):
            print(f"searched {number}/{len(picked)} states ({time.perf_counter() - started:.0f} s)", flush=True)
    rows = [json.loads(line) for line in Path(cfg.teacher.cache).read_text().splitlines()]
    wanted = {(s.conversation_id, tuple(s.fact.dia_ids)) for s in picked}
    chosen = [r for r in rows if r["teacher"] == trajectories.teacher.name and (r["conversation_id"], tuple(r["dia_ids"])) in wanted]
    counts = Counter(r["details"]["operation"] for r in chosen)
    # Per operation, its best instance's score minus ADD's in each state that has one (a state with
    # no candidate memory has no UPDATE or DELETE).
    beats = {op: [best - r["details"]["add"] for r in chosen if (best := best_of(r, op)) is not None] for op in OPERATIONS if op != "ADD"}
    summary = {
        "states": len(chosen),
        "taught": {op: counts.get(op, 0) for op in OPERATIONS},
        "mean_add": statistics.fmean(r["details"]["add"] for r in chosen) if chosen else None,
        "mean_taught": statistics.fmean(r["details"]["scores"][label(r)] for r in chosen) if chosen else None,
        "mean_noise": statistics.fmean(r["details"]["noise"] for r in chosen) if chosen else None,
        # Per operation: in how many states its best instance beat ADD at all, and by how much on average.
        "beats_add": {op: {"states_with_it": len(ds), "states_better": sum(d > 0 for d in ds),
                           "mean_margin_when_better": statistics.fmean([d for d in ds if d > 0]) if any(d > 0 for d in ds) else 0.0}
                      for op, ds in beats.items()},
        "all_tied": sum(len(set(r["details"]["scores"].values())) == 1 for r in chosen),
        # Per operation: in how many states, not taught, its best instance scored as high as the taught
        # option (beaten by the tie rule: the earlier option, or the fact kept over the fact dropped).
        "as_good_as_taught": {op: sum(r["details"]["operation"] != op and (best := best_of(r, op)) is not None
                                      and best >= r["details"]["scores"][label(r)] for r in chosen)
                              for op in OPERATIONS},
        # Per category of the questions that cite the fact's turn ("1+3": questions of both; "none": a
        # fact judged only by its candidates' questions, model.questions=fact_and_candidates), what is
        # taught: whether the operation follows from what kind of fact it is.
        "taught_by_question_category": taught_by_category(chosen, picked),
    }
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {"command": " ".join(sys.argv), "split": args.split, "teacher": trajectories.teacher.name, "summary": summary,
                  "seconds": time.perf_counter() - started, "machine": machine_info(load_before, os.getloadavg()[0]), "choices": chosen}
        args.out.write_text(json.dumps(report, indent=1))


def taught_by_category(chosen: list[dict], states: list[ManagerState]) -> dict[str, dict[str, int]]:
    """The taught operations counted per category of the questions citing the state's fact, keyed "1",
    "1+3" or "none"."""
    categories = {(s.conversation_id, tuple(s.fact.dia_ids)): citation_key(s.questions, s.fact.dia_ids) for s in states}
    table: dict[str, Counter] = {}
    for row in chosen:
        table.setdefault(categories[row["conversation_id"], tuple(row["dia_ids"])], Counter())[row["details"]["operation"]] += 1
    return {key: {op: counts.get(op, 0) for op in OPERATIONS} for key, counts in sorted(table.items())}


def best_of(row: dict, operation: str) -> float | None:
    return max((v for k, v in row["details"]["scores"].items() if k.split(":")[0] == operation), default=None)


def label(row: dict) -> str:
    details = row["details"]
    return details["operation"] if details["target"] is None else f"{details['operation']}:{details['target']}"


if __name__ == "__main__":
    main()
