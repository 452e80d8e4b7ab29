"""Memory-SFT: the loss on response tokens only, the offline teachers' targets, their JSONL cache, and
RL from an SFT warm start (the adapter loaded, the KL reference equal to the warm start)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from lightning.pytorch import Trainer

from memr1.apps import CONFIG_DIR
from memr1.agents.answer import AnswerAgent
from memr1.agents.manager import ManagerAgent
from memr1.rl.algorithms import AlgoConfig
from memr1.envs.answer import AnswerEnv, AnswerState
from memr1.llm.engines import encode_prompts
from memr1.llm.loading import WARM_START_FILE, checkpoint_chain, load_policy, load_tokenizer
from memr1.llm.openai_client import EndpointError
from memr1.llm.sharding import full_state_dict
from memr1.llm.testing import save_lora_export, save_tiny_checkpoint
from memr1.envs.manager import ManagerEnv, ManagerState
from memr1.llm.engines import HFEngine
from memr1.llm.sampling import SamplingConfig
from memr1.modules.sft import AnswerSFTModule, ManagerSFTModule
from memr1.rl import core
from memr1.teachers import EndpointTeacher, EvidenceAnswerTeacher, RuleManagerTeacher, TeacherTrajectories, closest_to_answer
from memr1.types import Fact, MemoryEntry, OpKind, Question
from tests.processes import free_port

CONF = CONFIG_DIR


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("embedded:smollm2-135m-instruct")


@pytest.fixture(scope="module")
def backbone(tmp_path_factory, tokenizer) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model", tokenizer)


QUESTION = Question(
    qid="conv-x/q0", conversation_id="conv-x", question="Where did Ann move?", answer="Lisbon",
    evidence=("D2:4",), category=4,
)
MEMORIES = {
    "Ann": [
        MemoryEntry("m3", "Ann moved to Lisbon", "Ann", "9 May, 2023", provenance=("D2:4",)),
        MemoryEntry("m1", "Ann likes  tea", "Ann", "1 May, 2023", provenance=("D1:2",)),
    ],
    "Bo": [MemoryEntry("m7", "Bo visited Ann in Lisbon", "Bo", "", provenance=("D3:1", "D2:4"))],
}


def test_sft_loss_is_the_mean_nll_of_response_tokens_only():
    # Two rows; the mask keeps 3 response tokens: (1 + 2 + 3) / 3. The masked token (-9) is left out.
    logprobs = torch.tensor([[-1.0, -2.0], [-3.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert float(core.sft_loss(logprobs, mask)) == pytest.approx(2.0)
    # Per sequence: (1.5 + 3) / 2.
    assert float(core.sft_loss(logprobs, mask, "seq-mean-token-mean")) == pytest.approx(2.25)
    # Weighed 2 and 1: the first row's tokens count twice, the denominator stays 3 tokens: (2 + 4 + 3) / 3;
    # per sequence (2 x 1.5 + 3) / 2.
    weights = torch.tensor([2.0, 1.0])
    assert float(core.sft_loss(logprobs, mask, weights=weights)) == pytest.approx(3.0)
    assert float(core.sft_loss(logprobs, mask, "seq-mean-token-mean", weights=weights)) == pytest.approx(3.0)


def test_the_module_loss_scores_the_target_tokens_after_the_prompt(backbone, tokenizer, tmp_path):
    policy, _ = load_policy(backbone)
    env = AnswerEnv(AnswerAgent(distill=True))
    state = AnswerState(QUESTION, MEMORIES)
    teacher = EvidenceAnswerTeacher()
    trajectories = TeacherTrajectories(teacher, tmp_path / "answer.jsonl")
    module = AnswerSFTModule(policy, tokenizer, env, AlgoConfig(name="sft"), max_new_tokens=64, trajectories=trajectories)

    # By hand: prompt ids, then the target's ids and EOS; the loss is the mean of -log p(token | prefix)
    # over the target's positions only.
    prompt = encode_prompts(tokenizer, [env.prompt(state)])[0]
    target = tokenizer(teacher.target(state, env.prompt(state)), add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    ids = torch.tensor([prompt + target])
    with torch.no_grad():
        logits = policy(input_ids=ids).logits[0]
    logp = torch.log_softmax(logits.float(), dim=-1)
    expected = -sum(float(logp[len(prompt) + j - 1, token]) for j, token in enumerate(target)) / len(target)
    assert module.sft_loss_of([state]) == pytest.approx(expected, abs=1e-4)


def test_the_manager_weighs_each_target_by_the_operation_it_teaches(backbone, tokenizer, tmp_path):
    """algo.operation_weights: the rule teacher's NONE (a near-duplicate) weighs 3, its ADD 1 (unnamed);
    per sequence, the pair's loss is (3 x the NONE's loss + the ADD's) / 2."""
    policy, _ = load_policy(backbone)
    fact = Fact("Ann moved to Lisbon in May", "Ann", ("D2:4",), 2, "9 May, 2023")
    far = MemoryEntry("m1", "Ann likes tea", "Ann", score=0.30)
    near = MemoryEntry("m3", "Ann moved to Lisbon", "Ann", score=0.91)
    kept = ManagerState(fact, "conv-x", ("Ann", "Bo"), bank=None, candidates=[far, near], questions=[QUESTION])
    added = ManagerState(fact, "conv-x", ("Ann", "Bo"), bank=None, candidates=[far], questions=[QUESTION])
    env = ManagerEnv(ManagerAgent(), AnswerAgent(), HFEngine(policy, tokenizer), SamplingConfig(max_new_tokens=8, temperature=0.0), k_per_speaker=5)

    def module(**weights: float) -> ManagerSFTModule:
        algo = AlgoConfig(name="sft", loss_agg_mode="seq-mean-token-mean", operation_weights=weights)
        trajectories = TeacherTrajectories(RuleManagerTeacher(duplicate_score=0.85), tmp_path / "manager.jsonl")
        return ManagerSFTModule(policy, tokenizer, env, algo, max_new_tokens=64, trajectories=trajectories)

    weighed = module(noop=3.0)
    prompts = [env.prompt(kept), env.prompt(added)]
    assert weighed.target_weights([kept, added], weighed.trajectories.targets([kept, added], prompts)) == [3.0, 1.0]
    plain = module()
    expected = (3.0 * plain.sft_loss_of([kept]) + plain.sft_loss_of([added])) / 2
    assert weighed.sft_loss_of([kept, added]) == pytest.approx(expected, rel=1e-5)
    assert plain.sft_loss_of([kept, added]) == pytest.approx((plain.sft_loss_of([kept]) + plain.sft_loss_of([added])) / 2, rel=1e-5)


