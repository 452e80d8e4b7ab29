"""One optimiser step's gradient does not depend on how the rows are split: micro-batch sizes 1, 2 and
G, a group's prompt shared or not, one process or two (DDP, gloo), for GRPO, PPO and SFT, with responses
of different lengths (tests/fixed_update.py: a fixed rollout through the real module and Trainer)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fixed_update import GROUP, RESPONSE_LENGTHS, build, step
from memr1.llm.loading import load_tokenizer
from memr1.rl import core

ROOT = Path(__file__).resolve().parents[1]
ALL_ROWS = range(2 * GROUP)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("embedded:smollm2-135m-instruct")


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], label: str) -> None:
    assert got.keys() == want.keys(), label
    for name in want:
        difference = (got[name] - want[name]).abs().max().item()
        assert difference <= 1e-6, f"{label}: {name} differs by {difference:.2e} (|g| max {want[name].abs().max():.2e})"


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
@pytest.mark.parametrize("algo_name", ["grpo"])  # SFT divides by the same all-reduced denominator (self.denominator)
def test_a_two_process_ddp_step_equals_the_single_process_step(tmp_path, algo_name):
    """Two gloo processes, each with one of the two groups, step as one process with both."""
    grads = {}
    for devices in (1, 2):
        out = tmp_path / f"grads{devices}.pt"
        result = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "scripts" / "ddp_update.py"), algo_name, str(devices), str(out)],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        grads[devices] = torch.load(out)
    assert grads[1] and max(g.abs().max() for g in grads[1].values()) > 1e-3
    assert_same(grads[2], grads[1], f"{algo_name}: 2 processes against 1")
