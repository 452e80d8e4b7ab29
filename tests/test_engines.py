"""Generation engines on a tiny random Llama with the real SmolLM2 tokenizer (~10 s; the first run on a
machine also reads the tokenizer out of the GGUF, ~10 s more, and caches it)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from memr1.factories import build_engine
from memr1.llm.engines import AutocastStaticCache, Generation, HFEngine, encode_prompts, lookup_draft
from memr1.llm.loading import load_tokenizer
from memr1.llm.padding import left_pad, position_ids_from_attention_mask
from memr1.llm.sampling import SamplingConfig, choose_tokens, cut_at_first_stop, nucleus_filter
from memr1.llm.testing import tiny_causal_lm

EMBEDDED = "embedded:smollm2-135m-instruct"
PROMPTS = [
    "Hi",
    [{"role": "user", "content": "Where did Caroline move from four years ago?"}],
    "Memories: Melanie painted a sunrise in 2022. Melanie ran a charity race. What did Melanie paint?",
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(EMBEDDED)


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_causal_lm(tokenizer)


def reference_logprobs(model, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0) -> list[float]:
    """log softmax(logits / T) of a plain, unpadded forward pass over prompt + response, at the chosen
    tokens (T = 1 for greedy decoding, as the engine records it)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + response_ids])).logits[0].float()
    logprobs = (logits / (temperature or 1.0)).log_softmax(dim=-1)
    start = len(prompt_ids) - 1  # the logits at position p predict token p + 1
    return [logprobs[start + t, token].item() for t, token in enumerate(response_ids)]


# ---- pure helpers ----------------------------------------------------------------------------------


def test_left_pad_and_position_ids():
    input_ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert input_ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert position_ids_from_attention_mask(mask).tolist() == [[0, 1, 2], [0, 0, 0]]
    right_padded = torch.tensor([[1, 1, 0]])
    assert position_ids_from_attention_mask(right_padded).tolist() == [[0, 1, 1]]


def test_nucleus_filter_keeps_smallest_set_reaching_top_p():
    logits = torch.tensor([[0.15, 0.5, 0.05, 0.3]]).log()
    kept = torch.isfinite(nucleus_filter(logits, top_p=0.75))
    assert kept.tolist() == [[False, True, False, True]]  # 0.5, then 0.3 (0.5 < 0.75), then 0.8 >= 0.75
    assert torch.isfinite(nucleus_filter(logits, top_p=0.4)).tolist() == [[False, True, False, False]]
    assert torch.equal(nucleus_filter(logits, top_p=1.0), logits)


def test_choose_tokens_greedy_and_sampled():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 5.0]])
    assert choose_tokens(logits, temperature=0, top_p=1.0).tolist() == [1, 2]
    # top_p small enough that only the argmax survives: sampling must return it.
    generator = torch.Generator().manual_seed(0)
    assert choose_tokens(logits, temperature=1.0, top_p=0.1, generator=generator).tolist() == [1, 2]


def test_cut_at_first_stop():
    assert cut_at_first_stop("a\nb END c", ["END", "\n"]) == ("a", True)
    assert cut_at_first_stop("Paris**Answer:**", ["**Answer:**"]) == ("Paris", True)
    assert cut_at_first_stop("no stop here", ["END"]) == ("no stop here", False)
    assert cut_at_first_stop("anything", []) == ("anything", False)


