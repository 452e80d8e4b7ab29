"""How sure a Manager policy is of one operation: log pi of every operation's reply (the search
teacher's options) on training states, and the share q(T) = softmax(log pi / T) leaves to the
operations other than the policy's likeliest, for a few temperatures. Chooses `algo.operation_temperature`
on training states, before any run (memr1/conf/algo/enumerated.yaml).

    .venv/bin/python scripts/operation_logprobs.py experiment=cpu_lift/manager data=knowledge_update \\
        manager.ckpt=<SFT>/policy/last --states 12 --out results/manager/operation_logprobs.json

With `--taught CACHE` (a search teacher's targets, `teacher.cache`) the states are those the cache taught,
up to `--states` of each taught operation, and each row says whether the policy's likeliest operation is
the taught one: does an SFT Manager prefer what it was taught, on its training states (`--split train`) and
on held-out ones (`--split validation`, with the search's validation cache)?
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from memr1.apps import CONFIG_DIR  # noqa: E402
from memr1.data_modules.rl_states import RLStatesDataModule  # noqa: E402
from machine import machine_info  # noqa: E402  (benchmarks/machine.py)
from memr1.factories import build_env, frozen_policy  # noqa: E402
from memr1.llm.engines import encode_prompts  # noqa: E402
from memr1.rl.batch import pack_rollouts, response_logprobs  # noqa: E402
from memr1.search_teacher import label, options  # noqa: E402
from memr1.teachers import prompt_digest  # noqa: E402

TEMPERATURES = (1.0, 3.0, 10.0, 30.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="train.py overrides (KEY=VALUE)")
    parser.add_argument("--states", type=int, default=12, help="states, or with --taught states per taught operation")
    parser.add_argument("--split", choices=("train", "validation"), default="train")
    parser.add_argument("--taught", type=Path, help="a search teacher's cache (JSONL): compare with its operations")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["model=manager", *args.overrides])
    data = RLStatesDataModule.from_config(cfg)
    data.setup()
    states = data.train_states if args.split == "train" else data.val_states
    order = [states[int(i)] for i in np.random.default_rng(cfg.seed).permutation(len(states))]
    env = build_env(cfg)
    taught = _taught_operations(args.taught) if args.taught else None
    if taught is None:
        picked = [(state, None) for state in order[: args.states]]
    else:  # (state, the operation taught there), up to --states of each operation
        per_operation: dict[str, list] = {}
        for state in order:
            operation = taught.get(prompt_digest(env.prompt(state)))
            if operation is not None and len(per_operation.setdefault(operation, [])) < args.states:
                per_operation[operation].append((state, operation))
        picked = [pair for group in per_operation.values() for pair in group]
    policy, tokenizer = frozen_policy(cfg.backbone.name_or_path, "float32", cfg.manager.ckpt)
    rows = []
    for state, operation in picked:
        found = options(state)
        replies = [tokenizer(o.reply, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for o in found]
        (prompt,) = encode_prompts(tokenizer, [env.prompt(state)])
        batch = pack_rollouts([prompt] * len(found), replies, [0.0] * len(found), tokenizer.pad_token_id)
        with torch.no_grad():
            logprobs, _ = response_logprobs(policy, batch)
        sequence = (logprobs * batch.response_mask).sum(-1)
        others = {t: 1.0 - float(torch.softmax(sequence / t, 0).max()) for t in TEMPERATURES}
        row = {"logprobs": dict(zip(map(label, found), [round(x, 2) for x in sequence.tolist()])), "others_share": others}
        if operation is not None:
            row["taught"] = operation
            row["likeliest"] = found[int(sequence.argmax())].operation
        rows.append(row)
    summary = {str(t): statistics.fmean(r["others_share"][t] for r in rows) for t in TEMPERATURES}
    print("mean share left to the operations other than the likeliest, by temperature:", json.dumps(summary))
    report = {"command": " ".join(sys.argv), "others_share_mean": summary}
    if taught is not None:
        report["likeliest_by_taught"] = _likeliest_by_taught(rows)
        print("the policy's likeliest operation, by the operation taught:", json.dumps(report["likeliest_by_taught"]))
    if args.out:
        args.out.write_text(json.dumps({**report, "states": rows, "machine": machine_info(load_before, os.getloadavg()[0])}, indent=1))


def _taught_operations(path: Path) -> dict[str, str]:
    """Prompt digest -> the operation a search teacher's cache taught there (NONE, ADD, MERGE, ...)."""
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {row["key"]: row["details"]["operation"] for row in rows if "operation" in row.get("details", {})}


def _likeliest_by_taught(rows: list[dict]) -> dict[str, dict[str, int]]:
    """Taught operation -> {the policy's likeliest operation: states}."""
    table: dict[str, Counter[str]] = {}
    for row in rows:
        table.setdefault(row["taught"], Counter())[row["likeliest"]] += 1
    return {taught: dict(counts) for taught, counts in table.items()}


if __name__ == "__main__":
    main()
