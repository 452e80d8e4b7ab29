"""The Hydra applications, with their configs inside the package (`memr1/conf`): `memr1 train ...` /
`memr1 evaluate ...`, and the repository's `train.py` / `evaluate.py` (the paper's command shapes)."""

from pathlib import Path

#: The configs the apps compose (Hydra's config_path), for code that composes them too.
CONFIG_DIR = Path(__file__).resolve().parents[1] / "conf"
