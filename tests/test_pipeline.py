"""The memory pipeline on the hand-made LoCoMo fixture: real Milvus Lite banks, the real MiniLM embedder,
a tiny random model where a model is needed, and `run_evaluation` end to end through Hydra."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from memr1.apps import CONFIG_DIR
from memr1.agents.extractor import FactExtractor
from memr1.datasets.locomo import load_locomo
from memr1.llm.engines import HFEngine
from memr1.llm.loading import load_tokenizer
from memr1.llm.sampling import SamplingConfig
from memr1.llm.testing import tiny_causal_lm
from memr1.memory import MemoryBank
from memr1.banks.build import DecisionLog, bank_name, bank_operations, build_banks, describe_operations, memory_items, raw_turn_facts
from memr1.pipeline.evaluation import run_evaluation
from memr1.pipeline.extraction import extract_facts
from memr1.provenance import code_version
from memr1.banks.policies import AddAllPolicy, ModelPolicy, add_op
from memr1.types import Fact, MemoryOp, OpKind, Turn

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "locomo_mini.json"
EMBEDDED = "embedded:smollm2-135m-instruct"


@pytest.fixture(scope="module")
def conversations():
    return load_locomo(FIXTURE)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(EMBEDDED)


def open_banks(uri: Path, conversations, embedder) -> dict[str, MemoryBank]:
    return {c.sample_id: MemoryBank.open(uri, bank_name(c.sample_id), embedder) for c in conversations}


def test_add_all_build_holds_every_fact_and_a_rerun_adds_nothing(tmp_path, conversations, embedder):
    items = {c.sample_id: memory_items(c, "observation") for c in conversations}
    progress = tmp_path / "banks.progress.json"
    banks = open_banks(tmp_path / "banks.db", conversations, embedder)
    try:
        build_banks(items, banks, AddAllPolicy(), progress)
        for conversation in conversations:
            texts = [entry.text for entry in banks[conversation.sample_id].entries()]
            assert texts == [fact.text for fact in items[conversation.sample_id]]
        build_banks(items, banks, AddAllPolicy(), progress)
        assert {cid: len(bank) for cid, bank in banks.items()} == {cid: len(facts) for cid, facts in items.items()}
    finally:
        for bank in banks.values():
            bank.close()


def test_build_resumes_without_applying_an_op_twice(tmp_path, conversations, embedder):
    """A kill between "op applied" and "progress saved": the bank's step tells the build it is done."""
    conversation = conversations[0]
    items = memory_items(conversation, "observation")
    assert len(items) >= 3
    progress = tmp_path / "p.json"
    with MemoryBank.open(tmp_path / "b.db", "bank", embedder) as bank:
        build_banks({conversation.sample_id: items[:2]}, {conversation.sample_id: bank}, AddAllPolicy(), progress)
        bank.apply(add_op(items[2]))  # applied, then "killed" before the progress file was written
        build_banks({conversation.sample_id: items}, {conversation.sample_id: bank}, AddAllPolicy(), progress)
        assert [entry.text for entry in bank.entries()] == [fact.text for fact in items]
        assert json.loads(progress.read_text())["bank"] == {"items": len(items), "step": len(items), "malformed": 0, "rejected": 0}


def test_a_random_model_as_manager_never_corrupts_a_bank(tmp_path, conversations, embedder, tokenizer):
    engine = HFEngine(tiny_causal_lm(tokenizer, seed=3), tokenizer, batch_size=4)
    policy = ModelPolicy(engine, sampling=SamplingConfig(max_new_tokens=12, temperature=0.0), num_candidates=2)
    items = {c.sample_id: memory_items(c, "observation") for c in conversations}
    banks = open_banks(tmp_path / "m.db", conversations, embedder)
    try:
        build_banks(items, banks, policy, tmp_path / "m.progress.json")
        total = sum(len(facts) for facts in items.values())
        # Garbage never parses: every decision is a NOOP with a format error, and the banks stay empty.
        operations = bank_operations(banks, items, tmp_path / "m.progress.json")
        assert operations == {"ADD": 0, "UPDATE": 0, "DELETE": 0, "NOOP": total, "malformed": total, "rejected": 0}
        assert all(len(bank) == 0 for bank in banks.values())
    finally:
        for bank in banks.values():
            bank.close()


