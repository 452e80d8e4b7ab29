"""The layering of docs/architecture.md holds: no import points up, and no two modules or packages
import each other. (Files are cut by role, not by a line count.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a subprocess
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
