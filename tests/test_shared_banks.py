"""Two evaluations of different checkpoints on one bank directory, side by side: real evaluate.py
processes of a tiny model over one Milvus Lite file. Whichever opens it first builds the banks and
releases the file once they are loaded; the other waits for it, then loads the same banks.

Time budget: about 40 s on 2 CPU cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memr1.llm.loading import load_tokenizer
from memr1.llm.testing import save_tiny_checkpoint

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_two_evaluations_share_one_bank_directory(tmp_path):
    tokenizer = load_tokenizer("embedded:smollm2-135m-instruct")
    models = [save_tiny_checkpoint(tmp_path / f"model{seed}", tokenizer, seed=seed) for seed in (1, 2)]
    banks = tmp_path / "banks"
    processes, logs = [], []
    for index, model in enumerate(models):
        log = (tmp_path / f"eval{index}.log").open("w")
        logs.append(log)
        command = [
            sys.executable, str(ROOT / "evaluate.py"), f"backbone.name_or_path={model}", f"banks.dir={banks}",
            "split=validation", "max_questions=2", "answer.distill=false", "answer.k_per_speaker=1",
            "answer.max_new_tokens=4", "answer.batch_size=2", f"hydra.run.dir={tmp_path / f'run{index}'}",
        ]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        processes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
    statuses = [process.wait(timeout=600) for process in processes]
    for log in logs:
        log.close()
    outputs = [(tmp_path / f"eval{index}.log").read_text() for index in range(2)]
    assert statuses == [0, 0], "\n".join(output[-2000:] for output in outputs)
    reports = [json.loads((tmp_path / f"run{index}" / "report.json").read_text()) for index in range(2)]
    assert reports[0]["settings"]["bank_sizes"] == reports[1]["settings"]["bank_sizes"]  # the same banks
    assert len(list(banks.glob("*.db"))) == 1
    # Output redirected to a file still shows progress: plain log lines instead of a bar.
    assert all("answering: 2/2" in output for output in outputs)
