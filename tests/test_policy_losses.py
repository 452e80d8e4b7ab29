"""The policy losses of `memr1.rl.policy_losses`: GSPO's sequence ratio by hand, a loss of one's own
loaded by its module path, and GSPO training a tiny model through the real update."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch

from memr1.llm.testing import tiny_causal_lm
from memr1.modules.base import RLModule
from memr1.rl import policy_losses
from memr1.rl.algorithms import AlgoConfig
from tests.test_rl_module import FirstOfGroupEnv, fit_one_step, sequence_logprobs, tokenizer  # noqa: F401 (a fixture)


def gspo_case(clip_ratio_high: float) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    # Row 0: two tokens, log-ratios 0.2 and 0 (the third is padding), A = +1: s = e^0.1.
    # Row 1: three tokens, each log-ratio 0.3, A = -1: s = e^0.3.
    old = torch.zeros(2, 3)
    logprobs = torch.tensor([[0.2, 0.0, 0.9], [0.3, 0.3, 0.3]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    algo = AlgoConfig(policy_loss="gspo", clip_ratio_low=0.2, clip_ratio_high=clip_ratio_high, loss_agg_mode="seq-mean-token-mean")
    loss, stats = policy_losses.load("gspo")(logprobs, old, advantages, mask, algo, None)
    loss.backward()
    return loss.detach(), logprobs.grad, stats


def test_gspo_takes_the_ratio_and_the_clip_of_the_whole_response_by_hand():
    s0, s1 = math.exp(0.1), math.exp(0.3)
    # Wide clip: nothing clipped. Each token's loss is -A s; the token mean of each row, then the rows'
    # mean: (-s0 + s1) / 2. Token t's gradient is -A s / (2 |y|): -s0 / 4 in row 0, s1 / 6 in row 1.
    loss, grad, stats = gspo_case(clip_ratio_high=0.5)
    assert float(loss) == pytest.approx((-s0 + s1) / 2)
    assert grad.flatten().tolist() == pytest.approx([-s0 / 4, -s0 / 4, 0.0, s1 / 6, s1 / 6, s1 / 6])
    assert float(stats["clip_frac"]) == 0.0 and float(stats["seq_ratio_mean"]) == pytest.approx((s0 + s1) / 2)
    assert float(stats["approx_kl"]) == pytest.approx(-(0.2 + 0.0 + 0.9) / 5)
    # High clip 0.05: row 0 (A > 0, s0 = 1.105 > 1.05) is clipped as a whole, so both its tokens stop;
    # row 1 (A < 0) keeps its unclipped term. A token's own ratio (e^0.2, e^0) decides nothing.
    loss, grad, stats = gspo_case(clip_ratio_high=0.05)
    assert float(loss) == pytest.approx((-1.05 + s1) / 2)
    assert grad.flatten().tolist() == pytest.approx([0.0, 0.0, 0.0, s1 / 6, s1 / 6, s1 / 6])
    assert float(stats["clip_frac"]) == pytest.approx(2 / 5)


def test_a_loss_of_ones_own_is_loaded_by_its_module_path(tmp_path, monkeypatch):
    (tmp_path / "my_project").mkdir()
    (tmp_path / "my_project" / "__init__.py").write_text("")
    (tmp_path / "my_project" / "losses.py").write_text(textwrap.dedent('''
        import torch

        def policy_loss(logprobs, old_logprobs, advantages, response_mask, algo, denominator):
            loss = -(advantages * logprobs * response_mask).sum() / response_mask.sum()
            zero = torch.zeros(())
            return loss, {"clip_frac": zero, "approx_kl": zero}
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert AlgoConfig(policy_loss="my_project.losses").policy_loss == "my_project.losses"
    loss, _ = policy_losses.load("my_project.losses")(torch.ones(1, 2), torch.ones(1, 2), torch.ones(1, 2), torch.ones(1, 2), AlgoConfig(), None)
    assert float(loss) == -1.0
    with pytest.raises(ValueError, match=r"algo.policy_loss: 'my_project.cispo' is not one of memr1's \(gspo, vanilla\)"):
        AlgoConfig(policy_loss="my_project.cispo")
    with pytest.raises(ValueError, match="module memr1.rl.batch defines no policy_loss function"):
        policy_losses.load("memr1.rl.batch")


def test_two_gspo_steps_raise_the_logprob_of_rewarded_samples(tokenizer):  # noqa: F811 (the fixture)
    # memr1/conf/algo/gspo.yaml's settings; the update is one pass, so the ratio is 1 and the narrow clip
    # does not bind: the step follows the group advantages.
    algo = AlgoConfig(
        name="grpo", policy_loss="gspo", clip_ratio_low=3e-4, clip_ratio_high=4e-4, loss_agg_mode="seq-mean-token-mean",
        group_size=4, actor_lr=1e-4, kl_coef=0.0, micro_batch_size=4, grad_clip=100.0,
    )
    module = RLModule(tiny_causal_lm(tokenizer, seed=1), tokenizer, FirstOfGroupEnv(4), algo, max_new_tokens=8, seed=3)
    trainer = fit_one_step(module, ["Say hello.", "Count to three."], steps=2)
    assert trainer.global_step == 2
    old, new, advantage = sequence_logprobs(module)  # the second step's rollout, before and after its update
    assert (advantage[[0, 4]] > 0).all() and (advantage[[1, 2, 3, 5, 6, 7]] < 0).all()
    assert (new[advantage > 0] > old[advantage > 0]).all()
    assert (new[advantage < 0] - old[advantage < 0]).mean() < 0