def test_operation_weights_name_an_operation_and_are_finite_weights():
    with pytest.raises(ValueError, match="algo.operation_weights.merge: not an operation; the operations are add, update, delete, noop"):
        AlgoConfig(name="sft", operation_weights={"merge": 2.0})
    with pytest.raises(ValueError, match=r"algo.operation_weights.update: must be a finite weight >= 0, got -1.0"):
        AlgoConfig(name="sft", operation_weights={"update": -1.0})


def test_the_evidence_teacher_copies_the_evidence_memories_then_the_gold_answer():
    env = AnswerEnv(AnswerAgent(distill=True))
    state = AnswerState(QUESTION, MEMORIES)
    target = EvidenceAnswerTeacher().target(state, env.prompt(state))
    assert target == (
        "**Relevant memories:**\n"
        "[9 May, 2023] Ann moved to Lisbon\n"
        "[unknown date] Bo visited Ann in Lisbon\n"
        "**Answer:** Lisbon"
    )
    parsed = env.agent.parse(target)  # the agent's own parser reads it as well formed
    assert (parsed.answer, parsed.format_error) == ("Lisbon", None)
    assert EvidenceAnswerTeacher(distill=False).target(state, []) == "**Answer:** Lisbon"


def test_without_retrieved_evidence_the_teacher_lists_the_memory_closest_to_the_answer():
    env = AnswerEnv(AnswerAgent(distill=True))
    # No memory cites D9:9. "Bo visited Ann in Lisbon" shares "lisbon" with the gold answer; so does
    # nothing else, so it is listed although it ranks lower than Ann's memories.
    missed = Question("conv-x/q2", "conv-x", "Where did Ann move?", "Lisbon", ("D9:9",), 4)
    state = AnswerState(missed, {**MEMORIES, "Ann": [MEMORIES["Ann"][1]]})
    target = EvidenceAnswerTeacher().target(state, env.prompt(state))
    assert target == "**Relevant memories:**\n[unknown date] Bo visited Ann in Lisbon\n**Answer:** Lisbon"
    assert env.agent.parse(target).format_error is None
    # No memory shares a word with the answer: the better retrieval score wins, then the earlier one.
    low = MemoryEntry("a", "Ann likes tea", "Ann", "1 May", provenance=("D1:2",), score=0.2)
    high = MemoryEntry("b", "Bo runs", "Bo", "2 May", provenance=("D1:3",), score=0.7)
    assert closest_to_answer([low, high], "Porto") is high
    assert closest_to_answer([MEMORIES["Ann"][1], MEMORIES["Bo"][0]], "Porto") is MEMORIES["Ann"][1]
    # Nothing retrieved: the list stays empty (the prompt showed no memory to copy).
    empty = AnswerState(missed, {"Ann": [], "Bo": []})
    assert EvidenceAnswerTeacher().target(empty, env.prompt(empty)) == "**Relevant memories:**\n**Answer:** Lisbon"