def test_sampling_config_validates_and_normalises():
    assert SamplingConfig(stop=["\n", "END"]).stop == ("\n", "END")
    assert SamplingConfig(temperature=0).greedy
    for field, value in [
        ("max_new_tokens", 0),
        ("temperature", -0.1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("n", 0),
    ]:
        with pytest.raises(ValueError, match=rf"SamplingConfig\.{field}"):
            SamplingConfig(**{field: value})
    with pytest.raises(ValueError, match=r"SamplingConfig\.stop: expected a sequence"):
        SamplingConfig(stop="\n")
    with pytest.raises(ValueError, match=r"SamplingConfig.stop\[1\]"):
        SamplingConfig(stop=("\n", ""))


# ---- prompts -------------------------------------------------------------------------------------


def test_chat_prompts_use_the_chat_template_and_strings_do_not(tokenizer):
    messages = [{"role": "user", "content": "Where did Caroline move from?"}]
    chat_ids, raw_ids = encode_prompts(tokenizer, [messages, "Where did Caroline move from?"])
    expected_chat = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhere did Caroline move from?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.decode(chat_ids) == expected_chat
    assert tokenizer.decode(raw_ids) == "Where did Caroline move from?"


def test_bad_prompts_are_named(tokenizer):
    with pytest.raises(TypeError, match="single str"):
        encode_prompts(tokenizer, "a bare string")
    with pytest.raises(TypeError, match=r"prompts\[1\]\[0\]"):
        encode_prompts(tokenizer, ["ok", [{"role": "user"}]])
    with pytest.raises(TypeError, match=r"prompts\[0\]"):
        encode_prompts(tokenizer, [42])
    with pytest.raises(ValueError, match=r"prompts\[1\]: empty"):
        encode_prompts(tokenizer, ["ok", ""])
    no_template = load_tokenizer(EMBEDDED)
    no_template.chat_template = None
    with pytest.raises(ValueError, match=r"prompts\[0\]: chat messages need a chat template"):
        encode_prompts(no_template, [[{"role": "user", "content": "hi"}]])


# ---- HFEngine ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("temperature", "top_p"), [(0.0, 1.0), (1.0, 1.0), (0.7, 0.9)])
def test_logprobs_equal_forward_pass_for_left_padded_batch(model, tokenizer, temperature, top_p):
    engine = HFEngine(model, tokenizer, batch_size=8)
    sampling = SamplingConfig(max_new_tokens=12, temperature=temperature, top_p=top_p, n=2, seed=3)
    results = engine.generate(PROMPTS, sampling)
    prompt_lengths = {len(samples[0].prompt_ids) for samples in results}
    assert len(prompt_lengths) == len(PROMPTS)  # all different: the batch really is left-padded
    for samples in results:
        for generation in samples:
            assert len(generation.response_ids) == len(generation.logprobs) > 0
            expected = reference_logprobs(model, generation.prompt_ids, generation.response_ids, temperature)
            assert generation.logprobs == pytest.approx(expected, abs=1e-4)


def test_greedy_is_deterministic_and_equals_unbatched(model, tokenizer):
    greedy = SamplingConfig(max_new_tokens=16, temperature=0)
    batched = HFEngine(model, tokenizer, batch_size=4).generate(PROMPTS, greedy)
    again = HFEngine(model, tokenizer, batch_size=4).generate(PROMPTS, greedy)
    single = HFEngine(model, tokenizer, batch_size=1)
    assert batched == again
    for prompt, samples in zip(PROMPTS, batched, strict=True):
        alone = single.generate([prompt], greedy)[0][0]
        assert alone.response_ids == samples[0].response_ids
        assert alone.text == samples[0].text
        assert alone.logprobs == pytest.approx(samples[0].logprobs, abs=1e-4)


def test_seeded_sampling_is_reproducible_and_leaves_global_rng_alone(model, tokenizer):
    engine = HFEngine(model, tokenizer, batch_size=4)
    state = torch.get_rng_state()
    first = engine.generate(PROMPTS, SamplingConfig(max_new_tokens=10, seed=7))
    assert torch.equal(torch.get_rng_state(), state)
    assert engine.generate(PROMPTS, SamplingConfig(max_new_tokens=10, seed=7)) == first
    other = engine.generate(PROMPTS, SamplingConfig(max_new_tokens=10, seed=8))
    assert [s[0].response_ids for s in other] != [s[0].response_ids for s in first]


def test_each_distinct_prompt_is_prefilled_once(model, tokenizer):
    """n samples of a prompt share one prefill (its KV cache is copied), and sample as if prefilled apart."""
    prefill_rows: list[int] = []

    def record(module, args, kwargs) -> None:
        if kwargs["input_ids"].shape[1] > 1:
            prefill_rows.append(kwargs["input_ids"].shape[0])

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        results = HFEngine(model, tokenizer, batch_size=8).generate(PROMPTS, SamplingConfig(max_new_tokens=6, n=2, seed=1))
    finally:
        handle.remove()
    assert prefill_rows == [len(PROMPTS)]  # 3 distinct prompts prefilled for 6 rows
    for samples in results:
        for generation in samples:
            expected = reference_logprobs(model, generation.prompt_ids, generation.response_ids)
            assert generation.logprobs == pytest.approx(expected, abs=1e-4)


def test_n_samples_per_prompt_in_prompt_order(model, tokenizer):
    results = HFEngine(model, tokenizer, batch_size=3).generate(
        PROMPTS, SamplingConfig(max_new_tokens=4, n=3, seed=0)
    )
    assert [len(samples) for samples in results] == [3, 3, 3]
    for prompt_ids, samples in zip(encode_prompts(tokenizer, PROMPTS), results, strict=True):
        assert all(isinstance(g, Generation) and g.prompt_ids == prompt_ids for g in samples)
        assert all(g.finish_reason == "length" and len(g.response_ids) == 4 for g in samples)


@pytest.mark.parametrize("prompt_lookup", [0, 4])
def test_stop_string_truncates_text_ids_and_logprobs_consistently(model, tokenizer, prompt_lookup):
    engine = HFEngine(model, tokenizer, prompt_lookup=prompt_lookup)
    full = engine.generate([PROMPTS[2]], SamplingConfig(max_new_tokens=24, temperature=0))[0][0]
    # Choose as stop string a piece of the greedy text that starts inside it (not at 0).
    stop = full.text[6:9]
    assert len(stop) == 3 and full.text.find(stop) > 0
    cut = full.text.find(stop)

    stopped = engine.generate([PROMPTS[2]], SamplingConfig(max_new_tokens=24, temperature=0, stop=(stop,)))[
        0
    ][0]

    assert stopped.finish_reason == "stop"
    assert stopped.text == full.text[:cut]
    kept = len(stopped.response_ids)
    assert stopped.response_ids == full.response_ids[:kept]
    assert stopped.logprobs == pytest.approx(full.logprobs[:kept], abs=1e-5)
    # The kept tokens are exactly those up to the one that completed the stop string.
    assert stop in tokenizer.decode(stopped.response_ids)
    assert stop not in tokenizer.decode(stopped.response_ids[:-1])


@pytest.mark.parametrize("prompt_lookup", [0, 4])
def test_eos_ends_the_response_and_is_kept(model, tokenizer, prompt_lookup):
    full = HFEngine(model, tokenizer).generate(
        [PROMPTS[0]], SamplingConfig(max_new_tokens=12, temperature=0)
    )[0][0]
    # Declare the 4th greedy token an end-of-sequence token: the response must end right after its
    # first occurrence, with it kept.
    eos = full.response_ids[3]
    position = full.response_ids.index(eos)
    engine = HFEngine(model, tokenizer, eos_token_ids=[eos], prompt_lookup=prompt_lookup)

    ended = engine.generate([PROMPTS[0]], SamplingConfig(max_new_tokens=12, temperature=0))[0][0]

    assert ended.finish_reason == "stop"
    assert ended.response_ids == full.response_ids[: position + 1]
    assert ended.logprobs == pytest.approx(full.logprobs[: position + 1], abs=1e-5)
    assert ended.text == tokenizer.decode(ended.response_ids, skip_special_tokens=True)


def test_lookup_draft_copies_what_followed_the_latest_recurrence_of_the_tail():
    # The tail 3-gram (4, 1, 2) never occurred before; the 2-gram (1, 2) did, at 0 and at 4 (the tail).
    assert lookup_draft([1, 2, 3, 4, 1, 2], max_tokens=3) == [3, 4, 1]
    assert lookup_draft([1, 2, 3, 4, 1, 2], max_tokens=1) == [3]
    # The latest earlier occurrence wins: (7,) at 1 and at 3 -> what followed the one at 3.
    assert lookup_draft([5, 7, 8, 7, 9, 7], max_tokens=2) == [9, 7]
    # The longest recurring n-gram wins over a shorter one.
    assert lookup_draft([1, 2, 3, 9, 2, 3, 5, 1, 2, 3], max_tokens=1) == [9]
    assert lookup_draft([1, 2, 3], max_tokens=4) == []  # nothing recurs
    assert lookup_draft([1, 2, 1], max_tokens=0) == []
    assert lookup_draft([1], max_tokens=2) == []


def test_prompt_lookup_decodes_the_same_tokens_in_fewer_forwards(model, tokenizer):
    """A lone greedy request with drafts copied from its context: the same tokens and log-probs as
    token-by-token decoding (and as a plain forward over prompt + response), a draft kept where the
    model agrees with it, rejected drafts leaving nothing behind in the KV cache."""
    fed: list[int] = []
    handle = model.register_forward_pre_hook(lambda module, args, kwargs: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    greedy = SamplingConfig(max_new_tokens=24, temperature=0)
    forwards, tokens, multi_token_forwards = 0, 0, 0
    try:
        for prompt in PROMPTS:
            plain = HFEngine(model, tokenizer).generate([prompt], greedy)[0][0]
            fed.clear()
            looked = HFEngine(model, tokenizer, prompt_lookup=4).generate([prompt], greedy)[0][0]
            forwards, tokens = forwards + len(fed) - 1, tokens + len(looked.response_ids) - 1  # after the prefill
            multi_token_forwards += sum(width > 1 for width in fed[1:])
            assert looked.response_ids == plain.response_ids and looked.text == plain.text
            assert looked.logprobs == pytest.approx(reference_logprobs(model, looked.prompt_ids, looked.response_ids), abs=1e-4)
            # The budget holds with drafts in flight: never a token past max_new_tokens.
            short = HFEngine(model, tokenizer, prompt_lookup=4).generate([prompt], SamplingConfig(max_new_tokens=3, temperature=0))[0][0]
            assert (short.response_ids, short.finish_reason) == (plain.response_ids[:3], "length")
    finally:
        handle.remove()
    assert multi_token_forwards > 0  # drafts were proposed (the tiny model repeats a token: one kept)
    assert forwards < tokens


def test_a_lone_request_prefills_only_what_it_does_not_share_with_the_last(model, tokenizer):
    """`reuse_prefix`: the next lone prompt's prefill starts where it parts from the tokens the last
    one left in the kept cache, and it decodes what a fresh engine decodes."""
    fed: list[int] = []
    greedy = SamplingConfig(max_new_tokens=10, temperature=0)
    shared = "Memories: Melanie painted a sunrise in 2022. Melanie ran a charity race. "
    first, second, other = shared + "What did Melanie paint?", shared + "What did Melanie run?", "Hi there"
    fresh = {prompt: HFEngine(model, tokenizer).generate([prompt], greedy)[0][0] for prompt in (first, second, other)}
    engine = HFEngine(model, tokenizer, reuse_prefix=True)
    handle = model.register_forward_pre_hook(lambda module, args, kwargs: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        widths = []
        for prompt in (first, second, other, second):
            fed.clear()
            generation = engine.generate([prompt], greedy)[0][0]
            assert generation.response_ids == fresh[prompt].response_ids
            assert generation.logprobs == pytest.approx(fresh[prompt].logprobs, abs=1e-4)
            widths.append(fed[0])
    finally:
        handle.remove()
    (first_ids, second_ids, other_ids) = encode_prompts(tokenizer, [first, second, other])
    common = next(i for i, (a, b) in enumerate(zip(first_ids, second_ids)) if a != b)
    # The first prompt and the unrelated one are prefilled whole, the second after what it shares.
    assert widths == [len(first_ids), len(second_ids) - common, len(other_ids), len(second_ids)]


def test_prompt_lookup_leaves_batches_and_sampling_alone(model, tokenizer):
    fed: list[int] = []
    handle = model.register_forward_pre_hook(lambda module, args, kwargs: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        engine = HFEngine(model, tokenizer, prompt_lookup=4)
        engine.generate(PROMPTS, SamplingConfig(max_new_tokens=8, temperature=0))
        engine.generate([PROMPTS[2]], SamplingConfig(max_new_tokens=8, temperature=1.0, seed=0))
    finally:
        handle.remove()
    # The batch's prefill and the sampled request's read their prompts; every other forward one token.
    assert sum(width > 1 for width in fed) == 2 and fed[0] > 1
    with pytest.raises(ValueError, match="HFEngine.prompt_lookup: must be >= 0"):
        HFEngine(model, tokenizer, prompt_lookup=-1)


def test_a_finished_row_leaves_the_batch_and_the_others_decode_as_before(model, tokenizer):
    greedy = SamplingConfig(max_new_tokens=12, temperature=0)
    full = [samples[0] for samples in HFEngine(model, tokenizer, batch_size=3).generate(PROMPTS, greedy)]
    # An EOS that ends the first prompt's response at its 4th token and appears in no other response.
    others = {token for generation in full[1:] for token in generation.response_ids}
    first = full[0].response_ids
    eos = next(token for token in first[3:] if token not in others and token not in first[:3])
    ends_at = first.index(eos)
    decode_rows: list[int] = []

    def record(module, args, kwargs) -> None:
        if kwargs["input_ids"].shape[1] == 1:
            decode_rows.append(kwargs["input_ids"].shape[0])

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        engine = HFEngine(model, tokenizer, batch_size=3, eos_token_ids=[eos])
        ended = [samples[0] for samples in engine.generate(PROMPTS, greedy)]
    finally:
        handle.remove()
    # Token t + 1 is decoded from token t: 3 rows until the first prompt's EOS, 2 after it.
    assert decode_rows == [3] * ends_at + [2] * (11 - ends_at)
    assert ended[0].response_ids == first[: ends_at + 1]
    assert ended[0].finish_reason == "stop"
    for alone, batched in zip(full[1:], ended[1:], strict=True):
        assert batched.response_ids == alone.response_ids
        assert batched.logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_the_kv_cache_takes_what_bf16_autocast_hands_it(model):
    # Under bf16 autocast the keys leave the rotary embedding in fp32 and the values leave v_proj in
    # bf16. Layer 0 is allocated as transformers 5.17 (the GPU image's) allocates it, values in the
    # keys' dtype; layer 1 as the installed release allocates it.
    cache = AutocastStaticCache(config=model.config, max_cache_len=8)
    keys = torch.randn(1, model.config.num_key_value_heads, 3, model.config.head_dim)
    values = torch.randn_like(keys).to(torch.bfloat16)
    cache.layers[0].lazy_initialization(keys, keys)
    for layer in (0, 1):
        held_keys, held_values = cache.update(keys, values, layer)
        assert torch.equal(held_keys[:, :, :3], keys) and torch.equal(held_values[:, :, :3].float(), values.float())
    assert cache.layers[0].values.dtype == torch.float32


def test_default_eos_is_the_tokenizer_eos(model, tokenizer):
    assert HFEngine(model, tokenizer).eos_token_ids == frozenset({tokenizer.eos_token_id})


def test_training_mode_is_restored_and_no_graph_is_built(model, tokenizer):
    model.train()
    try:
        HFEngine(model, tokenizer).generate([PROMPTS[0]], SamplingConfig(max_new_tokens=3))
        assert model.training
        assert all(parameter.grad is None for parameter in model.parameters())
    finally:
        model.eval()
    HFEngine(model, tokenizer).generate([PROMPTS[0]], SamplingConfig(max_new_tokens=3))
    assert not model.training


def test_build_engine(model, tokenizer):
    assert isinstance(build_engine("hf", model=model, tokenizer=tokenizer, batch_size=2), HFEngine)
    with pytest.raises(ValueError, match="needs model= and tokenizer="):
        build_engine("hf", model=model)
    with pytest.raises(TypeError, match="gpu_memory_utilization"):
        build_engine("hf", model=model, tokenizer=tokenizer, gpu_memory_utilization=0.5)
    with pytest.raises(ValueError, match="needs name_or_path="):
        build_engine("vllm")
    with pytest.raises(ValueError, match="unknown kind 'sglang'"):
        build_engine("sglang", model=model, tokenizer=tokenizer)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_engine_without_vllm_says_how_to_get_it():
    with pytest.raises(ModuleNotFoundError, match="vllm"):
        build_engine("vllm", name_or_path=EMBEDDED)
