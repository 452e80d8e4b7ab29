"""The entry points silence third-party INFO chatter once (memr1/quiet.py): checked against the loggers
the installed packages really create, so a renamed or new module of theirs shows up here."""

from __future__ import annotations

import importlib
import logging

import pytest

from memr1.quiet import quiet_third_party


@pytest.mark.parametrize(
    "module",
    ["milvus_lite.engine.collection", "milvus_lite.engine.compaction", "milvus_lite.server_manager"],
)
def test_milvus_lite_info_is_silenced_and_its_warnings_kept(module: str, caplog: pytest.LogCaptureFixture) -> None:
    # milvus-lite 3 logs a line per partition it compacts: 18 lines while one pipeline stage built banks.
    caplog.set_level(logging.INFO)  # the root level of Hydra's job logging
    logger = importlib.import_module(module).logger
    quiet_third_party()
    assert not logger.isEnabledFor(logging.INFO)
    assert logger.isEnabledFor(logging.WARNING)
