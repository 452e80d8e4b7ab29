"""The one error type for a data file that does not match its format."""

from __future__ import annotations

from pathlib import Path


class DatasetFormatError(ValueError):
    """A data file is malformed. The message names the file, the JSON path of the field and the problem,
    e.g. ``locomo10.json: $[3].conversation.session_2[5].text: missing``."""

    def __init__(self, path: str | Path, json_path: str, problem: str) -> None:
        self.path = str(path)
        self.json_path = json_path
        self.problem = problem
        super().__init__(f"{self.path}: {json_path}: {problem}")
