"""The layering of docs/architecture.md holds: no import points up, no two modules or packages import
each other, and every library file is one a reader takes in whole."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400


def test_no_import_points_up_and_nothing_imports_in_a_cycle():
    result = subprocess.run([sys.executable, "scripts/check_layers.py"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    assert "0 upward, 0 cycle(s)" in result.stdout


def test_the_checker_catches_an_upward_import_and_a_cycle():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import check_layers
    finally:
        sys.path.pop(0)
    graph = {"memr1.types": {"memr1.training"}, "memr1.training": {"memr1.types"}}
    assert check_layers.upward_imports(graph) == ["memr1.types (foundations) imports memr1.training (applications)"]
    assert check_layers.cycles(graph) == [["memr1.training", "memr1.types"]]
    assert check_layers.package_graph({"memr1.llm.a": {"memr1.memory.b"}}) == {"memr1.llm": {"memr1.memory"}}


def test_library_files_are_short_enough_to_read_whole():
    long = {
        str(path.relative_to(ROOT)): lines
        for package in ("memr1", "data_modules")
        for path in (ROOT / package).rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines: {long}"