class ScriptedPolicy:
    """The i-th fact of the build gets `SCRIPT[i]` (ADD after the script ends): every outcome a bank
    build counts, decided by the fact's position, so a fact decided again after a kill gets the same."""

    num_candidates = 2
    SCRIPT = ("ADD", "ADD", "UPDATE", "malformed", "DELETE", "unknown target", "NOOP")

    def __init__(self, facts: list[Fact]) -> None:
        self.position = {fact.text: index for index, fact in enumerate(facts)}

    def decide(self, conversation_ids, facts, candidates, banks):
        ops = []
        for fact, found in zip(facts, candidates):
            index = self.position[fact.text]
            action = self.SCRIPT[index] if index < len(self.SCRIPT) else "ADD"
            if action == "ADD":
                ops.append(add_op(fact))
            elif action == "UPDATE":
                ops.append(MemoryOp(OpKind.UPDATE, text=fact.text + " (updated)", target_id=found[0].id, speaker=fact.speaker))
            elif action == "DELETE":
                ops.append(MemoryOp(OpKind.DELETE, target_id=found[0].id))
            elif action == "unknown target":  # well formed, but the bank holds no such memory: rejected
                ops.append(MemoryOp(OpKind.UPDATE, text=fact.text, target_id="m999", speaker=fact.speaker))
            elif action == "malformed":
                ops.append(MemoryOp(OpKind.NOOP, format_error="invalid_json"))
            else:
                ops.append(MemoryOp(OpKind.NOOP))
        return ops


def test_a_build_counts_each_operation_once_across_a_kill(tmp_path, conversations, embedder):
    """ADD / UPDATE / DELETE from the bank's revisions, NOOPs and their causes from the progress file:
    the same counts for an unbroken build and for one killed after a write, before its progress was saved."""
    items = [Fact(f"Ana's fact number {n}.", "Ana", (f"D1:{n}",), 1, "8 May, 2023") for n in range(10)]
    policy = ScriptedPolicy(items)
    # By hand, over 10 facts: the script's 2 ADDs and the 3 after it; 1 UPDATE, 1 DELETE; 3 NOOPs (the
    # malformed one, the rejected one, the model's own): 50%, 10%, 10%, 30%.
    expected = {"ADD": 5, "UPDATE": 1, "DELETE": 1, "NOOP": 3, "malformed": 1, "rejected": 1}
    unbroken = {"c": items}
    with MemoryBank.open(tmp_path / "a.db", "bank", embedder) as bank:
        build_banks(unbroken, {"c": bank}, policy, tmp_path / "a.json")
        assert bank_operations({"c": bank}, unbroken, tmp_path / "a.json") == expected
    assert describe_operations(expected) == "ADD 5 (50.0%), UPDATE 1 (10.0%), DELETE 1 (10.0%), NOOP 3 (30.0%; malformed 1, rejected 1)"
    with MemoryBank.open(tmp_path / "b.db", "bank", embedder) as bank:
        build_banks({"c": items[:7]}, {"c": bank}, policy, tmp_path / "b.json")  # the script's 7
        (op,) = policy.decide(["c"], [items[7]], [bank.search(items[7].text, speaker="Ana", k=2)], [bank])
        bank.apply(op)  # item 7's ADD applied, then "killed" before the progress file was written
        build_banks(unbroken, {"c": bank}, policy, tmp_path / "b.json")
        assert bank_operations({"c": bank}, unbroken, tmp_path / "b.json") == expected


