"""One optimiser step's gradient does not depend on how the rows are split: micro-batch sizes 1, 2 and
G, a group's prompt shared or not, one process or two (DDP or FSDP2, gloo), for GRPO, PPO and SFT, with responses
of different lengths (tests/fixed_update.py: a fixed rollout through the real module and Trainer)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fixed_update import GROUP, RESPONSE_LENGTHS, build, step, trainable_parameters
from memr1.llm.loading import load_tokenizer
from memr1.rl import core

ROOT = Path(__file__).resolve().parents[1]
ALL_ROWS = range(2 * GROUP)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("embedded:smollm2-135m-instruct")


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], label: str, atol: float = 1e-6) -> None:
    assert got.keys() == want.keys(), label
    for name in want:
        difference = (got[name] - want[name]).abs().max().item()
        assert difference <= atol, f"{label}: {name} differs by {difference:.2e} (|g| max {want[name].abs().max():.2e})"


@pytest.mark.parametrize("algo_name", ["grpo", "ppo"])
@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_the_rl_gradient_is_the_same_for_every_micro_batch_size_and_prompt_sharing(tokenizer, algo_name, loss_agg_mode):
    reference = step(build(tokenizer, algo_name, micro=2 * GROUP, share=False, loss_agg_mode=loss_agg_mode), ALL_ROWS)
    assert max(g.abs().max() for g in reference.values()) > 1e-3  # a real gradient, not zeros against zeros
    assert any(name.startswith("critic/") for name in reference) == (algo_name == "ppo")
    for micro in (1, 2, GROUP):
        for share in (False, True):
            got = step(build(tokenizer, algo_name, micro, share, loss_agg_mode), ALL_ROWS)
            assert_same(got, reference, f"{algo_name} micro {micro} share {share}")


def test_the_sft_gradient_is_the_same_for_every_micro_batch_size(tokenizer):
    reference = step(build(tokenizer, "sft", micro=2 * GROUP), ALL_ROWS)
    assert max(g.abs().max() for g in reference.values()) > 1e-3
    for micro in (1, 2, GROUP):
        assert_same(step(build(tokenizer, "sft", micro), ALL_ROWS), reference, f"sft micro {micro}")


def test_weighting_micro_batches_by_rows_would_have_changed_the_loss_with_the_split():
    """The bug this fixes, on the same lengths: averaging each micro-batch over its own tokens and
    weighting it by its rows gives another loss for micro-batches of 2 than for the whole batch."""
    losses = torch.arange(1.0, 37.0).reshape(6, 6)
    lengths = torch.tensor([length for group in RESPONSE_LENGTHS for length in group])
    mask = (torch.arange(6)[None] < lengths[:, None]).float()
    whole = core.aggregate_loss(losses, mask)
    by_rows = sum(core.aggregate_loss(losses[i : i + 2], mask[i : i + 2]) * 2 / 6 for i in range(0, 6, 2))
    denominator = core.LossDenominator.of(mask)
    by_tokens = sum(core.aggregate_loss(losses[i : i + 2], mask[i : i + 2], denominator=denominator) for i in range(0, 6, 2))
    assert abs(float(by_rows - whole)) > 0.5
    assert abs(float(by_tokens - whole)) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy, algo_name, lora",
    # FSDP2's PPO case covers GRPO's paths too: LoRA, the adapters-disabled reference and its KL, plus a
    # sharded critic and the advantages whitened over both ranks.
    [("ddp", "grpo", True), ("fsdp", "ppo", True), ("fsdp", "sft", False)],
    ids=["ddp-grpo-lora", "fsdp-ppo-lora", "fsdp-sft-full"],
)
def test_two_processes_train_as_one_process(tmp_path, tokenizer, strategy, algo_name, lora):
    """Two gloo processes, each with one of the two groups, under the strategy train.py builds for
    trainer=cpu (DDP) or trainer=fsdp trainer.accelerator=cpu (FSDP2, every model sharded per decoder
    layer): three steps give the single process's gradients and parameters (PPO's advantages are
    whitened over both ranks' rows, the loss divided by both ranks' tokens)."""
    module = build(tokenizer, algo_name, micro=2, lora=lora)
    want = {"grads": step(module, ALL_ROWS, steps=3), "params": trainable_parameters(module)}
    out = tmp_path / "two.pt"
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "scripts" / "distributed_update.py"), algo_name, "2", strategy, "3", str(out),
         *([] if lora else ["full"])],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    got = torch.load(out)
    assert got["sharded"] == (strategy == "fsdp")
    assert max(g.abs().max() for g in want["grads"].values()) > 1e-3
    assert_same(got["grads"], want["grads"], f"{strategy} {algo_name}: gradients of step 3, 2 processes against 1")
    assert_same(got["params"], want["params"], f"{strategy} {algo_name}: parameters after 3 steps", atol=1e-5)