def test_the_rule_teacher_adds_unless_a_same_speaker_memory_is_a_near_duplicate():
    fact = Fact("Ann moved to Lisbon in May", "Ann", ("D2:4",), 2, "9 May, 2023")
    close_other_speaker = MemoryEntry("m9", "Bo moved to Lisbon in May", "Bo", score=0.95)
    close_same = MemoryEntry("m3", "Ann moved to Lisbon", "Ann", score=0.91)
    far_same = MemoryEntry("m1", "Ann likes tea", "Ann", score=0.30)
    teacher = RuleManagerTeacher(duplicate_score=0.85)
    agent = ManagerAgent()

    def decide(candidates: list[MemoryEntry]) -> str:
        state = ManagerState(fact, "conv-x", ("Ann", "Bo"), bank=None, candidates=candidates, questions=[QUESTION])
        return teacher.target(state, [])

    added = decide([close_other_speaker, far_same])
    assert added == '{"memory": [{"id": "2", "text": "Ann moved to Lisbon in May", "event": "ADD"}]}'
    kept = decide([close_other_speaker, far_same, close_same])
    assert kept == '{"memory": [{"id": "2", "text": "Ann moved to Lisbon", "event": "NONE"}]}'
    # In the Manager's exact format: its parser reads both without a format error.
    op = agent.parse(added, fact, [close_other_speaker, far_same])
    assert (op.kind, op.text, op.format_error) == (OpKind.ADD, "Ann moved to Lisbon in May", None)
    op = agent.parse(kept, fact, [close_other_speaker, far_same, close_same])
    assert (op.kind, op.format_error) == (OpKind.NOOP, None)


class CountingTeacher(EvidenceAnswerTeacher):
    name = "counting"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def target(self, state, messages):
        self.calls += 1
        return super().target(state, messages)


def test_trajectories_are_cached_with_provenance_and_read_back(tmp_path):
    env = AnswerEnv(AnswerAgent(distill=True))
    state = AnswerState(QUESTION, MEMORIES)
    other = AnswerState(Question("conv-x/q1", "conv-x", "Who visited Ann?", "Bo", ("D3:1",), 1), MEMORIES)
    path = tmp_path / "teachers" / "answer-dataset.jsonl"
    teacher = CountingTeacher()
    first = TeacherTrajectories(teacher, path)
    targets = first.targets([state, other, state], [env.prompt(state), env.prompt(other), env.prompt(state)])
    assert teacher.calls == 2 and targets[0] == targets[2]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["teacher"], r["conversation_id"], r["qid"]) for r in rows] == [("counting", "conv-x", "conv-x/q0"), ("counting", "conv-x", "conv-x/q1")]
    assert rows[1]["target"].endswith("**Answer:** Bo")
    # A row cut by a kill is skipped; the complete ones are read back without asking the teacher.
    with path.open("a") as out:
        out.write('{"key": "abc", "tea')
    again = CountingTeacher()
    second = TeacherTrajectories(again, path)
    assert len(second) == 2
    assert second.targets([other], [env.prompt(other)]) == [targets[1]] and again.calls == 0
    # Rows another teacher wrote (an older version's targets) are not read back: its states are asked anew.
    renamed = CountingTeacher()
    renamed.name = "counting-v2"
    third = TeacherTrajectories(renamed, path)
    assert len(third) == 0
    third.targets([other], [env.prompt(other)])
    assert renamed.calls == 1


