#!/usr/bin/env bash
# Memory-SFT against the untrained agents on the whole validation split (conv-30, 81 questions), and the
# Manager's first GRPO steps from its SFT warm start (format errors, zero-spread groups). About 30 min
# on 2 cores, one job at a time. The lift's Answer Agent settings (experiment=cpu_lift/answer: 5 memories
# per speaker, 64 new tokens). Each step is skipped when its output exists: rerun to resume.
#   bash scripts/sft_validation.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-runs/sft_validation}
mkdir -p "$OUT"

evaluate() {  # NAME OVERRIDES...: evaluate.py on all 81 validation questions
  local name=$1; shift
  [ -f "$OUT/$name/report.json" ] || $PY evaluate.py experiment=cpu_lift/answer "hydra.run.dir=$OUT/$name" "$@"
}
train() {  # NAME OVERRIDES...
  local name=$1; shift
  [ -d "$OUT/$name/policy/last" ] || $PY train.py "run_dir=$OUT/$name" "$@"
}

# The Answer Agent (distilling, ADD-all banks): untrained vs 20 steps of Memory-SFT.
train answer-sft experiment=cpu_lift/answer algo=sft algo.actor_lr=3.0e-4 data_loader.max_steps=20 \
  data_loader.val_before_train=false data_loader.limit_val_batches=0
evaluate answer-base
evaluate answer-sft "ckpt=$OUT/answer-sft/policy/last"

# The Memory Manager: SFT on the rule teacher, with cpu_lift/manager's states and LoRA; no validation
# inside (the evaluations below score it).
MANAGER_SFT=(experiment=cpu_lift/manager algo=sft algo.actor_lr=3.0e-4 data_loader.max_steps=30
             data_loader.states_per_step=4 data_loader.val_before_train=false data_loader.limit_val_batches=0)
train manager-sft "${MANAGER_SFT[@]}"
# Its first GRPO steps from the warm start: are the sampled operations well formed, do groups differ?
train manager-grpo-from-sft experiment=cpu_lift/manager "manager.ckpt=$OUT/manager-sft/policy/last" \
  data_loader.max_steps=3 data_loader.val_before_train=false data_loader.limit_val_batches=0

# Banks built by each Manager over conv-30, answered by the same frozen base Answer Agent (no-distill,
# as the Manager's reward answerer: 0% format errors), on the same questions.
evaluate manager-add-all answer.distill=false banks=add_all
evaluate manager-prompted answer.distill=false banks=manager
evaluate manager-sft answer.distill=false banks=manager "manager.ckpt=$OUT/manager-sft/policy/last"

$PY - "$OUT" <<'EOF'
import csv, json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| run | F1 | BLEU-1 | EM | format errors % | mean words | manager format errors | bank size |")
print("|---|---|---|---|---|---|---|---|")
for name in ("answer-base", "answer-sft", "manager-add-all", "manager-prompted", "manager-sft"):
    report = json.loads((out / name / "report.json").read_text())
    s, settings = report["scores"], report["settings"]
    print(f"| {name} | {s['f1']:.2f} | {s['bleu1']:.2f} | {s['em']:.2f} | {s['format_error_rate']:.1f} | "
          f"{s['mean_answer_words']:.2f} | {settings.get('manager_format_errors', 0)} | {sum(settings['bank_sizes'].values())} |")
rows = list(csv.DictReader((out / "manager-grpo-from-sft" / "csv" / "metrics.csv").open()))
for row in rows:
    if row.get("response/format_error_rate"):
        print(f"manager GRPO from SFT, step {row['step']}: format errors {float(row['response/format_error_rate']):.2f}, "
              f"zero-spread groups {float(row['reward/zero_std_group_frac']):.2f}, reward {float(row['reward/mean']):.3f}")
EOF
