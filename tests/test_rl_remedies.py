"""DAPO's remedies and the run-time precision on a tiny random Llama with the real SmolLM2 tokenizer and
a real Lightning Trainer: flat groups re-drawn until the step is full or the cap is hit, the overlong
penalty in the reward, RLOO's and Dr. GRPO's advantages through the module, bf16 chosen only where the
CPU reports bf16 units, in bf16 the update's log-probs equal to pi_old's (ratio 1 within 1e-3), and
the frozen weights held in bf16 computing exactly what autocast computes."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import pytest
import torch
from lightning.pytorch import LightningDataModule, Trainer
from torch.utils.data import DataLoader

from memr1.envs.base import Reward
from memr1.llm.engines import HFEngine
from memr1.llm.loading import load_tokenizer
from memr1.llm.lora import apply_lora
from memr1.llm.precision import FP32, FrozenLinearCopies, choose_precision, cpu_flags
from memr1.llm.sampling import SamplingConfig
from memr1.llm.testing import tiny_causal_lm
from memr1.modules.base import RLModule
from memr1.rl.algorithms import AlgoConfig
from memr1.rl.batch import RolloutBatch, response_logprobs


class SpreadEnv:
    """A state named "flat..." pays every sample 0.5 (a flat group); any other pays the first sample of
    its group 1 and the rest 0."""

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def prompt(self, state: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": state}]

    def score(self, states: Sequence[str], responses: Sequence[str]) -> list[Reward]:
        return [
            Reward.of(0.5 if state.startswith("flat") else float(row % self.group_size == 0))
            for row, state in enumerate(states)
        ]


class ScriptedStates(LightningDataModule):
    """One step's batch, and the extra draws dynamic sampling asks for, scripted; it records the asks."""

    def __init__(self, batch: list[str], draws: list[list[str]]) -> None:
        super().__init__()
        self.batch, self.draws, self.asked = batch, draws, []

    def train_dataloader(self) -> DataLoader:
        return DataLoader([self.batch], batch_size=None)

    def extra_states(self, step: int, draw: int) -> list[str]:
        self.asked.append((step, draw))
        return self.draws[draw - 1]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("embedded:smollm2-135m-instruct")


def run_step(module: RLModule, data: LightningDataModule) -> RLModule:
    Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False).fit(module, datamodule=data)
    return module


def filtering(tokenizer, cap: int, group: int = 2) -> RLModule:
    algo = AlgoConfig(name="grpo", group_size=group, actor_lr=1e-3, kl_coef=0.0, micro_batch_size=4,
                      filter_groups={"enable": True, "max_num_gen_batches": cap})
    return RLModule(tiny_causal_lm(tokenizer, seed=1), tokenizer, SpreadEnv(group), algo, max_new_tokens=4, seed=3)


def test_flat_groups_are_redrawn_until_the_step_is_full(tokenizer):
    data = ScriptedStates(["flat-a", "spread-a"], draws=[["flat-b", "flat-c"], ["spread-b", "flat-d"], ["spread-c", "spread-d"]])
    module = run_step(filtering(tokenizer, cap=10), data)
    assert data.asked == [(0, 1), (0, 2)]  # the third draw was never needed
    metrics = module.last_step.metrics
    assert (metrics["filter/groups_drawn"], metrics["filter/groups_kept"], metrics["filter/gen_batches"]) == (6.0, 2.0, 3.0)
    assert metrics["reward/zero_std_group_frac"] == 0.0 and metrics["advantage/nonzero_frac"] == 1.0
    batch, rewards = module.last_step.rollout, module.last_step.rewards
    assert len(batch) == 4 and [r.score for r in rewards] == [1.0, 0.0, 1.0, 0.0]


def test_the_cap_on_extra_batches_ends_the_redrawing(tokenizer):
    data = ScriptedStates(["flat-a", "spread-a"], draws=[["flat-b", "flat-c"], ["spread-b", "spread-c"]])
    module = run_step(filtering(tokenizer, cap=2), data)
    assert data.asked == [(0, 1)]
    metrics = module.last_step.metrics
    assert (metrics["filter/groups_drawn"], metrics["filter/groups_kept"], metrics["filter/gen_batches"]) == (4.0, 1.0, 2.0)
    assert len(module.last_step.rollout) == 2  # the one group with spread


def test_a_step_that_keeps_no_group_trains_on_its_first_batch(tokenizer):
    data = ScriptedStates(["flat-a", "flat-b"], draws=[["flat-c", "flat-d"]])
    module = run_step(filtering(tokenizer, cap=2), data)
    assert module.last_step.metrics["filter/groups_kept"] == 0.0
    assert len(module.last_step.rollout) == 4 and module.last_step.metrics["advantage/nonzero_frac"] == 0.0


def test_reinforce_refuses_filter_groups_since_its_flat_groups_still_learn():
    algo = AlgoConfig(name="reinforce", group_size=2, filter_groups={"enable": True})
    assert not algo.algorithm.flat_groups_are_zero
    with pytest.raises(ValueError, match="algo.filter_groups.colour: no such key"):
        AlgoConfig(name="grpo", filter_groups={"colour": 1})