def test_an_unreachable_teacher_endpoint_fails_with_its_address():
    url = f"http://127.0.0.1:{free_port()}/v1"
    teacher = EndpointTeacher(url, "big-model")
    with pytest.raises(EndpointError, match=f"127.0.0.1:{url.split(':')[-1]}"):
        teacher.target(None, [{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="teacher.url and teacher.model"):
        EndpointTeacher("", "m")


def logits_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def train_config(backbone: Path, tmp_path: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(
            "train",
            [f"backbone.name_or_path={backbone}", f"banks.dir={tmp_path / 'banks'}", f"run_dir={tmp_path / 'run'}", *overrides],
        )


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_rl_from_a_warm_start_loads_it_and_takes_it_as_the_kl_reference(backbone, tmp_path, lora):
    from memr1.factories import build_module

    init = save_lora_export(backbone, tmp_path / "sft" / "policy" / "best")
    cfg = train_config(backbone, tmp_path, "algo=grpo", f"answer.ckpt={init}", f"lora.enabled={str(lora).lower()}", "lora.target_modules=[q_proj,v_proj]")
    module = build_module(cfg)
    ids = torch.tensor([[1, 5, 9, 14, 2, 7]])
    warm, _ = load_policy(backbone, ckpt=init)
    base, _ = load_policy(backbone)
    expected = logits_of(warm, ids)
    assert not torch.allclose(logits_of(base, ids), expected, atol=1e-3)  # the adapter matters
    with module._reference() as reference:
        assert torch.allclose(logits_of(reference.eval(), ids), expected, atol=1e-5)
    assert torch.allclose(logits_of(module.policy.eval(), ids), expected, atol=1e-5)  # fresh adapters start at 0


def test_a_warm_started_lora_export_names_its_warm_start_and_loads_through_it(backbone, tmp_path):
    from memr1.callbacks.export import ExportPolicy
    from memr1.factories import build_module

    torch.manual_seed(0)  # the adapters' random init: the same numbers every run
    init = save_lora_export(backbone, tmp_path / "sft" / "policy" / "best")
    cfg = train_config(backbone, tmp_path, "algo=grpo", f"answer.ckpt={init}", "lora.enabled=true", "lora.target_modules=[q_proj,v_proj]")
    module = build_module(cfg)
    with torch.no_grad():  # the RL adapters learned something of their own
        for name, param in module.policy.named_parameters():
            if "lora_B" in name:
                param.add_(0.3)
    trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    exported = ExportPolicy(tmp_path / "rl" / "policy", init=str(init)).export(trainer, module, "last")
    # Under FSDP the export writes the policy's gathered state dict: done here with the (unsharded)
    # policy, it writes the same adapter as the policy's own save.
    module.policy.save_pretrained(tmp_path / "gathered", state_dict=full_state_dict(module.policy))
    assert (tmp_path / "gathered" / "adapter_model.safetensors").read_bytes() == (exported / "adapter_model.safetensors").read_bytes()
    assert json.loads((exported / WARM_START_FILE).read_text()) == {"init": str(init.resolve())}
    assert checkpoint_chain(exported) == [init.resolve(), exported]
    loaded, _ = load_policy(backbone, ckpt=exported)
    ids = torch.tensor([[3, 8, 1, 4]])
    # The chain loads its adapters folded into the weights, the module adds them at run time: fp32
    # rounding that grows with the logits (up to 6e-5 on logits of ~19 over ten unseeded runs, 2 of 12
    # over a fixed 1e-4), so the bound is relative to their scale.
    loaded_logits, policy_logits = logits_of(loaded, ids), logits_of(module.policy.eval(), ids)
    assert (loaded_logits - policy_logits).abs().max() <= 2e-5 * policy_logits.abs().max()
    # A warm start that is gone is named as such.
    (exported / WARM_START_FILE).write_text(json.dumps({"init": str(tmp_path / "gone")}) + "\n")
    with pytest.raises(FileNotFoundError, match="the warm start named in"):
        load_policy(backbone, ckpt=exported)
