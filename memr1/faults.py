"""Fault injection: named points a run passes, where a process told so by `MEMR1_FAULT` signals itself.

The fault tests kill training runs at chosen moments and check that the resumed run ends where the
unbroken one does. A kill timed by the wall clock lands somewhere else on a faster machine (or none
at all: the run has finished); a kill at a named point lands at the same place on any machine:

    MEMR1_FAULT=checkpoint_write:2          # SIGKILL at the 2nd checkpoint write (its .tmp synced, not renamed)
    MEMR1_FAULT=micro_batch:3:SIGTERM       # SIGTERM after the 3rd micro-batch's backward
    MEMR1_FAULT=train_step:3:WAIT           # stop at the 3rd step until a signal arrives from outside

`POINT:HIT[:ACTION]`: the HIT-th time this process reaches POINT (counted from 1), it writes a line on
stderr saying so, then sends itself the signal ACTION names (SIGKILL unless named), or with `WAIT`
blocks until a stop is requested (`memr1.interrupt`: the test sends a real SIGTERM or SIGINT when it
reads the line; a signal that arrives before the wait begins counts too), then carries on. The points, in the order a training step meets them, then evaluate.py's:

- `bank_write`: a conversation's bank written, its build progress not yet recorded
- `train_step`: a training step begins (before its rollout)
- `micro_batch`: a micro-batch's loss accumulated (its backward done), before the optimiser step
- `validation_batch`: a validation batch begins
- `checkpoint_write`: a checkpoint's temporary file written and synced, not yet renamed into place
- `answer_batch`: an evaluation's batch of answers appended to predictions.jsonl

Unset (always, outside tests), `fault_point` costs one comparison.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

from memr1 import interrupt

FAULT_ENV = "MEMR1_FAULT"
POINTS = ("bank_write", "train_step", "micro_batch", "probe", "validation_batch", "checkpoint_write", "answer_batch")


WAIT = "WAIT"


@dataclass(frozen=True)
class Fault:
    point: str
    hit: int
    action: str = "SIGKILL"  # a signal's name, or WAIT


def parse_fault(text: str) -> Fault:
    """`POINT:HIT[:ACTION]` (see the module docstring); a bad value is named with the variable."""
    parts = text.split(":")
    problem = None
    if len(parts) not in (2, 3) or parts[0] not in POINTS:
        problem = f"expected POINT:HIT[:ACTION] with POINT one of {', '.join(POINTS)}"
    elif not parts[1].isdigit() or int(parts[1]) < 1:
        problem = "HIT must be a whole number >= 1"
    elif len(parts) == 3 and parts[2] != WAIT and parts[2] not in signal.Signals.__members__:
        problem = f"{parts[2]!r} is neither WAIT nor a signal name (SIGKILL, SIGTERM, SIGINT, ...)"
    if problem:
        raise ValueError(f"{FAULT_ENV}={text!r}: {problem}")
    return Fault(parts[0], int(parts[1]), *parts[2:])


_ARMED = parse_fault(os.environ[FAULT_ENV]) if os.environ.get(FAULT_ENV) else None
_hits = 0


def fault_point(point: str) -> None:
    """The run is at `point` (one of `POINTS`): signal this process if `MEMR1_FAULT` says so."""
    global _hits
    if _ARMED is None or _ARMED.point != point:
        return
    _hits += 1
    if _hits != _ARMED.hit:
        return
    print(f"memr1 fault: {_ARMED.action} at {point} #{_hits}", file=sys.stderr, flush=True)
    if _ARMED.action == WAIT:
        # Polled, not signal.pause(): a signal that lands between the line above and the wait would
        # leave pause() waiting for another that never comes.
        while interrupt.requested() is None:
            time.sleep(0.01)
    else:
        os.kill(os.getpid(), signal.Signals[_ARMED.action])