def test_each_decision_is_logged_once_across_a_resumed_build(tmp_path, embedder):
    items = [Fact(f"Ana's fact number {n}.", "Ana", (f"D1:{n}",), 1, "8 May, 2023") for n in range(10)]
    policy, progress = ScriptedPolicy(items), tmp_path / "b.progress.json"
    with MemoryBank.open(tmp_path / "b.db", "bank", embedder) as bank:
        build_banks({"c": items[:4]}, {"c": bank}, policy, progress)
        build_banks({"c": items}, {"c": bank}, policy, progress)  # resumed at item 4
        build_banks({"c": items}, {"c": bank}, policy, progress)  # nothing left: nothing logged
    log = DecisionLog(DecisionLog.beside(progress))
    assert log.path == tmp_path / "b.decisions.jsonl"
    # The script by hand: ADD ADD UPDATE malformed DELETE unknown-target NOOP, then ADDs; the unknown
    # target is a well-formed UPDATE that the bank refused: its second line says NOOP.
    rows = log.load()
    assert [row["event"] for row in rows] == ["ADD", "ADD", "UPDATE", "NOOP", "DELETE", "NOOP", "NOOP", "ADD", "ADD", "ADD"]
    assert [n for n, row in enumerate(rows) if row["malformed"]] == [3]
    assert [n for n, row in enumerate(rows) if row["rejected"]] == [5]
    assert len(log.path.read_text().splitlines()) == 11  # the refused UPDATE, then its NOOP
    assert DecisionLog(None).load() is None and DecisionLog.beside(None) is None


def test_a_progress_file_from_before_the_tallies_reports_them_unknown(tmp_path, embedder):
    items = [Fact(f"Ana's fact number {n}.", "Ana", (f"D1:{n}",), 1, "8 May, 2023") for n in range(10)]
    policy, progress = ScriptedPolicy(items), tmp_path / "p.json"
    with MemoryBank.open(tmp_path / "b.db", "bank", embedder) as bank:
        build_banks({"c": items[:2]}, {"c": bank}, policy, progress)
        progress.write_text(json.dumps({"bank": {"items": 2, "step": 2}}))  # as the earlier code wrote it
        assert bank_operations({"c": bank}, {"c": items[:2]}, progress)["malformed"] == 0  # no NOOP: none of either
        build_banks({"c": items}, {"c": bank}, policy, progress)
        operations = bank_operations({"c": bank}, {"c": items}, progress)
    assert operations == {"ADD": 5, "UPDATE": 1, "DELETE": 1, "NOOP": 3, "malformed": None, "rejected": None}
    assert describe_operations(operations).endswith("NOOP 3 (30.0%; malformed unknown, rejected unknown)")


def test_raw_turns_are_one_memory_per_turn_with_the_speaker(conversations):
    conversation = conversations[0]
    facts = raw_turn_facts(conversation)
    turns = list(conversation.turns())
    assert [f.dia_ids for f in facts] == [(t.dia_id,) for t in turns]
    assert facts[0].text == f"{turns[0].speaker}: {turns[0].text}"


def test_extractor_parses_lines_into_facts_of_the_speaker():
    turn = Turn("D3:4", "Ben", "I ran my third marathon!", 3, "1 May, 2023")
    text = "Facts:\n- Ben ran his third marathon.\n2) Ben has run 3 marathons\n\nok\nNONE\nBen likes tea."
    facts = FactExtractor().parse(text, turn)
    assert facts == [
        Fact("Ben ran his third marathon.", "Ben", ("D3:4",), 3, "1 May, 2023"),
        Fact("Ben has run 3 marathons", "Ben", ("D3:4",), 3, "1 May, 2023"),
    ]
    assert FactExtractor().parse("NONE", turn) == []


class MustNotGenerate:
    tokenizer = None
    records_trunk = False

    def generate(self, prompts, sampling, trunk_depth=0):
        raise AssertionError("every turn is cached: nothing should be generated")


