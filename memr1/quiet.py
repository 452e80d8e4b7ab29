"""Console output a person reads: third-party chatter that says nothing actionable is silenced once,
at the entry points. Each entry below was printed by every run and needs no action from the user."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

# Lightning warnings that describe this trainer's deliberate choices.
_LIGHTNING_WARNINGS = (
    r"Using ModelCheckpoint with manual optimization",  # checkpoints hold the state after the step, by design
    r"Found \d+ module\(s\) in eval mode",  # frozen reference / answerer models are in eval mode on purpose
    r"You have overridden `transfer_batch_to_device`",  # batches are lists of states, moved in rollout
    r".*isinstance\(treespec, LeafSpec\)",  # torch / Lightning version skew, harmless
    r"The '\w+_dataloader' does not have many workers",  # states live in this process (Milvus-backed)
    r"`Trainer\(limit_val_batches=",
)
# INFO loggers that repeat on every run: faiss probing CPU builds, Milvus Lite's engine (its background
# indexer and, from milvus-lite 3, a compaction line per partition merged) and its server's start / stop
# for every file opened, sentence-transformers announcing the CPU.
_CHATTY_LOGGERS = ("faiss.loader", "milvus_lite.engine", "milvus_lite.server_manager", "sentence_transformers")


class DropMessages(logging.Filter):
    """A logging filter that drops the records whose message contains any of `fragments`."""

    def __init__(self, *fragments: str) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


@contextlib.contextmanager
def messages_dropped(logger: logging.Logger, *fragments: str) -> Iterator[None]:
    """`logger` drops its records containing any of `fragments` inside the block only."""
    dropped = DropMessages(*fragments)
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)


def quiet_third_party() -> None:
    for pattern in _LIGHTNING_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in _CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    # Lightning gives its loggers their own "INFO: ..." console handlers: drop them and let the records
    # reach the root (Hydra's console and log file) once.
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    rank_zero.addFilter(DropMessages("litlogger", "TPU available", "limit_val_batches"))
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars per model
    except ImportError:
        pass
