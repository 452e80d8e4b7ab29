"""Shipped agents (`trained:NAME`): scripts/ship_agent.py copies a real LoRA export chain and writes its
card; the name then loads exactly the weights the export path loads, wherever a policy export is taken
(load_policy, the preflights, `memr1 serve`'s choice, `memr1 agents`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from memr1.llm.loading import WARM_START_FILE, checkpoint_chain, load_policy, load_tokenizer
from memr1.pipeline.report_file import EvalReport
from memr1.shipped import TRAINED_DIR_ENV, card, shipped_agents, shipped_path
from memr1.llm.testing import save_lora_export, save_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]
LIMIT = "on another set's test split: F1 -7.60 [-9.21, -6.04] against ADD-all (results/compare.json)"


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model", load_tokenizer("embedded:smollm2-135m-instruct"))


def evaluation_run(directory: Path, backbone: Path, answers: dict[str, tuple[str, str]]) -> Path:
    """An evaluate.py run directory: report.json and predictions.jsonl (qid -> (prediction, gold))."""
    directory.mkdir(parents=True)
    rows = [{"qid": qid, "conversation_id": "c", "question": "?", "gold": gold, "prediction": prediction, "category": 1}
            for qid, (prediction, gold) in answers.items()]
    (directory / "predictions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    f1 = 100.0 * sum(p == g for p, g in answers.values()) / len(answers)
    settings = {"split": "test", "backbone": str(backbone), "precision": "fp32"}
    EvalReport("fixture", {"f1": f1, "count": float(len(answers))}, {}, settings).write(directory)
    return directory


def ship(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, TRAINED_DIR_ENV: str(root)}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "ship_agent.py"), *args], env=env, capture_output=True, text=True, timeout=120)


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


@pytest.mark.slow  # three processes each import torch
def test_a_shipped_chain_loads_by_name_exactly_as_the_run_exports(backbone, tmp_path, monkeypatch):
    sft = save_lora_export(backbone, tmp_path / "sft" / "policy" / "last", seed=1)
    rl = save_lora_export(backbone, tmp_path / "rl" / "policy" / "best", seed=2, init=sft)
    base_eval = evaluation_run(tmp_path / "eval-sft", backbone, {"q1": ("a", "a"), "q2": ("x", "b"), "q3": ("x", "c")})
    rl_eval = evaluation_run(tmp_path / "eval-rl", backbone, {"q1": ("a", "a"), "q2": ("b", "b"), "q3": ("x", "c")})
    root = tmp_path / "trained"
    common = ["--agent", "answer", "--train-command", "python train.py ..."]

    # The RL export cannot ship before the warm start it was trained from.
    refused = ship(root, "--name", "rl", "--export", str(rl), "--eval", str(rl_eval), *common)
    assert refused.returncode != 0 and "ship that first and name it with --warm-start" in refused.stderr

    sft_run = tmp_path / "sft"
    (sft_run / ".hydra").mkdir()
    (sft_run / ".hydra" / "overrides.yaml").write_text("- algo=sft\n")
    # A pipeline stage: the command line stage.yaml was composed from heads it (memr1.schedule.prepare_stage).
    (sft_run / "stage.yaml").write_text("# memr1 pipeline lift, stage sft: composed from\n#   python train.py algo=sft data_loader.max_steps=30\nseed: 0\n")
    (sft_run / "curves.json").write_text(json.dumps({"train": {"loss": [[1, 0.9], [30, 0.1]]}}))
    shipped = ship(root, "--name", "sft", "--export", str(sft), "--eval", str(base_eval), "--train-run", str(sft_run), *common)
    assert shipped.returncode == 0, shipped.stderr
    # A warm start that is not the adapter the run started from is refused by digest.
    other = save_lora_export(backbone, tmp_path / "other", seed=5)
    assert ship(root, "--name", "other", "--export", str(other), "--eval", str(base_eval), *common).returncode == 0
    wrong = ship(root, "--name", "rl", "--export", str(rl), "--eval", str(rl_eval), "--warm-start", "trained:other", *common)
    assert wrong.returncode != 0 and "is not the one" in wrong.stderr
    shipped = ship(root, "--name", "rl", "--export", str(rl), "--eval", str(rl_eval), "--versus", str(base_eval),
                   "--warm-start", "trained:sft", "--eval-overrides", "split=test", "--limit", LIMIT, *common)
    assert shipped.returncode == 0, shipped.stderr
    # Shipping over an agent takes --replace.
    again = ship(root, "--name", "sft", "--export", str(sft), "--eval", str(base_eval), *common)
    assert again.returncode != 0 and "--replace" in again.stderr
    # Re-scored (a new --eval) after its train run is gone: the card keeps how that adapter was trained.
    for path in (sft_run / "curves.json", sft_run / ".hydra" / "overrides.yaml", sft_run / "stage.yaml"):
        path.unlink()
    rescored = ship(root, "--name", "sft", "--export", str(sft), "--eval", str(rl_eval), "--replace", *common)
    assert rescored.returncode == 0, rescored.stderr
    sft_card = json.loads((root / "sft" / "card.json").read_text())
    assert sft_card["trained"] == {"command": "python train.py ...", "composed_from": "python train.py algo=sft data_loader.max_steps=30",
                                   "overrides": ["algo=sft"], "steps": 30}
    assert sft_card["evaluation"]["scores"]["f1"] == pytest.approx(200 / 3)

    monkeypatch.setenv(TRAINED_DIR_ENV, str(root))
    assert list(shipped_agents()) == ["other", "rl", "sft"]
    # The shipped chain names its parent by name, not by a path on the machine that trained it.
    assert json.loads((root / "rl" / WARM_START_FILE).read_text()) == {"init": "trained:sft"}
    assert checkpoint_chain("trained:rl") == [root / "sft", root / "rl"]
    by_name, _ = load_policy(backbone, ckpt="trained:rl")
    by_path, _ = load_policy(backbone, ckpt=rl)
    expected = weights(by_path)
    assert all(torch.equal(tensor, expected[name]) for name, tensor in weights(by_name).items())
    # Its card: the scores, the paired comparison with its start (q2 changed: +33.33 F1), the spot check.
    rl_card = card("trained:rl")
    assert (rl_card["agent"], rl_card["warm_start"], rl_card["evaluation"]["scores"]["f1"]) == ("answer", "trained:sft", pytest.approx(200 / 3))
    assert rl_card["evaluation"]["versus"]["overall"]["f1"]["delta"] == pytest.approx(100 / 3)
    assert rl_card["evaluation"]["spot_check"][1] == {"qid": "q2", "prediction": "b"}
    assert rl_card["rescore"] == "python evaluate.py split=test precision=fp32 ckpt=trained:rl"
    assert "ΔF1 +33.33" in (root / "rl" / "card.md").read_text()
    # A limit measured where it was not trained goes on the card, and only on the card it was given to.
    assert rl_card["limits"] == [LIMIT] and f"## Limits\n\n- {LIMIT}\n" in (root / "rl" / "card.md").read_text()
    assert card("trained:sft")["limits"] == [] and "## Limits" not in (root / "sft" / "card.md").read_text()
    # Re-scored without --limit, the same adapter keeps the limits measured before.
    rescored = ship(root, "--name", "rl", "--export", str(rl), "--eval", str(base_eval), "--warm-start", "trained:sft", "--replace", *common)
    assert rescored.returncode == 0, rescored.stderr
    assert card("trained:rl")["limits"] == [LIMIT]

    listing = subprocess.run([sys.executable, "-m", "memr1.cli", "agents", "--json"], env={**os.environ, TRAINED_DIR_ENV: str(root)},
                             capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr
    assert [entry["name"] for entry in json.loads(listing.stdout)] == ["other", "rl", "sft"]


def test_an_unknown_name_is_refused_naming_what_is_shipped(tmp_path, monkeypatch):
    from memr1.cli import _agent_model
    from memr1.preflight import check_export

    (tmp_path / "answer-agent").mkdir()
    (tmp_path / "answer-agent" / "card.json").write_text("{}")
    monkeypatch.setenv(TRAINED_DIR_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"trained:nope: no shipped agent of that name .*shipped: trained:answer-agent"):
        shipped_path("trained:nope")
    with pytest.raises(FileNotFoundError, match=r"^answer.ckpt=trained:nope: no shipped agent"):
        check_export("answer.ckpt", "trained:nope", "the warm start")
    check_export("answer.ckpt", "trained:answer-agent", "the warm start")  # a shipped name passes
    with pytest.raises(ValueError, match="a shipped agent \\(trained:NAME\\) or a policy export directory"):
        _agent_model(str(tmp_path / "missing"), "embedded:smollm2-135m-instruct", {})
    # A path is a path: only the prefix makes a name.
    assert shipped_path(tmp_path / "x") == tmp_path / "x"
