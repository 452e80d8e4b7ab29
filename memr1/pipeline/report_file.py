"""`report.json`, an evaluation run's scores, written and read in one place.

`evaluate.py` writes it (`memr1.pipeline.report.write_report`, through `EvalReport.write`); the
schedule's closing table, `memr1 compare`'s callers, `scripts/lift_report.py` and
`scripts/ship_agent.py` read it with `EvalReport.read`, whose errors name the file and what is wrong.
This module imports neither torch nor matplotlib: the readers stay light.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPORT_FILE = "report.json"

# The score columns every table of evaluations shows, in this order (keys of `EvalReport.scores`, 0-100).
LEXICAL_COLUMNS = (("f1", "F1"), ("bleu1", "BLEU-1"), ("em", "EM"))
SCORE_COLUMNS = (*LEXICAL_COLUMNS, ("j", "J"))  # J: the LLM judge, where one ran
# Distillation against evidence (memr1.metrics.distill), where the agent distils.
DISTILL_COLUMNS = (("distill_recall", "Distill R"), ("distill_precision", "Distill P"), ("evidence_retrieved", "Evidence retrieved"))
# The share of a distilling agent's replies that list at least one memory. An empty list under its
# heading is no format error, so `format_error_rate/missing_memory_list` does not count it.
MEMORY_LISTED = "memory_listed"


@dataclass(frozen=True)
class EvalReport:
    """title: what was evaluated. scores: 0-100 by name (`f1`, `f1/cat1`, `count`, `format_error_rate`,
    ...). latency: per stage, `p50_s`, `p95_s`, ... settings: the run's split, banks, answer config,
    precision, bank sizes, wall time."""

    title: str
    scores: Mapping[str, float]
    latency: Mapping[str, Mapping[str, float]]
    settings: Mapping[str, Any]

    @property
    def split(self) -> str:
        return str(self.settings.get("split", ""))

    @property
    def wall_time_s(self) -> float | None:
        value = self.settings.get("wall_time_s")
        return float(value) if value is not None else None

    def categories(self) -> list[int]:
        """The question categories scored, in order."""
        return sorted(int(key.split("cat", 1)[1]) for key in self.scores if key.startswith("count/cat"))

    def written_category_names(self) -> dict[int, str] | None:
        """The category names the run wrote; None for a report written before runs wrote them."""
        written = self.settings.get("categories")
        if isinstance(written, Mapping):
            return {int(category): str(name) for category, name in written.items()}
        return None

    def category_names(self) -> dict[int, str]:
        """What the run's dataset calls each category: as the run wrote it, or, for a report written
        before runs wrote them, its dataset's spec (`settings["data"]`)."""
        written = self.written_category_names()
        if written is not None:
            return written
        from memr1.datasets.registry import dataset_spec

        return dict(dataset_spec(str(self.settings.get("data", "locomo"))).categories)

    def write(self, run_dir: str | Path) -> Path:
        path = Path(run_dir) / REPORT_FILE
        path.write_text(json.dumps(asdict(self), indent=2, default=str))
        return path

    @classmethod
    def read(cls, run_dir: str | Path) -> EvalReport:
        """The report of the evaluation run directory `run_dir`."""
        path = Path(run_dir) / REPORT_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file; pass an evaluation run directory (evaluate.py's hydra.run.dir)")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not JSON ({error})") from None
        missing = [key for key in ("title", "scores", "latency", "settings") if not isinstance(raw, dict) or key not in raw]
        if missing:
            raise ValueError(f"{path}: missing {', '.join(missing)}: not a report evaluate.py wrote")
        return cls(raw["title"], raw["scores"], raw["latency"], raw["settings"])