def test_overlong_responses_lose_reward_by_how_far_they_ran_past_the_buffer(tokenizer):
    # A random tiny model never emits EOS in 8 tokens: every response runs to the cap, 8 = 4 past 8 - 4.
    algo = AlgoConfig(name="grpo", group_size=2, actor_lr=1e-3, kl_coef=0.0, overlong_buffer={"enable": True, "len": 4, "penalty_factor": 0.5})
    module = RLModule(tiny_causal_lm(tokenizer, seed=1), tokenizer, SpreadEnv(2), algo, max_new_tokens=8, seed=3)
    rows = module.rollouts.sample(["spread-a"], step=0)
    assert [len(sample.response_ids) for sample, _ in rows] == [8, 8]
    assert [reward.score for _, reward in rows] == [1.0 - 0.5, 0.0 - 0.5]  # -(8 - 4) / 4 * 0.5


@pytest.mark.parametrize(("name", "expected"), [("rloo", [1.0, -1.0, 0.0, 0.0]), ("dr_grpo", [0.5, -0.5, 0.0, 0.0])])
def test_rloo_and_dr_grpo_advantages_through_the_module(tokenizer, name, expected):
    extra = {"loss_agg_mode": "seq-mean-token-sum-norm"} if name == "dr_grpo" else {}
    algo = AlgoConfig(name=name, group_size=2, kl_coef=0.0, **extra)
    module = RLModule(tiny_causal_lm(tokenizer, seed=1), tokenizer, SpreadEnv(2), algo, max_new_tokens=4)
    batch, _ = module.rollout(["spread-a", "flat-a"])  # scores 1, 0 | 0.5, 0.5
    module._advantages(batch, [0, 0, 1, 1])
    assert batch.advantages[:, 0].tolist() == expected


