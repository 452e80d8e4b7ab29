"""A process-wide stop request, set by a signal handler and honoured at the next safe point.

Schedulers and `timeout` send SIGTERM, a user presses Ctrl-C (SIGINT). Long work polls
`raise_if_requested()` at its safe points (a decoding step, a micro-batch) instead of dying mid-write:
`memr1.callbacks.GracefulStop` installs the handlers during training, saves a resumable checkpoint
when `StopRequested` surfaces and ends the process with 128 + the signal's number.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

_requested: int | None = None
_deferring = 0  # open `deferred()` blocks


class StopRequested(Exception):
    """A stop signal arrived; raised at a safe point so the caller can checkpoint and exit."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stop requested by {signal.Signals(signum).name}")


def request_stop(signum: int) -> None:
    global _requested
    _requested = signum


def clear() -> None:
    global _requested
    _requested = None


def requested() -> int | None:
    """The signal number of a pending stop request, or None."""
    return _requested


def raise_if_requested() -> None:
    """`StopRequested` when a stop signal is pending: call it where stopping loses no work. Inside a
    `deferred()` block it waits for the block's end."""
    if _requested is not None and not _deferring:
        raise StopRequested(_requested)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Work that must finish once begun: a stop requested inside is honoured at the first safe point
    after the block (a training step's work after its optimiser step, so that a checkpoint holds whole
    steps). A second Ctrl-C still stops at once."""
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
