"""The trained agents that ship inside the package, addressable by name: `trained:NAME`.

Each is a LoRA policy export for the embedded SmolLM2-135M-Instruct under `memr1/trained/NAME/`: peft's
`adapter_config.json` and `adapter_model.safetensors`, a `warm_start.json` naming the shipped agent it
was trained on top of (as `trained:PARENT`), and its card (`card.json`, `card.md`: how it was trained,
what it scores and how to re-score it). Wherever a policy export directory is accepted, the name is too:

    python evaluate.py experiment=cpu_lift/answer split=test ckpt=trained:answer-agent
    python train.py experiment=cpu_lift/answer answer.ckpt=trained:answer-agent     # a warm start
    memr1 serve --answer trained:answer-agent
    Memory("memories/", answerer=text_model(EMBEDDED_DEFAULT, adapter="trained:answer-agent"))

`scripts/ship_agent.py` copies a run's export here and writes its card.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

TRAINED_PREFIX = "trained:"
TRAINED_DIR = Path(__file__).resolve().parent / "trained"
# Another directory of agents laid out the same way (a team's own), in place of the package's.
TRAINED_DIR_ENV = "MEMR1_TRAINED_DIR"
CARD_FILE = "card.json"
# In a LoRA export trained from a warm start: {"init": the warm start's path, or a shipped trained:NAME}.
WARM_START_FILE = "warm_start.json"
# A warm start inside a schedule's root, as its archive keeps it (memr1.stage_archive): "{root}/sft/policy/last".
ROOT_PLACEHOLDER = "{root}"


def warm_start_of(export: Path) -> str | None:
    """What the LoRA export `export` was trained on top of (its `warm_start.json`), None if nothing. An
    archived export names a stage of its own schedule as `{root}/STAGE/policy/NAME`; the export itself
    sits at ROOT/STAGE/policy/NAME, so that root is its third parent, and the chain holds in the archive
    as in a run root."""
    pointer = export / WARM_START_FILE
    if not pointer.is_file():
        return None
    return resolve_root(str(json.loads(pointer.read_text())["init"]), export.resolve().parents[2])


def resolve_root(init: str, root: Path) -> str:
    """A warm-start pointer with its `{root}/` placeholder, if any, made a path under `root`."""
    if init.startswith(ROOT_PLACEHOLDER + "/"):
        return str(root.resolve() / init.removeprefix(ROOT_PLACEHOLDER + "/"))
    return init


def trained_root() -> Path:
    """Where `trained:` names are looked up: `$MEMR1_TRAINED_DIR`, else the package's `memr1/trained`."""
    return Path(os.environ.get(TRAINED_DIR_ENV) or TRAINED_DIR)


def is_shipped(ckpt: str | os.PathLike[str]) -> bool:
    return str(ckpt).startswith(TRAINED_PREFIX)


def shipped_agents(root: Path | None = None) -> dict[str, Path]:
    """The shipped agents by name (each directory of `root`, default `trained_root()`, with a card)."""
    root = root or trained_root()
    if not root.is_dir():
        return {}
    return {path.name: path for path in sorted(root.iterdir()) if (path / CARD_FILE).is_file()}


def shipped_path(ckpt: str | os.PathLike[str], root: Path | None = None) -> Path:
    """A policy export's directory: `trained:NAME` is the shipped agent's, anything else a path as given."""
    if not is_shipped(ckpt):
        return Path(ckpt)
    root = root or trained_root()
    name = str(ckpt).removeprefix(TRAINED_PREFIX)
    agents = shipped_agents(root)
    if name not in agents:
        known = ", ".join(TRAINED_PREFIX + known for known in agents) or "none"
        raise FileNotFoundError(f"{ckpt}: no shipped agent of that name under {root} (shipped: {known})")
    return agents[name]


def card(ckpt: str, root: Path | None = None) -> dict[str, Any]:
    """The card of the shipped agent `trained:NAME`."""
    return json.loads((shipped_path(ckpt, root) / CARD_FILE).read_text())