def test_bf16_is_chosen_only_where_the_cpu_reports_bf16_units(tmp_path):
    assert choose_precision("auto", "cpu", flags=frozenset({"avx2", "fma"})).is_fp32
    for units in ({"avx512_bf16"}, {"amx_bf16", "avx2"}):
        chosen = choose_precision("auto", "cpu", flags=frozenset(units))
        assert chosen.name == "bf16" and "bf16 units" in chosen.reason
    assert choose_precision("fp32", "cpu", flags=frozenset({"avx512_bf16"})).is_fp32
    assert "emulated" in choose_precision("bf16", "cpu", flags=frozenset({"avx2"})).reason
    with pytest.raises(ValueError, match="precision: 'fp16' is not one of"):
        choose_precision("fp16", "cpu")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx2 avx512_bf16\n")
    assert cpu_flags(cpuinfo) == {"fpu", "sse2", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_in_bf16_the_update_starts_on_policy(tokenizer):
    """In bf16 the sampler's log-probs (one token at a time) are not the update's (whole sequences). A
    single pass (one epoch, one mini-batch) takes pi_old from the update's own forward, detached: the
    ratio is exactly 1 and nothing is computed before. With more passes pi_old is recomputed by the
    update's forward beforehand, so the first epoch's ratio is 1 within 1e-3."""
    bf16 = choose_precision("bf16", "cpu")
    for epochs in (1, 2):
        algo = AlgoConfig(name="grpo", group_size=3, actor_lr=1e-3, kl_coef=0.0, micro_batch_size=2, temperature=0.7, ppo_epochs=epochs)
        module = RLModule(tiny_causal_lm(tokenizer, seed=1, init_std=0.02), tokenizer, SpreadEnv(3), algo, max_new_tokens=6, seed=3, precision=bf16)
        run_step(module, ScriptedStates(["spread-a", "spread-b"], draws=[]))
        batch = module.last_step.rollout
        if epochs == 1:
            assert batch.old_logprobs is None
            assert module.last_step.metrics["actor/approx_kl"] == 0.0 and module.last_step.metrics["actor/clip_frac"] == 0.0
        else:
            assert batch.old_logprobs is not None
            assert abs(module.last_step.metrics["actor/approx_kl/epoch0"]) < 1e-3 and module.last_step.metrics["actor/clip_frac/epoch0"] == 0.0
            assert module.last_step.metrics["actor/approx_kl/epoch1"] != 0.0  # the second pass is off-policy: the clip can act
    # The fp32 module reuses the sampler's log-probs; the bf16 one does not.
    assert RLModule(tiny_causal_lm(tokenizer), tokenizer, SpreadEnv(3), algo, precision=FP32)._reuse_sampler_logprobs
    assert not module._reuse_sampler_logprobs


def test_frozen_weights_held_in_bf16_compute_what_autocast_computes(tokenizer):
    """The bf16 copies of a LoRA model's frozen weights give the same log-probs and LoRA gradients as
    autocast's per-call casts, bit for bit; the fp32 weights are back afterwards, and the tied
    embedding / lm_head is left in fp32."""
    torch.manual_seed(0)
    model = apply_lora(tiny_causal_lm(tokenizer, seed=2, init_std=0.02), r=4, dropout=0.0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)  # a trained adapter: its path contributes to the gradient
    ids = torch.randint(3, len(tokenizer), (2, 9), generator=torch.Generator().manual_seed(0))
    batch = RolloutBatch(ids, torch.ones_like(ids), ids[:, 5:], torch.ones(2, 4), torch.zeros(2))
    bf16 = choose_precision("bf16", "cpu")
    copies = FrozenLinearCopies(bf16)
    masters = {name: (param.data_ptr(), param.dtype) for name, param in model.named_parameters()}

    def logprobs_and_grads(swap: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        with bf16.autocast("cpu"), copies.swapped(model) if swap else contextlib.nullcontext():
            if swap:
                frozen = [p for n, p in model.named_parameters() if "proj.base_layer" in n or "mlp" in n and "lora" not in n]
                assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
                assert model.get_input_embeddings().weight.dtype == torch.float32
                assert model.get_output_embeddings().weight.dtype == torch.bfloat16  # tied to it outside the context
            logprobs, _ = response_logprobs(model, batch)
            logprobs.sum().backward()
        return logprobs.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    plain, plain_grads = logprobs_and_grads(swap=False)
    swapped, swapped_grads = logprobs_and_grads(swap=True)
    assert torch.equal(plain, swapped)
    assert plain_grads.keys() == swapped_grads.keys() and all(torch.equal(plain_grads[n], swapped_grads[n]) for n in plain_grads)
    assert all((param.data_ptr(), param.dtype) == masters[name] for name, param in model.named_parameters())
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    again, _ = logprobs_and_grads(swap=True)  # the copies are cached, and still right
    assert torch.equal(plain, again)
    with FrozenLinearCopies(FP32).swapped(model):
        assert all(param.dtype == torch.float32 for param in model.parameters())


def test_frozen_copies_first_made_under_inference_mode_serve_a_training_forward(tokenizer):
    """Lightning validates under inference mode, so with validation before training the bf16 copies are
    first made there; the update's forward then saves them for backward, which an inference tensor
    refuses ("Inference tensors cannot be saved for backward", the lift's first bf16 GRPO step). Made
    as normal tensors, they serve it, with autocast's gradients bit for bit."""
    model = apply_lora(tiny_causal_lm(tokenizer, seed=2, init_std=0.02), r=4, dropout=0.0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    ids = torch.randint(3, len(tokenizer), (2, 9), generator=torch.Generator().manual_seed(1))
    batch = RolloutBatch(ids, torch.ones_like(ids), ids[:, 5:], torch.ones(2, 4), torch.zeros(2))
    bf16 = choose_precision("bf16", "cpu")
    copies = FrozenLinearCopies(bf16)
    with torch.inference_mode(), bf16.autocast("cpu"), copies.swapped(model):  # a validation's forward
        validated, _ = response_logprobs(model, batch)

    def gradients(frozen: FrozenLinearCopies) -> dict[str, torch.Tensor]:
        model.zero_grad()
        with bf16.autocast("cpu"), frozen.swapped(model):
            logprobs, _ = response_logprobs(model, batch)
            logprobs.sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    trained, plain = gradients(copies), gradients(FrozenLinearCopies(FP32))  # FP32: no copies, autocast's casts
    assert trained.keys() == plain.keys() and all(torch.equal(trained[n], plain[n]) for n in plain)
    with torch.no_grad(), bf16.autocast("cpu"), copies.swapped(model):
        assert torch.equal(response_logprobs(model, batch)[0], validated)


def test_the_engine_decodes_with_the_frozen_copies_what_autocast_decodes(tokenizer):
    """The HF engine in bf16 holds its frozen weights once in bf16: the same tokens, log-probs and
    trunk states as autocast's per-call casts; a weight changed in place (merged, reloaded) gets a
    new copy, so the engine never decodes with stale weights."""
    model = apply_lora(tiny_causal_lm(tokenizer, seed=3, init_std=0.02), r=4, dropout=0.0, top_layers=1)
    bf16 = choose_precision("bf16", "cpu")
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.0, n=3, seed=11)
    prompts = ["alice moved to paris in may", "bob keeps two cats and a dog"]

    def decoded(engine: HFEngine) -> list[tuple[list[int], list[float], torch.Tensor]]:
        out = engine.generate(prompts, sampling, trunk_depth=1)
        return [(g.response_ids, g.logprobs, g.trunk_hidden) for samples in out for g in samples]

    plain = HFEngine(model, tokenizer, precision=bf16, frozen_copies=FrozenLinearCopies(FP32))  # no copies: autocast casts
    copied = HFEngine(model, tokenizer, precision=bf16)
    for (ids, logprobs, trunk), (ids2, logprobs2, trunk2) in zip(decoded(plain), decoded(copied), strict=True):
        assert ids == ids2 and logprobs == logprobs2 and torch.equal(trunk, trunk2)
    assert all(param.dtype == torch.float32 for param in model.parameters())  # the masters are back

    head = model.get_output_embeddings()
    with torch.no_grad():
        head.weight.mul_(3.0)  # in place, as a merge or a load_state_dict would
    assert [row[:2] for row in decoded(plain)] == [row[:2] for row in decoded(copied)]
