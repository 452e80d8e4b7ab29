#!/usr/bin/env bash
# The untrained baselines on the validation split (conv-30, 81 questions) with the embedded model:
# the rows RL must beat. Each run writes runs/baselines/<name>/report.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export HF_HUB_OFFLINE=1
run() { name=$1; shift; "$PY" evaluate.py experiment=cpu_validation hydra.run.dir=runs/baselines/$name "$@"; }
run add_all manager=add_all
run no_distill manager=add_all answer.distill=false
run raw_turns memory=raw_turns
run prompted manager=prompted manager.max_new_tokens=96
