#!/usr/bin/env bash
# Counterfactual credit against plain GRPO for the Memory Manager, at equal steps from the same warm
# start (the Manager's SFT export of scripts/sft_validation.sh), on experiment=cpu_lift/manager's
# states: zero-spread groups, responses with a gradient, the reward per step, validation reward before
# and after. About 10 min per run on 2 cores, one run at a time; rerun to resume (a finished run is
# skipped, a stopped one resumes from its last checkpoint).
#   bash scripts/counterfactual_credit.sh [OUT_DIR]     (STEPS=8 INIT=... to change)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-runs/counterfactual}
STEPS=${STEPS:-8}
INIT=${INIT:-runs/sft_validation/manager-sft/policy/last}
COMMON=("manager.ckpt=$INIT" "data_loader.max_steps=$STEPS" "data_loader.val_check_interval=$STEPS")

run() {  # NAME PRESET
  local name=$1 preset=$2 resume=()
  [ -d "$OUT/$name/policy/last" ] && return
  [ -d "$OUT/$name/checkpoints" ] && resume=(ckpt_path=last)
  $PY train.py "experiment=$preset" "run_dir=$OUT/$name" "${COMMON[@]}" "${resume[@]}"
}
run plain cpu_lift/manager
run counterfactual cpu_lift/manager_counterfactual

$PY - "$OUT" <<'PYEOF'
import csv, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| run | steps | reward/step (outcome + credit) | zero-spread groups | responses with a gradient | ADD frac | val/reward before -> after |")
print("|---|---|---|---|---|---|---|")
for name in ("plain", "counterfactual"):
    rows = list(csv.DictReader((out / name / "csv" / "metrics.csv").open()))
    train = [r for r in rows if r.get("reward/mean")]
    val = [float(r["val/reward"]) for r in rows if r.get("val/reward")]
    mean = lambda key: sum(float(r[key]) for r in train) / len(train)
    rewards = " ".join(f"{float(r['reward/mean']):.3f}" for r in train)
    print(f"| {name} | {len(train)} | {rewards} | {mean('reward/zero_std_group_frac'):.2f} | "
          f"{mean('advantage/nonzero_frac'):.2f} | {mean('ops/add_frac'):.2f} | {' -> '.join(f'{v:.4f}' for v in val)} |")
PYEOF
