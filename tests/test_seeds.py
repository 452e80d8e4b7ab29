"""The random streams of a run (memr1.seeds): one per purpose and index, never shared, the same in
every process (a resumed run, another rank)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from memr1.seeds import STREAMS, stream_seed


def test_no_two_streams_of_a_long_run_share_a_seed():
    # 20,000 steps with 4 dynamic-sampling draws each, validation samples and mini-batch orders: the
    # old arithmetic (seed * 1_000_003 + step + 7_919 * draw) gave step 7,919 draw 0 the seed of step 0
    # draw 1, and validation sample k at step s the rollout seed of step 7 s + k.
    seeds = [stream_seed(3, "rollout", step, draw) for step in range(20_000) for draw in range(4)]
    seeds += [stream_seed(3, "validation_sample", step, k) for step in range(0, 20_000, 25) for k in range(64)]
    seeds += [stream_seed(3, "minibatch_order", step) for step in range(20_000)]
    seeds += [stream_seed(3, "probe")] + [stream_seed(seed, "rollout", 0, 0) for seed in range(4, 100)]
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= seed < 2**63 for seed in seeds)
    torch.Generator().manual_seed(max(seeds))  # in torch's range


@pytest.mark.slow
def test_a_stream_is_the_same_in_another_process():
    code = "from memr1.seeds import stream_seed; print(stream_seed(7, 'rollout', 12, 1))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123"})
    assert int(other.stdout) == stream_seed(7, "rollout", 12, 1)


def test_an_unknown_purpose_is_refused():
    with pytest.raises(ValueError, match=r"unknown purpose 'rollouts'; expected one of"):
        stream_seed(0, "rollouts", 1)
    assert set(STREAMS) == {"rollout", "probe", "validation_sample", "minibatch_order"}
