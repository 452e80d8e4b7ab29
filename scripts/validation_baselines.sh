#!/usr/bin/env bash
# The untrained baselines on the validation split (conv-30, 81 questions) with the embedded model:
# the rows RL must beat. Each run writes runs/baselines/<name>/report.md. Pass names to run a subset.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export HF_HUB_OFFLINE=1
declare -A RUNS=(
  [add_all]="banks=add_all"
  [no_distill]="banks=add_all answer.distill=false"
  [raw_turns]="memory=raw_turns"
  [prompted]="banks=manager manager.max_new_tokens=96"
)
for name in "${@:-add_all no_distill raw_turns prompted}"; do
  for one in $name; do
    # shellcheck disable=SC2086
    "$PY" evaluate.py experiment=cpu_validation hydra.run.dir="runs/baselines/$one" ${RUNS[$one]}
  done
done
