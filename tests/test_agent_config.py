"""One agent, one config: `train.py`'s validation and `evaluate.py` prompt, retrieve and decode the
Answer Agent from the same `answer` group, and the bank recipe names identical banks identically."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file, save_file

from memr1.apps import CONFIG_DIR
from memr1.data_modules.rl_states import RLStatesDataModule
from memr1.banks.recipe import bank_recipe
from memr1.factories import answer_agent, answer_config, build_module
from memr1.llm.loading import changes_nothing, load_policy, load_tokenizer
from memr1.llm.sampling import SamplingConfig
from memr1.llm.testing import save_lora_export, save_tiny_checkpoint
from memr1.types import MemoryEntry, Question

CONF = CONFIG_DIR
AGENT = ["answer.k_per_speaker=4", "answer.max_new_tokens=48", "answer.distill=false", "answer.max_answer_words=5"]
QUESTION = Question(qid="c/q0", conversation_id="c", question="Where did Ann move?", answer="Lisbon", evidence=("D1:1",), category=4)
MEMORIES = {"Ann": [MemoryEntry("m1", "Ann moved to Lisbon", "Ann", "9 May, 2023", provenance=("D1:1",))], "Bo": []}


def composed(name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(name, list(overrides))


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model", load_tokenizer("embedded:smollm2-135m-instruct"))


def test_training_validation_and_evaluation_read_one_answer_agent(backbone, tmp_path):
    train = composed("train", f"backbone.name_or_path={backbone}", f"banks.dir={tmp_path}", f"run_dir={tmp_path / 'run'}", *AGENT)
    evaluation = composed("evaluate", f"backbone.name_or_path={backbone}", *AGENT)
    agent = answer_config(evaluation)
    assert answer_config(train) == agent  # the same group file and overrides: one object's worth of settings
    assert (agent.k_per_speaker, agent.max_new_tokens, agent.distill, agent.max_answer_words) == (4, 48, False, 5)

    module = build_module(train)
    data = RLStatesDataModule.from_config(train)
    # Retrieval: the states validation scores hold as many memories per speaker as evaluation retrieves.
    assert data.k_per_speaker == agent.k_per_speaker
    # Decoding: validation decodes exactly as evaluate.py does.
    assert module.validation_sampling() == SamplingConfig.greedy_up_to(agent.max_new_tokens)
    assert module.max_new_tokens == agent.max_new_tokens
    # Prompting and parsing: the training environment's agent is the evaluation's.
    from memr1.envs.answer import AnswerState

    assert module.env.prompt(AnswerState(QUESTION, MEMORIES)) == answer_agent(agent).build_messages(QUESTION.question, MEMORIES)
    reply = "**Answer:** Lisbon in May of the year 2023"
    assert module.env.agent.parse(reply) == answer_agent(agent).parse(reply)


def test_identical_bank_recipes_share_one_name_and_different_ones_do_not(tmp_path):
    train = bank_recipe(composed("train", "model=answer"), precision="fp32")
    evaluation = bank_recipe(composed("evaluate"), precision="fp32")
    assert train == evaluation and train.signature() == evaluation.signature()
    assert train.signature().startswith("locomo-observation-add_all-")
    prompted = bank_recipe(composed("evaluate", "banks=manager"), precision="fp32")
    export = save_tiny_checkpoint(tmp_path / "export", load_tokenizer("embedded:smollm2-135m-instruct"))
    trained = bank_recipe(composed("evaluate", "banks=manager", f"manager.ckpt={export}"), precision="fp32")
    raw = bank_recipe(composed("evaluate", "banks=manager", "memory=raw_turns"), precision="fp32")
    assert len({train.signature(), prompted.signature(), trained.signature()}) == 3
    assert prompted.writer["manager"]["ckpt"] is None and trained.writer["manager"]["ckpt"] == str(export)
    # A trained Manager is named by its weights: a copy elsewhere shares its banks, the same export
    # rewritten in place (a run's policy/best, later in training) does not.
    copy = Path(shutil.copytree(export, tmp_path / "copy"))
    assert bank_recipe(composed("evaluate", "banks=manager", f"manager.ckpt={copy}"), precision="fp32").signature() == trained.signature()
    save_tiny_checkpoint(export, load_tokenizer("embedded:smollm2-135m-instruct"), seed=1)
    assert bank_recipe(composed("evaluate", "banks=manager", f"manager.ckpt={export}"), precision="fp32").signature() != trained.signature()
    # Raw turns are ADDed whoever the policy is: no model writes them, so the Manager is not in the name.
    assert not raw.uses_manager and raw.signature().startswith("locomo-raw_turns-add_all-")
    assert raw == bank_recipe(composed("evaluate", "memory=raw_turns"), precision="fp32")
    # The Answer Agent's settings do not change the banks.
    assert bank_recipe(composed("evaluate", "answer.k_per_speaker=3"), precision="fp32").signature() == evaluation.signature()
    # Another embedder writes other vectors: other banks. The default keeps the name banks had before
    # `banks.embedder` existed (the digest of the same recipe without the key), so no built bank is lost.
    tiny = bank_recipe(composed("evaluate", f"banks.embedder={tmp_path}"), precision="fp32")
    assert tiny.embedder == str(tmp_path) and tiny.signature() != evaluation.signature()
    assert evaluation.signature() == "locomo-observation-add_all-8939cd1fe6"
    # What an ADD stores changes the banks; an ADD of the model's text keeps the name such banks had
    # before `manager.add_text` existed.
    model_text = bank_recipe(composed("evaluate", "banks=manager", f"manager.ckpt={copy}", "manager.add_text=model"), precision="fp32")
    assert trained.writer["manager"]["add_text"] == "fact" and model_text.signature() != trained.signature()
    before_the_key = {"manager": {key: value for key, value in model_text.writer["manager"].items() if key != "add_text"}}
    assert model_text.signature() == dataclasses.replace(model_text, writer=before_the_key).signature()
    # A Manager decides in its run's precision, and greedy decisions can differ between fp32 and bf16:
    # its banks in one are not the other's. ADD-all's banks of the dataset's facts are the same in both.
    in_bf16 = bank_recipe(composed("evaluate", "banks=manager", f"manager.ckpt={copy}"), precision="bf16")
    assert in_bf16.writer["manager"]["precision"] == "bf16" and in_bf16.signature() != trained.signature()
    assert bank_recipe(composed("evaluate"), precision="bf16").signature() == evaluation.signature()


def test_an_export_that_training_never_moved_shares_its_warm_starts_banks(backbone, tmp_path):
    """A run's policy/best is exported before the first step (lora_B at peft's zeros) and stays so when
    no validation beats the warm start: merged, it is the warm start bit for bit, so it names the same
    banks instead of building them again."""
    sft = save_lora_export(backbone, tmp_path / "sft")
    unmoved = save_lora_export(backbone, tmp_path / "grpo-best", init=sft, trained=False)
    moved = save_lora_export(backbone, tmp_path / "grpo-last", init=sft, seed=4)
    assert changes_nothing(unmoved) and not changes_nothing(moved) and not changes_nothing(sft)
    warm_start = load_policy(backbone, ckpt=sft)[0].state_dict()
    for name, tensor in load_policy(backbone, ckpt=unmoved)[0].state_dict().items():
        assert torch.equal(tensor, warm_start[name]), name

    def signature(ckpt: Path) -> str:
        return bank_recipe(composed("evaluate", "banks=manager", f"backbone.name_or_path={backbone}", f"manager.ckpt={ckpt}"), precision="fp32").signature()

    assert signature(unmoved) == signature(sft) != signature(moved)
    # One lora_B entry off zero and the adapter changes the weights: its own banks again.
    weights_file = unmoved / "adapter_model.safetensors"
    tensors = load_file(weights_file)
    name = next(name for name in tensors if ".lora_B." in name)
    tensors[name][0, 0] = 1e-3
    save_file(tensors, weights_file, metadata={"format": "pt"})
    assert not changes_nothing(unmoved) and signature(unmoved) != signature(sft)

