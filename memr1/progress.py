"""Progress bars for long work that also reads well in a log file."""

from __future__ import annotations

import logging
import time
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

log = logging.getLogger(__name__)


class LoggedProgress(Progress):
    """A rich progress bar that, when the output is not a terminal (redirected to a file, CI), logs a
    line per advance at most every `every_s` seconds instead: a bar there would print only at the end."""

    every_s = 30.0

    def __init__(self, *columns: ProgressColumn | str, **kwargs: Any) -> None:
        super().__init__(*columns, **kwargs)
        self._last_logged: dict[TaskID, float] = {}  # when each task last logged its line

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        if self.console.is_terminal:
            return
        task = self._tasks[task_id]
        now = time.monotonic()
        # A task's first advance always logs: the monotonic clock has no fixed origin (on a machine up
        # for less than every_s it is below every_s), so "never logged" is not "logged at time 0".
        last = self._last_logged.get(task_id)
        if task.finished or last is None or now - last >= self.every_s:
            self._last_logged[task_id] = now
            log.info("%s: %d/%s (%.0f s)", task.description, task.completed, int(task.total or 0), task.elapsed or 0.0)


def progress_bar() -> Progress:
    bar = LoggedProgress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    bar.disable = not bar.console.is_terminal  # its log lines stand in for it; no bar dumped at the end
    return bar
