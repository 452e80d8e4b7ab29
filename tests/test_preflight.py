"""Mistakes fail before anything heavy loads, with the key that holds them: train.py and evaluate.py
as real subprocesses, checked for their message and for never importing torch (`-X importtime`).

Time budget: about 10 s on 2 CPU cores (subprocesses of ~0.6 s).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memr1.preflight import ConfigError, check_devices
from omegaconf import OmegaConf

pytestmark = pytest.mark.slow  # most tests run train.py / evaluate.py as subprocesses (each under a second)

ROOT = Path(__file__).resolve().parents[1]


def entry(script: str, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-X", "importtime", str(ROOT / script), *overrides],
        cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=120,
    )


def imported(result: subprocess.CompletedProcess[str]) -> set[str]:
    """Top-level modules the process imported, from `-X importtime`'s lines ("import time: a | b | name")."""
    return {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time:") and "|" in line}


def assert_fails_light(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode != 0
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr[-2000:]
    assert not {"torch", "transformers", "pymilvus", "lightning"} & imported(result)


def test_ckpt_path_last_without_a_run_dir_says_where_it_looked(tmp_path):
    run_dir = tmp_path / "fresh"
    result = entry("train.py", f"run_dir={run_dir}", "ckpt_path=last")
    assert_fails_light(result, f"ckpt_path=last: no checkpoint in {run_dir / 'checkpoints'}", "run_dir=")
    assert not run_dir.exists()  # a run that failed its checks leaves no directory behind


def test_ckpt_path_to_a_missing_file(tmp_path):
    assert_fails_light(entry("train.py", f"run_dir={tmp_path / 'r'}", "ckpt_path=/nonexistent.ckpt"), "ckpt_path=/nonexistent.ckpt")


def test_more_cpu_devices_than_cores_names_the_key(tmp_path):
    cores = os.cpu_count() or 1
    result = entry("train.py", f"run_dir={tmp_path / 'r'}", "trainer=cpu", f"trainer.devices={cores + 2}", "data_loader.states_per_step=64")
    assert_fails_light(result, f"trainer.devices={cores + 2}", f"this machine has {cores} core(s)")


def test_more_processes_than_states_per_step_names_both_keys(tmp_path):
    result = entry("train.py", f"run_dir={tmp_path / 'r'}", "trainer.devices=2", "data_loader.states_per_step=1")
    assert_fails_light(result, "trainer.devices=2", "data_loader.states_per_step=1")


def test_check_devices_on_gpu_kinds_counts_gpus():
    import torch

    gpus = torch.cuda.device_count()
    with pytest.raises(ConfigError, match=f"has {gpus} CUDA GPU"):
        check_devices(OmegaConf.create({"kind": "gpu", "devices": gpus + 1, "num_nodes": 1}), states_per_step=64)


def test_a_mistyped_data_path_is_missing_not_a_download(tmp_path):
    missing = tmp_path / "nowhere" / "locomo10.json"
    result = entry("evaluate.py", f"data.path={missing}", f"hydra.run.dir={tmp_path / 'eval'}")
    assert_fails_light(result, f"data.path={missing}: no such file", "data.download=true")
    assert "URLError" not in result.stderr and "urlopen" not in result.stderr
    assert not missing.parent.exists()
    assert not (tmp_path / "eval").exists()


@pytest.mark.parametrize("key", ["ckpt", "manager.ckpt"])
def test_evaluate_checkpoints_are_checked_before_loading_anything(tmp_path, key):
    result = entry("evaluate.py", "banks=manager", f"{key}=/nonexistent/policy", f"hydra.run.dir={tmp_path / 'eval'}")
    assert_fails_light(result, f"{key}=/nonexistent/policy: no such directory")
    assert not (tmp_path / "eval").exists()


def test_a_typo_in_a_key_fails_before_heavy_imports(tmp_path):
    result = entry("train.py", f"run_dir={tmp_path / 'r'}", "algo.actr_lr=1")
    assert_fails_light(result, "actr_lr")


@pytest.mark.parametrize(
    ("script", "override", "message"),
    [
        ("train.py", "+algo.actr_lr=1", "algo.actr_lr: no such key in algo (AlgoConfig); did you mean algo.actor_lr?"),
        ("evaluate.py", "+answer.k_per_speakr=3", "answer.k_per_speakr: no such key in answer (AnswerConfig); did you mean answer.k_per_speaker?"),
        ("evaluate.py", "banks.policy=prompted", "banks.policy: 'prompted' is not one of ('add_all', 'manager', 'oracle')"),
        ("train.py", "answer.max_new_tokens=0", "answer.max_new_tokens: must be >= 1, got 0"),
        ("evaluate.py", "manager.add_text=both", "manager.add_text: 'both' is not one of ('fact', 'model')"),
    ],
)
def test_following_hydras_append_hint_still_names_the_key_before_heavy_imports(tmp_path, script, override, message):
    result = entry(script, override, f"run_dir={tmp_path / 'r'}" if script == "train.py" else f"hydra.run.dir={tmp_path / 'e'}")
    assert_fails_light(result, message)


@pytest.mark.parametrize("key", ["answer.ckpt", "manager.ckpt"])
def test_train_checkpoints_are_checked_before_loading_anything(tmp_path, key):
    model = "model=answer" if key == "answer.ckpt" else "model=manager"
    assert_fails_light(entry("train.py", model, f"run_dir={tmp_path / 'r'}", f"{key}=/nonexistent/policy"), f"{key}=/nonexistent/policy")


def test_counterfactual_credit_with_a_group_baseline_is_refused(tmp_path):
    result = entry("train.py", "model=manager", "model.credit=counterfactual", f"run_dir={tmp_path / 'r'}")
    assert_fails_light(result, "model.credit=counterfactual with algo=grpo", "use algo=reinforce")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo=grpo", "algo.critic_lr=1e-3"], "algo.critic_lr=1e-3: algo=grpo does not use algo.critic_lr: it has no critic"),
        (["algo=ppo", "algo.kl_coef=0.01"], "algo.kl_coef=0.01: algo=ppo does not use algo.kl_coef: it puts no KL term in its loss"),
        (["algo=ppo", "algo.group_size=4"], "algo.group_size=4: algo=ppo does not use algo.group_size: it samples one response"),
        (["algo=sft", "algo.temperature=0.5"], "algo.temperature=0.5: algo=sft does not use algo.temperature: it trains on the teacher's targets"),
        (["algo=reinforce", "algo.filter_groups.enable=true"], "algo=reinforce does not use algo.filter_groups: its advantage is the reward itself"),
        (["algo=dr_grpo", "algo.loss_agg_mode=token-mean"], "Dr. GRPO does not normalise by response length"),
        (["algo.kl_kind=k9"], "algo.kl_kind: 'k9' is not one of"),
        (["algo=grpo", "algo.group_size=1"], "algo.group_size: GRPO compares the samples of a state, it needs at least 2"),
        (["model=manager", "teacher=search", "algo=enumerated", "algo.group_size=4"],
         "algo.group_size=4: algo=enumerated does not use algo.group_size: it samples nothing"),
        (["algo=grpo", "algo.operation_temperature=10"], "algo=grpo does not use algo.operation_temperature: it samples its responses"),
        (["model=manager", "teacher=search", "algo=enumerated_projection", "algo.set_mass_coef=1.0"],
         "algo.operation_objective=projection: its target already weighs the reward against the reference"),
        (["algo=grpo", "algo.change_margin=1"], "algo=grpo does not use algo.change_margin: it samples its responses"),
        (["model=manager", "teacher=search", "algo=enumerated_projection", "algo.change_margin=-1"], "algo.change_margin: must be >= 0, got -1"),
        (["algo=grpo", "algo.taught_sampling_alpha=0.5"], "algo=grpo does not use algo.taught_sampling_alpha: it samples its responses"),
        (["model=manager", "teacher=search", "algo=enumerated_projection", "algo.taught_sampling_alpha=2"],
         "algo.taught_sampling_alpha: must be in [0, 1]"),
        (["model=manager", "teacher=search", "algo=enumerated", "algo.operation_objective=argmax"],
         "algo.operation_objective: 'argmax' is not one of ('expected', 'projection', 'listwise')"),
        (["model=manager", "teacher=search", "algo=enumerated_listwise", "algo.kl_coef=0.1"],
         "algo.operation_objective=listwise: its target already weighs the reward against the reference"),
        (["model=manager", "teacher=search", "algo=enumerated_listwise", "algo.projection_beta=0"], "algo.projection_beta: must be > 0, got 0"),
        (["algo=ppo", "algo.kl_in_reward=true"], "algo=ppo does not use algo.kl_in_reward: it has no KL term (verl's PPO)"),
        (["algo=grpo", "algo.kl_in_reward=true", "algo.kl_coef=0"], "algo.kl_in_reward=true: the KL's weight is algo.kl_coef, which is 0"),
        (["algo=sft", "algo.policy_loss=gspo"], "algo.policy_loss=gspo: algo=sft does not use algo.policy_loss: it trains on the teacher's targets"),
        (["algo=grpo", "algo.policy_loss=cispo"], "algo.policy_loss: 'cispo' is not one of memr1's (gspo, vanilla) nor an importable module path"),
        (["model=manager", "algo=enumerated"], "use it with model=manager teacher=search (got model.agent=manager, teacher.kind=dataset)"),
        (["model=answer", "teacher=search", "algo=enumerated"], "weighs every operation of the Memory Manager"),
        (["algo=grpo", "+algo.operation_weights.update=5"], "algo=grpo does not use algo.operation_weights: it learns from its own responses"),
        (["model=answer", "algo=sft", "+algo.operation_weights.update=5"], "algo.operation_weights weighs the Memory Manager's targets by their operation"),
    ],
)
def test_each_algorithm_refuses_the_settings_it_would_ignore_before_torch_loads(tmp_path, overrides, message):
    assert_fails_light(entry("train.py", *overrides, f"run_dir={tmp_path / 'r'}"), message)


def test_a_preset_may_set_what_the_chosen_algorithm_does_not_read():
    """cpu_lift/answer tunes GRPO's group and temperature; with algo=sft those are not read, and the
    preset still composes and passes (only the command line is refused)."""
    from hydra import compose, initialize_config_dir

    from memr1.apps import CONFIG_DIR
    from memr1.preflight import TRAIN_GROUPS, check_no_ignored_overrides, check_typed_groups
    from memr1.rl.algorithms import ALGORITHMS

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=cpu_lift/answer", "algo=sft"])
    check_typed_groups(cfg, TRAIN_GROUPS)
    assert cfg.algo.group_size == 4  # set by the preset, unread by SFT
    check_no_ignored_overrides(ALGORITHMS["sft"], ["experiment=cpu_lift/answer", "algo=sft", "algo.actor_lr=3e-4"])
    with pytest.raises(ConfigError, match="algo.group_size=4: algo=sft does not use algo.group_size"):
        check_no_ignored_overrides(ALGORITHMS["sft"], ["algo=sft", "+algo.group_size=4"])
