"""Model loading, the tiny test model, LoRA, the value model and the backbone configs (~15 s without the
slow test; the slow test converts the embedded SmolLM2 on its first run, ~45 s, then loads it in ~1 s)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from memr1.apps import CONFIG_DIR
from memr1.llm.cache import atomic_directory, cache_root
from memr1.llm.engines import HFEngine
from memr1.llm.loading import (
    EMBEDDED_MODELS,
    SMOLLM2_CHAT_TEMPLATE,
    is_embedded,
    load_policy,
    load_tokenizer,
    resolve_checkpoint,
    resolve_dtype,
)
from memr1.llm.lora import apply_lora
from memr1.llm.sampling import SamplingConfig
from memr1.llm.testing import tiny_causal_lm
from memr1.llm.value import ValueModel

EMBEDDED = "embedded:smollm2-135m-instruct"
CONF = CONFIG_DIR / "backbone"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(EMBEDDED)


@pytest.fixture(scope="module")
def saved_tiny_model(tokenizer, tmp_path_factory) -> Path:
    """A tiny model saved as a plain Hugging Face checkpoint directory, with its tokenizer."""
    directory = tmp_path_factory.mktemp("tiny-base")
    tiny_causal_lm(tokenizer).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def logits_of(model, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids).logits


# ---- cache and names -----------------------------------------------------------------------------


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMR1_CACHE", str(tmp_path / "from-env"))
    assert cache_root() == tmp_path / "from-env"
    assert cache_root(tmp_path / "explicit") == tmp_path / "explicit"
    monkeypatch.delenv("MEMR1_CACHE")
    assert cache_root() == Path.home() / ".cache" / "memr1"


def test_atomic_directory_publishes_only_complete_directories(tmp_path):
    target = tmp_path / "models" / "m"
    with pytest.raises(RuntimeError, match="killed halfway"), atomic_directory(target) as staging:
        (staging / "part.bin").write_text("half")
        raise RuntimeError("killed halfway")
    assert not target.exists()
    assert list((tmp_path / "models").iterdir()) == []  # no staging directory left behind

    with atomic_directory(target) as staging:
        (staging / "model.bin").write_text("whole")
    assert (target / "model.bin").read_text() == "whole"
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["m"]

    with atomic_directory(target) as staging:  # someone else finished first: theirs is kept
        (staging / "model.bin").write_text("second")
    assert (target / "model.bin").read_text() == "whole"
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["m"]


def test_names_and_dtypes():
    assert is_embedded(EMBEDDED) and EMBEDDED in EMBEDDED_MODELS
    assert not is_embedded("Qwen/Qwen2.5-3B-Instruct")
    assert resolve_checkpoint("Qwen/Qwen2.5-3B-Instruct") == "Qwen/Qwen2.5-3B-Instruct"
    assert resolve_dtype("bfloat16") is torch.bfloat16 and resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match="dtype: unknown value 'fp8'"):
        resolve_dtype("fp8")
    with pytest.raises(ValueError, match="unknown embedded model 'embedded:gpt5'"):
        load_tokenizer("embedded:gpt5")


def test_missing_model_error_names_it(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(OSError, match="no-such-model"):
        load_policy(missing)


# ---- tokenizer -----------------------------------------------------------------------------------


def test_embedded_tokenizer_carries_smollm2_template(tokenizer):
    # The template read from the GGUF equals the fallback memr1 would set for a GGUF without one.
    assert tokenizer.chat_template == SMOLLM2_CHAT_TEMPLATE


def test_embedded_tokenizer_is_ready_for_generation(tokenizer):
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token == "<|im_end|>" == tokenizer.eos_token
    assert len(tokenizer) == 49152
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert (
        rendered
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer("<|im_start|>user")["input_ids"][0] == tokenizer.convert_tokens_to_ids("<|im_start|>")


# ---- tiny model ----------------------------------------------------------------------------------


def test_tiny_model_is_small_seeded_and_leaves_global_rng_alone(tokenizer):
    state = torch.get_rng_state()
    first, second, other = (
        tiny_causal_lm(tokenizer),
        tiny_causal_lm(tokenizer),
        tiny_causal_lm(tokenizer, seed=1),
    )
    assert torch.equal(torch.get_rng_state(), state)
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(first.state_dict()[weight], second.state_dict()[weight])
    assert not torch.equal(first.state_dict()[weight], other.state_dict()[weight])
    config = first.config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.head_dim) == (
        2,
        64,
        4,
        16,
    )
    assert config.vocab_size == len(tokenizer) and config.eos_token_id == tokenizer.eos_token_id
    assert not first.training
    assert logits_of(first, torch.tensor([[1, 2, 3]])).shape == (1, 3, len(tokenizer))


# ---- value model ---------------------------------------------------------------------------------


def test_value_model_shapes_padding_and_gradients(tokenizer):
    critic = ValueModel(tiny_causal_lm(tokenizer))
    assert not any("lm_head" in name for name, _ in critic.named_parameters())
    short, long = [5, 6, 7], [8, 9, 10, 11, 12]
    input_ids = torch.tensor([[0, 0, *short], long])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])

    initial = critic(input_ids, mask)
    assert initial.shape == (2, 5) and initial.dtype == torch.float32
    assert torch.equal(initial, torch.zeros(2, 5))  # zero-initialised head

    torch.nn.init.normal_(critic.value_head.weight, generator=torch.Generator().manual_seed(0))
    values = critic(input_ids, mask)
    alone = critic(torch.tensor([short]), torch.ones(1, 3, dtype=torch.long))
    assert values[0, :2].tolist() == [0.0, 0.0]
    assert torch.allclose(values[0, 2:], alone[0], atol=1e-5)  # padding does not change real tokens' values

    values.sum().backward()
    assert critic.value_head.weight.grad is not None and critic.value_head.weight.grad.abs().sum() > 0
    assert critic.body.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


# ---- LoRA ----------------------------------------------------------------------------------------


def test_lora_trains_only_adapters_and_starts_as_the_base(tokenizer):
    base = tiny_causal_lm(tokenizer)
    input_ids = torch.tensor([[1, 2, 3, 4]])
    expected = logits_of(base, input_ids)
    policy = apply_lora(base, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    trainable = {name for name, parameter in policy.named_parameters() if parameter.requires_grad}
    assert trainable and all("lora_A" in name or "lora_B" in name for name in trainable)
    assert (
        sum(1 for name in trainable if "q_proj" in name)
        == sum(1 for name in trainable if "v_proj" in name)
        == 4
    )
    assert torch.allclose(logits_of(policy, input_ids), expected, atol=1e-6)  # lora_B starts at zero


def test_lora_top_layers_adapts_only_the_last_layers_and_backward_stops_there(tokenizer):
    model = tiny_causal_lm(tokenizer)
    total = model.config.num_hidden_layers
    policy = apply_lora(model, r=2, dropout=0.0, target_modules=["q_proj"], top_layers=1)
    trainable = [name for name, parameter in policy.named_parameters() if parameter.requires_grad]
    assert trainable and all(f"layers.{total - 1}." in name for name in trainable)
    reached: list[int] = []
    for index, layer in enumerate(policy.base_model.model.model.layers):
        layer.register_full_backward_pre_hook(lambda module, grad, index=index: reached.append(index))
    policy(torch.tensor([[1, 2, 3, 4]])).logits.sum().backward()
    assert reached == [total - 1]
    with pytest.raises(ValueError, match=r"top_layers must be in \[1, "):
        apply_lora(tiny_causal_lm(tokenizer), top_layers=total + 1)


def test_lora_value_model_trains_adapters_and_head(tokenizer):
    critic = apply_lora(
        ValueModel(tiny_causal_lm(tokenizer)), r=2, target_modules=["q_proj"], modules_to_save=["value_head"]
    )
    trainable = {name for name, parameter in critic.named_parameters() if parameter.requires_grad}
    assert any("value_head" in name for name in trainable)
    assert all("lora_" in name or "value_head" in name for name in trainable)
    values = critic(torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.long))
    assert values.shape == (1, 3)


def test_hf_engine_samples_from_a_lora_policy(tokenizer):
    policy = apply_lora(tiny_causal_lm(tokenizer), r=4, alpha=8, dropout=0.0)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    generation = HFEngine(policy, tokenizer).generate(["Hello"], SamplingConfig(max_new_tokens=6, seed=0))[0][
        0
    ]
    sequence = torch.tensor([generation.prompt_ids + generation.response_ids])
    logprobs = logits_of(policy, sequence)[0].log_softmax(-1)
    start = len(generation.prompt_ids) - 1
    expected = [logprobs[start + t, token].item() for t, token in enumerate(generation.response_ids)]
    assert generation.logprobs == pytest.approx(expected, abs=1e-4)


# ---- load_policy with checkpoints ----------------------------------------------------------------


def test_load_policy_from_a_directory_with_lora_adapter_or_full_checkpoint(
    tokenizer, saved_tiny_model, tmp_path
):
    input_ids = torch.tensor([[1, 2, 3, 4, 5]])
    base, loaded_tokenizer = load_policy(saved_tiny_model)
    assert torch.allclose(logits_of(base, input_ids), logits_of(tiny_causal_lm(tokenizer), input_ids))
    assert loaded_tokenizer.padding_side == "left" and loaded_tokenizer.chat_template is not None

    trained = apply_lora(tiny_causal_lm(tokenizer), r=4, alpha=8, dropout=0.0)
    with torch.no_grad():
        for name, parameter in trained.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5, generator=torch.Generator().manual_seed(2))
    expected = logits_of(trained, input_ids)
    # Merging adds B @ A into W, so float32 rounding differs from the unmerged x W + x A B: 2e-5 here, and
    # over 1e-4 on another CPU's kernels. The tolerance is 1e-4 of the adapter's effect (~20 logits).
    adapter_effect = (expected - logits_of(base, input_ids)).abs().max().item()
    assert adapter_effect > 1.0
    tolerance = 1e-4 * adapter_effect
    trained.save_pretrained(tmp_path / "adapter")

    merged, _ = load_policy(saved_tiny_model, ckpt=tmp_path / "adapter")
    assert torch.allclose(logits_of(merged, input_ids), expected, rtol=0, atol=tolerance)

    trained.merge_and_unload().save_pretrained(tmp_path / "full")
    full, full_tokenizer = load_policy(saved_tiny_model, ckpt=tmp_path / "full")
    assert torch.allclose(logits_of(full, input_ids), expected, rtol=0, atol=tolerance)
    assert full_tokenizer.padding_side == "left"

    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither a LoRA adapter"):
        load_policy(saved_tiny_model, ckpt=tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no such directory"):
        load_policy(saved_tiny_model, ckpt=tmp_path / "missing")


def test_load_policy_dtype(saved_tiny_model):
    model, _ = load_policy(saved_tiny_model, dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16


# ---- backbone configs ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "llama3.1-8b"])
def test_backbone_configs(name):
    path = CONF / f"{name}.yaml"
    assert path.read_text().startswith("# @package backbone\n")
    config = OmegaConf.load(path)
    assert set(config) == {"name_or_path", "dtype", "lora_target_modules"}  # lengths are the agents' (memr1/conf/answer, memr1/conf/manager)
    resolve_dtype(config.dtype)
    assert {"q_proj", "v_proj"} <= set(config.lora_target_modules)
    if name == "smollm2-135m":
        assert config.name_or_path == EMBEDDED and config.dtype == "float32"
    else:
        assert "GPU" in path.read_text() and config.dtype == "bfloat16"


# ---- the real embedded model ---------------------------------------------------------------------


@pytest.mark.slow
def test_embedded_tokenizer_is_read_from_the_gguf_once_then_cached(tokenizer, tmp_path):
    fresh = load_tokenizer(EMBEDDED, cache_dir=tmp_path)  # reads the GGUF's vocabulary (~10 s)
    cached_dir = tmp_path / "tokenizers" / "smollm2-135m-instruct"
    assert (cached_dir / "tokenizer.json").is_file()
    assert [p.name for p in (tmp_path / "tokenizers").iterdir()] == ["smollm2-135m-instruct"]
    again = load_tokenizer(EMBEDDED, cache_dir=tmp_path)
    text = "Caroline moved from Sweden 4 years ago.<|im_end|>"
    assert fresh(text)["input_ids"] == again(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert again.chat_template == SMOLLM2_CHAT_TEMPLATE and again.padding_side == "left"


@pytest.mark.slow
def test_embedded_smollm2_answers_a_short_prompt():
    model, tokenizer = load_policy(EMBEDDED)
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    assert (cache_root() / "models" / "smollm2-135m-instruct" / "model.safetensors").is_file()
    prompt = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    generation = HFEngine(model, tokenizer).generate(
        [prompt], SamplingConfig(max_new_tokens=8, temperature=0)
    )[0][0]
    assert generation.text.strip()
    assert "paris" in generation.text.lower()
