"""Progress bars in a log file: one line per task at most every `every_s` seconds, and its last."""

from __future__ import annotations

import io
import logging

from rich.console import Console

from memr1.progress import LoggedProgress


def test_each_task_logs_its_first_advance_then_at_most_one_line_per_interval_and_its_end(caplog):
    bar = LoggedProgress(console=Console(file=io.StringIO(), force_terminal=False))
    bar.every_s = 3600.0  # nothing in this test waits that long: only first advances and ends log
    with caplog.at_level(logging.INFO, logger="memr1.progress"), bar:
        banks, answers = bar.add_task("building banks", total=3), bar.add_task("answering", total=2)
        bar.advance(banks)
        bar.advance(banks)
        bar.advance(answers)  # another task keeps its own clock
        bar.advance(banks)
        bar.advance(answers)
    lines = [record.getMessage().split(" (")[0] for record in caplog.records]
    assert lines == ["building banks: 1/3", "answering: 1/2", "building banks: 3/3", "answering: 2/2"]
