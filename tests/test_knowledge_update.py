"""The knowledge-update set (memr1/datasets/knowledge_update.py): reproducible from its seed, loaded by
the LoCoMo loader through memr1/conf/data/knowledge_update.yaml's splits, split by template family and by
person name, and each answer the current state that the evidence turns tell."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from memr1.apps import CONFIG_DIR
from memr1.cli import main
from memr1.datasets.knowledge_update import ACCUMULATED, CANCELLED, FAMILIES, REPLACED, UNCHANGED, generate, write
from memr1.datasets.locomo import parse_locomo
from memr1.pipeline.evaluation import load_split

CONF = CONFIG_DIR


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ku") / "knowledge_update.json"
    assert main(["knowledge-update", "--out", str(path)]) == 0
    return path


def splits(path: Path) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=["data=knowledge_update", f"data.path={path}"])
    return {split: load_split(cfg.data, split) for split in ("train", "validation", "test")}


def family_of(question: str):
    """The family whose question template `question` fills."""
    for family in FAMILIES:
        pattern = re.escape(family.question).replace(r"\{name\}", r"\w+").replace(r"\{value\}", ".+")
        if re.fullmatch(pattern, question):
            return family
    raise AssertionError(f"no family asks {question!r}")


def test_the_same_seed_writes_the_same_file_and_another_seed_another(tmp_path, written):
    write(tmp_path / "again.json", seed=0)
    assert (tmp_path / "again.json").read_bytes() == written.read_bytes()
    assert generate(seed=1, conversations={"test": 2}) != generate(seed=0, conversations={"test": 2})
    with pytest.raises(ValueError, match="unknown splits"):
        generate(conversations={"dev": 1})


def test_the_config_loads_every_split_and_the_test_split_has_300_questions(written):
    loaded = splits(written)
    assert [len(loaded[split]) for split in ("train", "validation", "test")] == [40, 20, 32]
    assert sum(len(c.questions) for c in loaded["test"]) >= 300
    assert parse_locomo(written, exclude_categories=()).issues == ()  # a clean file: nothing repaired or dropped
    for split, conversations in loaded.items():
        assert all(c.sample_id.startswith(f"ku-{split}-") for c in conversations)
        assert {q.category for c in conversations for q in c.questions} == {REPLACED, CANCELLED, ACCUMULATED, UNCHANGED}


def test_no_test_family_phrasing_name_or_chatter_is_seen_in_training(written):
    loaded = splits(written)
    families = {split: {family_of(q.question).name for c in cs for q in c.questions} for split, cs in loaded.items()}
    names = {split: {speaker for c in cs for speaker in c.speakers} for split, cs in loaded.items()}
    facts = {split: {f.text.replace(f.speaker, "X") for c in cs for f in c.facts} for split, cs in loaded.items()}
    for one, other in (("train", "test"), ("train", "validation"), ("validation", "test")):
        assert not families[one] & families[other] and not names[one] & names[other]
        assert not facts[one] & facts[other], facts[one] & facts[other]  # every told fact, chatter included


def test_each_answer_is_the_state_its_evidence_leaves(written):
    for conversation in splits(written)["test"]:
        facts = {dia_id: fact for fact in conversation.facts for dia_id in fact.dia_ids}
        for question in conversation.questions:
            family = family_of(question.question)
            evidence = [facts[dia_id] for dia_id in question.evidence]
            assert all(fact.speaker in question.question for fact in evidence)
            # The speaker's facts of this thread (same family, same speaker), in the order they were told.
            subject = next(fact.speaker for fact in evidence)
            sessions = [int(dia_id[1:].split(":")[0]) for dia_id in question.evidence]
            if question.category == CANCELLED:
                assert question.answer == "No" and family.kind == "cancelled" and len(evidence) == 1
                assert any(word in evidence[0].text for word in ("cancelled", "left", "dropped"))
            elif question.category == UNCHANGED:
                told = evidence[0].text
                assert len(evidence) == 1 and (question.answer == "Yes" or question.answer in told), (question, told)
            elif question.category == ACCUMULATED:
                first, second = question.answer.split(" and ")
                assert first in evidence[0].text and second in evidence[1].text and sessions[0] < sessions[1]
            else:
                (change,) = evidence
                assert question.answer in change.text and family.kind == "replaced" and sessions[0] > 1
            assert subject in conversation.speakers
