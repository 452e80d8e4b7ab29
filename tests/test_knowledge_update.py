"""The knowledge-update set (memr1/datasets/knowledge_update.py): reproducible from its seed, loaded by
the LoCoMo loader through memr1/conf/data/knowledge_update.yaml's splits, split by template family and by
person name, and each answer the current state that the evidence turns tell; the same of the set with
the dropped kind (conf/data/knowledge_update_dropped.yaml), whose kind leaves the set of record's bytes
as they were."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from memr1.apps import CONFIG_DIR
from memr1.cli import main
from memr1.datasets.knowledge_update import (
    ACCUMULATED,
    CANCELLED,
    DEFAULT_KINDS,
    DROPPED,
    FAMILIES,
    KINDS,
    REPLACED,
    UNCHANGED,
    Family,
    generate,
    write,
)
from memr1.datasets.locomo import parse_locomo
from memr1.pipeline.evaluation import load_split

CONF = CONFIG_DIR
# The sha256 of `memr1 knowledge-update` (seed 0, the default kinds): the file every knowledge-update row
# under results/ was scored on. A change to the generator that moves it orphans those rows.
SET_OF_RECORD_SHA256 = "c1bb6ea71dc87efce43d10abe8730155378016c3b5bbad52e0765383c77d6f0e"
SETS = {"knowledge_update": [], "knowledge_update_dropped": ["--kinds", *KINDS]}  # data config: its CLI options


@pytest.fixture(scope="module", params=sorted(SETS))
def written(tmp_path_factory, request) -> tuple[str, Path]:
    """(the data config's name, the set it reads written with the CLI)."""
    path = tmp_path_factory.mktemp("ku") / f"{request.param}.json"
    assert main(["knowledge-update", "--out", str(path), *SETS[request.param]]) == 0
    return request.param, path


def splits(written: tuple[str, Path]) -> dict:
    name, path = written
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=[f"data={name}", f"data.path={path}"])
    return {split: load_split(cfg.data, split) for split in ("train", "validation", "test")}


def family_of(question: str):
    """The family whose question template `question` fills."""
    for family in FAMILIES:
        pattern = re.escape(family.question).replace(r"\{name\}", r"\w+").replace(r"\{value\}", ".+")
        if re.fullmatch(pattern, question):
            return family
    raise AssertionError(f"no family asks {question!r}")


def test_the_same_seed_writes_the_same_file_and_another_seed_another(tmp_path, written):
    name, path = written
    kinds = KINDS if name == "knowledge_update_dropped" else DEFAULT_KINDS
    write(tmp_path / "again.json", seed=0, kinds=kinds)
    assert (tmp_path / "again.json").read_bytes() == path.read_bytes()
    assert generate(seed=1, conversations={"test": 2}) != generate(seed=0, conversations={"test": 2})
    with pytest.raises(ValueError, match="unknown splits"):
        generate(conversations={"dev": 1})
    with pytest.raises(ValueError, match=r"kinds: \['deleted'\]"):
        generate(kinds=("replaced", "deleted"))


def test_the_default_set_is_the_set_of_record_whatever_kinds_were_added(written):
    name, path = written
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert (digest == SET_OF_RECORD_SHA256) == (name == "knowledge_update"), (name, digest)


def test_a_family_tells_a_second_thing_held_exactly_when_it_is_dropped():
    with pytest.raises(ValueError, match="family f: `also`"):
        Family("f", "dropped", "test", ("a", "b"), "t", "f", "c", "cf", "r", "rf", "q?")
    with pytest.raises(ValueError, match="family f: `also`"):
        Family("f", "replaced", "test", ("a", "b"), "t", "f", "c", "cf", "r", "rf", "q?", also="x {new}", also_fact="y {new}")
    with pytest.raises(ValueError, match="family f: kind 'moved'"):
        Family("f", "moved", "test", ("a", "b"), "t", "f", "c", "cf", "r", "rf", "q?")


def test_the_config_loads_every_split_and_the_test_split_has_300_questions(written):
    name, path = written
    loaded = splits(written)
    assert [len(loaded[split]) for split in ("train", "validation", "test")] == [40, 20, 32]
    assert sum(len(c.questions) for c in loaded["test"]) >= 300
    assert parse_locomo(path, exclude_categories=()).issues == ()  # a clean file: nothing repaired or dropped
    categories = {REPLACED, CANCELLED, ACCUMULATED, UNCHANGED} | ({DROPPED} if name == "knowledge_update_dropped" else set())
    for split, conversations in loaded.items():
        assert all(c.sample_id.startswith(f"ku-{split}-") for c in conversations)
        assert {q.category for c in conversations for q in c.questions} == categories


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
            elif question.category == UNCHANGED and family.kind == "dropped":  # both still held
                first, second = question.answer.split(" and ")
                assert first in evidence[0].text and second in evidence[1].text and sessions[0] < sessions[1]
            elif question.category == UNCHANGED:
                told = evidence[0].text
                assert len(evidence) == 1 and (question.answer == "Yes" or question.answer in told), (question, told)
            elif question.category == DROPPED:  # the one left, told before the other ended
                left, ended = evidence
                assert family.kind == "dropped" and question.answer in left.text and sessions[0] < sessions[1]
                assert question.answer not in ended.text and "stopped" in ended.text, (question, ended.text)
                assert any(value in ended.text for value in family.values if value != question.answer)
            elif question.category == ACCUMULATED:
                first, second = question.answer.split(" and ")
                assert first in evidence[0].text and second in evidence[1].text and sessions[0] < sessions[1]
            else:
                (change,) = evidence
                assert question.answer in change.text and family.kind == "replaced" and sessions[0] > 1
            assert subject in conversation.speakers
