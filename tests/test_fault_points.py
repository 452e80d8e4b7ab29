"""Fault points (memr1/faults.py): `MEMR1_FAULT` parsed with errors that name it, and a process that
reaches its armed point signals itself there, at that hit and no other."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from memr1.faults import FAULT_ENV, Fault, parse_fault

pytestmark = pytest.mark.slow  # Python subprocesses (fast: they import no torch)

PASSES = "from memr1.faults import fault_point\nfor n in range(1, 4):\n    fault_point('micro_batch'); print('passed', n, flush=True)\n"
# A run's own handler: SIGTERM requests a stop (as ResumableRun's does), which a WAIT point waits for.
STOP_HANDLER = "import os, signal\nfrom memr1 import interrupt\nsignal.signal(signal.SIGTERM, lambda s, f: interrupt.request_stop(s))\n"
SIGNAL_FIRST = "os.kill(os.getpid(), signal.SIGTERM)\n"


def passing(fault: str, stop_handler: bool = False, signal_first: bool = False) -> subprocess.Popen:
    code = (STOP_HANDLER if stop_handler else "") + (SIGNAL_FIRST if signal_first else "") + PASSES
    return subprocess.Popen([sys.executable, "-c", code], env={**os.environ, FAULT_ENV: fault},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_variable_is_parsed_and_bad_values_are_named():
    assert parse_fault("checkpoint_write:2") == Fault("checkpoint_write", 2, "SIGKILL")
    assert parse_fault("train_step:3:WAIT") == Fault("train_step", 3, "WAIT")
    for bad, reason in [("step:1", "POINT one of bank_write"), ("train_step:0", "HIT must be"), ("train_step:x", "HIT must be"),
                        ("train_step:1:SIGFOO", "neither WAIT nor a signal"), ("train_step", "expected POINT:HIT")]:
        with pytest.raises(ValueError, match=f"{FAULT_ENV}='{bad}': .*{reason}"):
            parse_fault(bad)


def test_the_armed_hit_signals_the_process_there():
    process = passing("micro_batch:2")
    out, err = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert out.split("\n")[:-1] == ["passed 1"] and "memr1 fault: SIGKILL at micro_batch #2" in err
    # Another point armed: this process passes all three micro-batches untouched.
    other = passing("train_step:1")
    assert other.communicate(timeout=60)[0].count("passed") == 3 and other.returncode == 0


def test_wait_holds_the_process_until_a_stop_is_requested():
    # As a training run: its SIGTERM handler requests a stop (memr1.interrupt), which ends the wait.
    process = passing("micro_batch:2:WAIT", stop_handler=True)
    assert process.stdout.readline() == "passed 1\n"
    assert "memr1 fault: WAIT at micro_batch #2" in process.stderr.readline()
    time.sleep(0.5)
    assert process.poll() is None  # still waiting: nothing but a stop moves it on
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    assert (out, process.returncode) == ("passed 2\npassed 3\n", 0)


def test_a_stop_that_comes_before_the_wait_begins_is_not_lost():
    # The signal lands before the point is reached (the race a test sending it on the WAIT line can
    # lose by a hair): the wait sees the stop already requested and does not block.
    process = passing("micro_batch:2:WAIT", stop_handler=True, signal_first=True)
    out, err = process.communicate(timeout=60)
    assert (out, process.returncode) == ("passed 1\npassed 2\npassed 3\n", 0) and "WAIT at micro_batch #2" in err