def test_extraction_is_cached_per_turn(tmp_path, conversations, tokenizer):
    engine = HFEngine(tiny_causal_lm(tokenizer, seed=5), tokenizer, batch_size=8)
    cache = tmp_path / "facts.jsonl"
    first = extract_facts(conversations, engine, cache, batch_size=8)
    turns = sum(1 for c in conversations for _ in c.turns())
    assert len(cache.read_text().splitlines()) == turns
    assert extract_facts(conversations, MustNotGenerate(), cache) == first


def evaluation_config(tmp_path: Path, tokenizer, overrides: list[str]):
    """memr1/conf/evaluate.yaml over a tiny random model saved as a checkpoint dir, with banks in tmp_path."""
    model_dir = tmp_path / "tiny"
    tiny_causal_lm(tokenizer, seed=7).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    common = [f"backbone.name_or_path={model_dir}", f"banks.dir={tmp_path / 'banks'}", "answer.k_per_speaker=2"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("evaluate", overrides=common + overrides)


def test_evaluate_runs_unchanged_on_a_zero_shot_dataset(tmp_path, tokenizer):
    """LongMemEval has no per-turn facts: its raw turns are the memories; split=test is its only split."""
    cfg = evaluation_config(
        tmp_path,
        tokenizer,
        [
            "data=longmemeval",
            f"data.path={ROOT / 'tests' / 'fixtures' / 'lme_sample.json'}",
            "split=test",
            "memory=raw_turns",
            "answer.max_new_tokens=4",
        ],
    )
    result = run_evaluation(cfg, tmp_path / "run")
    assert result["scores"]["count"] == 2
    assert (tmp_path / "run" / "report.md").exists()


def test_evaluate_end_to_end_writes_predictions_and_reports(tmp_path, tokenizer):
    cfg = evaluation_config(
        tmp_path,
        tokenizer,
        [
            f"data.path={FIXTURE}",
            "data.sha256=null",
            "data.splits={train:[mini-1],validation:[mini-2],test:null}",
            "answer.max_new_tokens=8",
            "answer.batch_size=2",
        ],
    )
    run_dir = tmp_path / "run"
    result = run_evaluation(cfg, run_dir)
    questions = load_locomo(FIXTURE)[1].questions
    rows = [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text().splitlines()]
    assert [row["qid"] for row in rows] == [q.qid for q in questions]
    assert all(len(row["retrieved_ids"]) <= 4 for row in rows)
    report = json.loads((run_dir / "report.json").read_text())
    assert report["scores"]["count"] == len(questions)
    assert set(report["latency"]) >= {"memory_search", "answer", "manager"}
    assert report["settings"]["code"] == code_version()  # the commit that scored it
    # The distilling agent (the default): the share of its replies that list a memory, from the rows.
    assert report["settings"]["answer"]["distill"]
    assert report["scores"]["memory_listed"] == pytest.approx(100 * sum(bool(row["selected_memories"]) for row in rows) / len(rows))
    assert "**Overall**" in (run_dir / "report.md").read_text()
    assert (run_dir / "scores.png").stat().st_size > 0
    assert 0.0 <= result["scores"]["f1"] <= 100.0
    # Each answer's scores are stored with it (what compare reads), and they average to the report's.
    for metric in ("f1", "bleu1", "em"):
        assert report["scores"][metric] == pytest.approx(sum(row["scores"][metric] for row in rows) / len(rows))
    assert report["settings"]["categories"]["2"] == "temporal"  # LoCoMo's SPEC names the categories
    # The add_all manager built the bank: every question retrieved memories from it, every fact an ADD.
    assert all(row["retrieved_ids"] for row in rows)
    facts = len(memory_items(load_locomo(FIXTURE)[1], "observation"))
    assert report["settings"]["bank_operations"] == {"ADD": facts, "UPDATE": 0, "DELETE": 0, "NOOP": 0, "malformed": 0, "rejected": 0}
    # Each fact's decision is kept beside the predictions (`memr1 decisions`), by index, without its text.
    decisions = [json.loads(line) for line in (run_dir / "decisions.jsonl").read_text().splitlines()]
    assert [(row["item"], row["event"]) for row in decisions] == [(n, "ADD") for n in range(facts)]


def test_a_stopped_evaluation_resumes_after_its_last_whole_batch(tmp_path, tokenizer, caplog):
    overrides = [f"data.path={FIXTURE}", "data.sha256=null", "data.splits={train:[],validation:[mini-1,mini-2],test:null}",
                 "answer.max_new_tokens=8", "answer.batch_size=2"]
    run_dir = tmp_path / "run"
    run_evaluation(evaluation_config(tmp_path, tokenizer, overrides), run_dir)
    unbroken = (run_dir / "predictions.jsonl").read_text().splitlines()
    assert len(unbroken) >= 5
    # As a kill leaves it: three answers written, the fourth torn mid-line. The first is marked, to
    # see that a kept answer is not answered again.
    first = json.loads(unbroken[0]) | {"latency_s": {"answer": -1.0}}
    (run_dir / "predictions.jsonl").write_text("\n".join([json.dumps(first), *unbroken[1:3], unbroken[3][:20]]))
    result = run_evaluation(evaluation_config(tmp_path, tokenizer, overrides), run_dir)
    resumed = (run_dir / "predictions.jsonl").read_text().splitlines()
    assert result["settings"]["resumed_predictions"] == 2  # back to the last whole batch of 2
    assert json.loads(resumed[0])["latency_s"] == {"answer": -1.0}
    strip = lambda line: {k: v for k, v in json.loads(line).items() if k != "latency_s"}  # noqa: E731
    assert [strip(line) for line in resumed] == [strip(line) for line in unbroken]
    assert result["scores"]["count"] == len(unbroken)
    # Another setting: nothing is kept, and the log says why.
    changed = run_evaluation(evaluation_config(tmp_path, tokenizer, [*overrides[:-2], "answer.max_new_tokens=6", "answer.batch_size=2"]), run_dir)
    assert changed["settings"]["resumed_predictions"] == 0 and "answered with other settings" in caplog.text
    assert len((run_dir / "predictions.jsonl").read_text().splitlines()) == len(unbroken)


def test_score_figure_labels_each_group_with_its_n_and_keeps_a_long_title_inside():
    import matplotlib.pyplot as plt

    from memr1.pipeline.report import score_figure

    scores = {"f1": 9.4, "bleu1": 6.9, "em": 0.0, "count": 81}
    for category, n in [(1, 32), (2, 26), (3, 13), (4, 10)]:
        scores.update({f"f1/cat{category}": 1.0, f"bleu1/cat{category}": 1.0, f"em/cat{category}": 0.0, f"count/cat{category}": n})
    names = {1: "single-hop", 2: "temporal", 3: "multi-hop", 4: "open-domain"}
    title = "memr1 evaluation: locomo validation, manager=add_all, memory=facts, ckpt=runs/cpu_lift/answer-grpo/policy/best"
    figure = score_figure(scores, names, title)
    try:
        axes = figure.axes[0]
        labels = [label.get_text() for label in axes.get_xticklabels()]
        assert labels == ["single-hop\n(n=32)", "temporal\n(n=26)", "multi-hop\n(n=13)", "open-domain\n(n=10)", "overall\n(n=81)"]
        figure.canvas.draw()
        box = axes.title.get_window_extent(figure.canvas.get_renderer())
        width, height = figure.canvas.get_width_height()
        assert 0 <= box.x0 and box.x1 <= width and box.y1 <= height  # nothing of the title is cut off
        assert axes.title.get_text().replace("\n", " ") == title
    finally:
        plt.close(figure)
