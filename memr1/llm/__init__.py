"""Models and generation for memr1.

- `loading`: `load_policy`, `load_tokenizer` (Hugging Face id, local directory, or the embedded SmolLM2)
- `lora`: `apply_lora`; `value`: `ValueModel` (the PPO critic)
- `sampling`: `SamplingConfig` and the token-choice maths
- `engines`: `Generation`, `GenerationEngine`, `HFEngine`; `vllm_engine`: `VLLMEngine` (`memr1.factories.build_engine` makes either)
- `testing`: `tiny_causal_lm`, a tiny random Llama over a real tokenizer for fast tests

Submodules are imported directly (`from memr1.llm.engines import HFEngine`): this package imports
nothing itself, so the pure helpers never pay for importing transformers.
"""
