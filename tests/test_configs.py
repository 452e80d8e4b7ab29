"""The Hydra configs compose for the command shapes users type, and bad choices fail with clear errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from memr1.apps import CONFIG_DIR
from memr1.config import AnswerConfig, BanksConfig, ManagerConfig
from memr1.rl.algorithms import AlgoConfig
from memr1.factories import algo_config, answer_config
from memr1.preflight import EVALUATE_GROUPS, TRAIN_GROUPS, ConfigError, check_typed_groups
from memr1.training import cpu_threads, trainer_kwargs

CONF = CONFIG_DIR


def compose_config(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(name, overrides=overrides)


def test_the_readme_training_command_composes_with_the_papers_ppo_settings():
    cfg = compose_config("train", ["model=manager", "algo=ppo", "trainer.devices=4"])
    algo = algo_config(cfg)
    assert (cfg.model.agent, algo.name, cfg.trainer.devices) == ("manager", "ppo", 4)
    assert (algo.actor_lr, algo.critic_lr, algo.clip_ratio_low, algo.gamma, algo.lam) == (1e-6, 1e-5, 0.2, 1.0, 1.0)
    assert cfg.model.window == 50 and cfg.manager.num_candidates == 5


def test_grpo_defaults_follow_the_paper():
    algo = algo_config(compose_config("train", []))
    assert (algo.name, algo.kl_coef, algo.kl_kind, algo.loss_agg_mode, algo.temperature) == (
        "grpo", 0.001, "low_var_kl", "token-mean", 1.0,
    )


def test_trainer_kinds_on_a_cpu_machine():
    auto = trainer_kwargs(OmegaConf.create({"kind": "auto", "devices": 4, "num_nodes": 1}))
    assert (auto["accelerator"], auto["devices"], auto["strategy"], auto["precision"]) == (
        "cpu", 4, "ddp_find_unused_parameters_true", "32-true",
    )
    fsdp = compose_config("train", ["trainer=fsdp"]).trainer
    with pytest.raises(ValueError, match="trainer=fsdp: no CUDA GPU.*trainer=cpu.*trainer.accelerator=cpu"):
        trainer_kwargs(fsdp)
    on_cpu = trainer_kwargs(compose_config("train", ["trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2"]).trainer)
    assert (on_cpu["accelerator"], on_cpu["devices"], on_cpu["precision"]) == ("cpu", 2, "32-true")
    assert type(on_cpu["strategy"]).__name__ == "ModelParallelStrategy"  # FSDP2, the module shards in configure_model


@pytest.mark.parametrize("kind", ["auto", "cpu", "gpu", "fsdp"])
def test_lightning_precision_is_not_a_knob(kind):
    # The weights stay fp32 masters everywhere; the compute dtype is the top-level `precision` key.
    with pytest.raises(Exception, match="override 'trainer.precision'"):
        compose_config("train", [f"trainer={kind}", "trainer.precision=bf16-true"])


def test_the_cores_are_shared_among_a_runs_cpu_processes(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)  # the machine, not the code under test
    assert cpu_threads(compose_config("train", ["trainer=cpu"])) == 8
    assert cpu_threads(compose_config("train", ["trainer=cpu", "trainer.devices=2"])) == 4
    assert cpu_threads(compose_config("train", ["trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=3"])) == 2
    assert cpu_threads(compose_config("train", ["trainer=cpu", "trainer.devices=16"])) == 1
    assert cpu_threads(compose_config("train", ["trainer=cpu", "trainer.devices=2", "threads=3"])) == 3  # as set


@pytest.mark.parametrize("ablation", sorted(p.stem for p in (CONF / "ablation").glob("*.yaml")))
def test_every_ablation_composes(ablation):
    cfg = compose_config("train", [f"ablation={ablation}"])
    expected = {
        "no_distill": lambda c: c.answer.distill is False,
        "no_rl_manager": lambda c: c.banks.policy == "manager" and c.manager.ckpt is None,
        "no_rl_answer": lambda c: c.model.agent == "manager" and c.answer.ckpt is None,
        "judge_reward": lambda c: c.model.reward == "judge" and c.judge.kind == "hf",
    }
    assert expected[ablation](cfg)


@pytest.mark.parametrize("sweep", sorted((CONF / "sweep").glob("*.yaml")), ids=lambda p: p.stem)
def test_sweep_parameters_name_real_config_keys(sweep):
    spec = yaml.safe_load(sweep.read_text())
    fixed = [arg for arg in spec["command"] if "=" in arg and not arg.startswith("$")]
    cfg = compose_config("train", fixed)
    for key in spec["parameters"]:
        assert OmegaConf.select(cfg, key, default="<missing>") != "<missing>", f"{sweep.name}: {key} is not a config key"
    assert spec["program"] == "train.py"


@pytest.mark.parametrize(
    "overrides",
    [
        ["banks=manager"],
        ["memory=raw_turns"],
        ["memory=llm_facts"],
        ["answer.distill=false"],
        ["experiment=smoke"],
        ["experiment=cpu_validation"],
        ["judge=openai_compatible", "judge.url=http://localhost:8000/v1", "judge.model=m"],
    ],
)
def test_evaluation_variants_compose(overrides):
    cfg = compose_config("evaluate", overrides)
    assert cfg.answer.k_per_speaker >= 1 and cfg.split in ("train", "validation", "test")
    check_typed_groups(cfg, EVALUATE_GROUPS)


@pytest.mark.parametrize("preset", sorted(str(p.relative_to(CONF / "experiment").with_suffix("")) for p in (CONF / "experiment").rglob("*.yaml")))
def test_every_preset_passes_both_entry_points_checks(preset):
    # A preset is one file for both scripts: train-only groups in it must not trip evaluate.py's checks.
    # Presets that switch a training group (algo=ppo, model=manager) are for train.py alone.
    check_typed_groups(compose_config("train", [f"experiment={preset}"]), TRAIN_GROUPS)
    if preset not in ("cpu_lift/answer_ppo", "cpu_lift/manager", "cpu_lift/manager_counterfactual"):
        check_typed_groups(compose_config("evaluate", [f"experiment={preset}"]), EVALUATE_GROUPS)


def test_a_wrong_algorithm_name_fails_early():
    with pytest.raises(ValueError, match="algo.name: 'ppo2'"):
        AlgoConfig(name="ppo2")


def test_the_cpu_lift_experiments_compose_as_documented():
    answer = compose_config("train", ["experiment=cpu_lift/answer"])
    ppo = compose_config("train", ["experiment=cpu_lift/answer_ppo"])
    manager = compose_config("train", ["experiment=cpu_lift/manager"])
    evaluation = compose_config("evaluate", ["experiment=cpu_lift/answer"])
    assert (answer.model.agent, answer.algo.name, answer.algo.group_size) == ("answer", "grpo", 4)
    # PPO samples once per state: 16 states give GRPO's 4 x G=4 responses per step.
    ppo_algo = algo_config(ppo)
    assert (ppo_algo.name, ppo_algo.algorithm.samples_per_state(ppo_algo), ppo.data_loader.states_per_step, ppo.model.reward) == ("ppo", 1, 16, "f1")
    assert (manager.model.agent, manager.answer.distill, manager.data_loader.val_before_train) == ("manager", False, True)
    # A Milvus Lite .db has one owner: the manager run keeps its banks apart from the answer run's.
    assert manager.banks.dir != answer.banks.dir
    # evaluate.py scores exactly the prompts the policy trained on: one `answer` node for both.
    assert answer_config(evaluation) == answer_config(answer)
    # The Answer Agent adapts every layer (top-10-only SFT collapsed); the Manager its top 10.
    assert (answer.lora.top_layers, manager.lora.top_layers) == (None, 10) and all(c.lora.enabled for c in (answer, ppo, manager))


TYPED = {"algo": AlgoConfig, "answer": AnswerConfig, "manager": ManagerConfig, "banks": BanksConfig}


@pytest.mark.parametrize("entry", ["train", "evaluate"])
def test_every_dataclass_field_is_a_config_key_and_settable_from_the_command_line(entry):
    for group, schema in TYPED.items():
        if entry == "evaluate" and group == "algo":
            continue
        cfg = compose_config(entry, [])
        assert set(cfg[group]) - {"_target_"} == {f.name for f in dataclasses.fields(schema)}, group
        for field in dataclasses.fields(schema):
            value = cfg[group][field.name]
            if isinstance(value, DictConfig):  # a nested group (algo.filter_groups): each of its keys
                for key, inner in value.items():
                    compose_config(entry, [f"{group}.{field.name}.{key}={inner}"])
                continue
            # Overriding each key with its own value composes: no key exists only in the dataclass.
            override = f"{group}.{field.name}={'null' if value is None else value}"
            if isinstance(value, list) or (isinstance(value, str) and "${" in value):
                continue
            compose_config(entry, [override])


def test_algo_weight_decay_composes_and_reaches_the_optimiser_config():
    assert algo_config(compose_config("train", ["algo.weight_decay=0.0"])).weight_decay == 0.0


@pytest.mark.parametrize("algo", ["grpo", "dr_grpo", "rloo", "reinforce", "ppo", "sft"])
def test_every_algorithm_sets_every_field_once(algo):
    cfg = compose_config("train", [f"algo={algo}"])
    assert algo_config(cfg).name == algo
    check_typed_groups(cfg)


def test_gspo_is_a_preset_of_grpo_over_its_own_policy_loss():
    cfg = compose_config("train", ["algo=gspo"])
    algo = algo_config(cfg)
    assert (algo.name, algo.policy_loss, algo.loss_agg_mode) == ("grpo", "gspo", "seq-mean-token-mean")
    assert (algo.clip_ratio_low, algo.clip_ratio_high) == (3.0e-4, 4.0e-4)
    check_typed_groups(cfg)


def test_a_misspelt_key_is_named_with_the_nearest_field():
    cfg = compose_config("train", ["+algo.actr_lr=1"])
    with pytest.raises(ConfigError, match=r"algo.actr_lr: no such key in algo \(AlgoConfig\); did you mean algo.actor_lr\?"):
        check_typed_groups(cfg)
    with pytest.raises(ConfigError, match="answer.k_per_speaker: must be >= 1, got 0"):
        check_typed_groups(compose_config("evaluate", ["answer.k_per_speaker=0"]))


def test_evaluate_ckpt_is_the_answer_agents_checkpoint():
    cfg = compose_config("evaluate", ["ckpt=runs/x/policy/best"])
    assert answer_config(cfg).ckpt == "runs/x/policy/best"
