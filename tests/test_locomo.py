"""LoCoMo: parsing (fixture and real file), malformed files, the sha256-checked download, the data module.

Time budget: about 5 s on 2 CPU cores (most of it importing Lightning for the data-module tests).
"""

from __future__ import annotations

import copy
import hashlib
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from memr1.datasets.download import ChecksumMismatchError, DownloadError, ensure_file
from memr1.datasets.errors import DatasetFormatError
from memr1.datasets.locomo import (
    ADVERSARIAL_ANSWER,
    IssueKind,
    ParseIssue,
    SplitStats,
    load_locomo,
    normalise_dia_ids,
    parse_locomo,
    split_conversations,
    split_stats,
)
from memr1.types import Conversation, Fact, Question, Session, Turn

FIXTURE = Path(__file__).parent / "fixtures" / "locomo_mini.json"

# --- expected parse of tests/fixtures/locomo_mini.json, written out by hand -----------------------

MAY_8 = "1:56 pm on 8 May, 2023"
JUNE_1 = "10:00 am on 1 June, 2023"
JAN_2 = "8:00 pm on 2 January, 2024"
JAN_5 = "11:30 am on 5 January, 2024"
MARCH_9 = "3:00 pm on 9 March, 2024"

MINI_1 = Conversation(
    sample_id="mini-1",
    speaker_a="Ana",
    speaker_b="Ben",
    # session_2 comes first in the file; session_3 has a date-time but no turns.
    sessions=(
        Session(
            1,
            MAY_8,
            (
                Turn("D1:1", "Ana", "Hi Ben! I adopted a dog named Rex.", 1, MAY_8),
                Turn("D1:2", "Ben", "Congrats! I started running in 2022.", 1, MAY_8),
                Turn("D1:3", "Ana", "Here is Rex at the park.", 1, MAY_8, "a photo of a dog on the grass"),
            ),
        ),
        Session(
            2,
            JUNE_1,
            (
                Turn("D2:1", "Ben", "I ran my 3rd marathon last week.", 2, JUNE_1),
                Turn("D2:2", "Ana", "Rex learned to fetch!", 2, JUNE_1),
            ),
        ),
    ),
    # Dialogue order: by the last turn each fact cites; the fact citing no real turn ends its session.
    facts=(
        Fact("Ana adopted a dog named Rex.", "Ana", ("D1:1",), 1, MAY_8),
        Fact("Ben started running in 2022.", "Ben", ("D1:2",), 1, MAY_8),
        Fact("Ana took Rex to the park.", "Ana", ("D1:1", "D1:3"), 1, MAY_8),
        Fact("Ben has run 3 marathons.", "Ben", ("D2:1",), 2, JUNE_1),
        Fact("Rex learned to fetch.", "Ana", ("D2:2",), 2, JUNE_1),
        Fact("Ben likes trail running.", "Ben", (), 2, JUNE_1),
    ),
    questions=(
        Question("mini-1/q0", "mini-1", "When did Ben start running?", "2022", ("D1:2",), 2),
        Question("mini-1/q1", "mini-1", "What is the name of Ana's dog?", "Rex", ("D1:1", "D1:3"), 1),
        Question("mini-1/q3", "mini-1", "How many marathons has Ben run?", "3", ("D2:1",), 4),
        Question("mini-1/q4", "mini-1", "Would Ana like a second dog?", "Likely yes", (), 3),
    ),
)

MINI_2 = Conversation(
    sample_id="mini-2",
    speaker_a="Cleo",
    speaker_b="Dev",
    # The file has session_1, session_10, session_2: numeric order puts 10 last.
    sessions=(
        Session(
            1,
            JAN_2,
            (
                Turn("D1:1", "Cleo", "I moved to Lisbon.", 1, JAN_2),
                Turn("D1:2", "Dev", "Nice! I visited Lisbon in 2019.", 1, JAN_2),
            ),
        ),
        Session(2, JAN_5, (Turn("D2:1", "Dev", "I bought a bike.", 2, JAN_5),)),
        Session(10, MARCH_9, (Turn("D10:1", "Cleo", "I got a job at a bakery.", 10, MARCH_9),)),
    ),
    facts=(
        Fact("Cleo moved to Lisbon.", "Cleo", ("D1:1",), 1, JAN_2),
        Fact("Dev visited Lisbon in 2019.", "Dev", ("D1:2",), 1, JAN_2),
        Fact("Dev bought a bike.", "Dev", ("D2:1",), 2, JAN_5),
        Fact("Cleo works at a bakery.", "Cleo", ("D10:1",), 10, MARCH_9),
    ),
    questions=(
        Question("mini-2/q0", "mini-2", "Where did Cleo move?", "Lisbon", ("D1:1",), 1),
        Question("mini-2/q1", "mini-2", "When did Dev visit Lisbon?", "2019", ("D1:2",), 2),
        Question("mini-2/q3", "mini-2", "Where does Cleo work?", "a bakery", ("D10:1",), 4),
    ),
)

MINI_ISSUES = (
    ParseIssue(
        "mini-1",
        "$[0].observation.session_2_observation.Ben[0][1]",
        IssueKind.FACT_DIA_ID_REPAIRED,
        "D2:1, D2:01",
        "read as D2:1",
    ),
    ParseIssue(
        "mini-1",
        "$[0].observation.session_2_observation.Ben[1][1]",
        IssueKind.FACT_DIA_ID_DROPPED_UNKNOWN,
        "D2:9",
        "no turn D2:9",
    ),
    ParseIssue("mini-1", "$[0].qa[1].evidence[0]", IssueKind.EVIDENCE_REPAIRED, "D1:1; D1:3", "read as D1:1, D1:3"),
    ParseIssue("mini-1", "$[0].qa[3].evidence[0]", IssueKind.EVIDENCE_REPAIRED, "D2:01", "read as D2:1"),
    ParseIssue("mini-1", "$[0].qa[3].evidence[1]", IssueKind.EVIDENCE_DROPPED_MALFORMED, "D", "'D' is not a dia_id"),
    ParseIssue(
        "mini-2",
        "$[1].observation.session_2_observation.Dev[0][1]",
        IssueKind.FACT_DIA_ID_DROPPED_MALFORMED,
        "D2:1, D2",
        "'D2' is not a dia_id",
    ),
    ParseIssue(
        "mini-2",
        "$[1].observation.session_2_observation.Dev[0][1]",
        IssueKind.FACT_DIA_ID_REPAIRED,
        "D2:1, D2",
        "read as D2:1",
    ),
    ParseIssue("mini-2", "$[1].qa[0].evidence[0]", IssueKind.EVIDENCE_REPAIRED, "D:1:1", "read as D1:1"),
    ParseIssue("mini-2", "$[1].qa[1].evidence[1]", IssueKind.EVIDENCE_DROPPED_UNKNOWN, "D4:4", "no turn D4:4"),
)


# --- dia_id normalisation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "ids", "rejected"),
    [
        ("D1:3", ("D1:3",), ()),
        ("D8:6; D9:17", ("D8:6", "D9:17"), ()),
        ("D9:1 D4:4 D4:6", ("D9:1", "D4:4", "D4:6"), ()),
        ("D26:14, D26:34", ("D26:14", "D26:34"), ()),
        ("D30:05", ("D30:5",), ()),
        ("D:11:26", ("D11:26",), ()),
        ("D", (), ("D",)),
        ("D2:1, D2:01", ("D2:1",), ()),
        ("D2:1, D2", ("D2:1",), ("D2",)),
        ("  ", (), ()),
    ],
)
def test_normalise_dia_ids(raw: str, ids: tuple[str, ...], rejected: tuple[str, ...]) -> None:
    assert normalise_dia_ids(raw) == (ids, rejected)


# --- the fixture ---------------------------------------------------------------------------------


def test_fixture_parses_to_the_expected_conversations() -> None:
    parsed = parse_locomo(FIXTURE)
    assert parsed.conversations == (MINI_1, MINI_2)
    assert parsed.issues == MINI_ISSUES
    assert load_locomo(FIXTURE) == [MINI_1, MINI_2]


def test_fixture_with_adversarial_questions() -> None:
    mini_1, mini_2 = load_locomo(FIXTURE, exclude_categories=())
    # Gold for category 5 is LoCoMo's "not mentioned", even where the file also has an `answer` ("Nothing").
    assert [(q.qid, q.category, q.answer) for q in mini_1.questions + mini_2.questions] == [
        ("mini-1/q0", 2, "2022"),
        ("mini-1/q1", 1, "Rex"),
        ("mini-1/q2", 5, ADVERSARIAL_ANSWER),
        ("mini-1/q3", 4, "3"),
        ("mini-1/q4", 3, "Likely yes"),
        ("mini-2/q0", 1, "Lisbon"),
        ("mini-2/q1", 2, "2019"),
        ("mini-2/q2", 5, ADVERSARIAL_ANSWER),
        ("mini-2/q3", 4, "a bakery"),
    ]


def test_exclude_categories_is_configurable() -> None:
    mini_1, mini_2 = load_locomo(FIXTURE, exclude_categories=(1, 5))
    assert [q.qid for q in mini_1.questions] == ["mini-1/q0", "mini-1/q3", "mini-1/q4"]
    assert [q.qid for q in mini_2.questions] == ["mini-2/q1", "mini-2/q3"]


def test_split_conversations_and_stats() -> None:
    parsed = parse_locomo(FIXTURE)
    splits = split_conversations(parsed.conversations, {"train": ("mini-1",), "test": None})
    assert splits == {"train": [MINI_1], "test": [MINI_2]}
    assert split_stats(splits["train"], parsed.issues) == SplitStats(
        conversations=1,
        sessions=2,
        turns=5,
        facts=6,
        questions_by_category={1: 1, 2: 1, 3: 1, 4: 1},
        questions_without_evidence=1,
        issues={
            IssueKind.FACT_DIA_ID_REPAIRED: 1,
            IssueKind.FACT_DIA_ID_DROPPED_UNKNOWN: 1,
            IssueKind.EVIDENCE_REPAIRED: 2,
            IssueKind.EVIDENCE_DROPPED_MALFORMED: 1,
        },
    )
    test_stats = split_stats(splits["test"], parsed.issues)
    assert test_stats.questions_by_category == {1: 1, 2: 1, 3: 0, 4: 1}
    assert test_stats.questions == 3
    assert test_stats.to_dict() == {
        "conversations": 1,
        "sessions": 3,
        "turns": 4,
        "facts": 4,
        "questions": {"1": 1, "2": 1, "3": 0, "4": 1, "total": 3},
        "questions_without_evidence": 0,
        "evidence_repaired": 1,
        "evidence_dropped_malformed": 0,
        "evidence_dropped_unknown": 1,
        "fact_dia_id_repaired": 1,
        "fact_dia_id_dropped_malformed": 1,
        "fact_dia_id_dropped_unknown": 0,
    }


@pytest.mark.parametrize(
    ("splits", "message"),
    [
        ({"train": ("conv-26",), "test": None}, "splits.train: no conversation 'conv-26'"),
        ({"train": ("mini-1",), "test": ("mini-1",)}, "splits.test: 'mini-1' is already in split 'train'"),
        ({"train": None, "test": None}, "only one split may take the rest"),
    ],
)
def test_bad_splits_are_refused(splits: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        split_conversations([MINI_1, MINI_2], splits)


# --- the real file -------------------------------------------------------------------------------


def test_real_locomo_splits_match_the_paper(real_locomo: Path) -> None:
    parsed = parse_locomo(real_locomo)
    splits = split_conversations(parsed.conversations)
    assert {name: [c.sample_id for c in conversations] for name, conversations in splits.items()} == {
        "train": ["conv-26"],
        "validation": ["conv-30"],
        "test": ["conv-41", "conv-42", "conv-43", "conv-44", "conv-47", "conv-48", "conv-49", "conv-50"],
    }
    stats = {name: split_stats(conversations, parsed.issues) for name, conversations in splits.items()}
    assert {name: s.questions for name, s in stats.items()} == {"train": 152, "validation": 81, "test": 1307}
    assert stats["test"].questions_by_category == {1: 239, 2: 258, 3: 83, 4: 727}
    dropped = {
        (issue.sample_id, issue.json_path, issue.raw)
        for issue in parsed.issues
        if issue.kind in (IssueKind.EVIDENCE_DROPPED_MALFORMED, IssueKind.EVIDENCE_DROPPED_UNKNOWN)
    }
    assert dropped == {
        ("conv-42", "$[3].qa[58].evidence[6]", "D10:19"),
        ("conv-42", "$[3].qa[88].evidence[1]", "D"),
        ("conv-47", "$[6].qa[38].evidence[0]", "D4:36"),
    }
    conv_50 = parsed.conversations[9]
    assert next(q for q in conv_50.questions if q.qid == "conv-50/q69").evidence == ("D30:5",)


# --- malformed files -----------------------------------------------------------------------------

DELETE = object()


def _edited(data: Any, keys: tuple[str | int, ...], value: Any) -> Any:
    """A deep copy of `data` with the item at `keys` set to `value` (or deleted); `keys == ()` replaces it."""
    if not keys:
        return value
    edited = copy.deepcopy(data)
    parent = edited
    for key in keys[:-1]:
        parent = parent[key]
    if value is DELETE:
        del parent[keys[-1]]
    else:
        parent[keys[-1]] = value
    return edited


@pytest.mark.parametrize(
    ("keys", "value", "json_path", "problem"),
    [
        ((), {"samples": []}, "$", "expected a list, got object"),
        ((1, "conversation"), DELETE, "$[1].conversation", "missing"),
        ((0, "sample_id"), DELETE, "$[0].sample_id", "missing"),
        ((1, "sample_id"), "mini-1", "$[1].sample_id", "duplicate 'mini-1' (first at $[0])"),
        ((0, "conversation", "session_2", 1, "text"), DELETE, "$[0].conversation.session_2[1].text", "missing"),
        ((1, "conversation", "session_10"), {"speaker": "Cleo"}, "$[1].conversation.session_10", "expected a list"),
        ((1, "conversation", "session_1_date_time"), DELETE, "$[1].conversation.session_1_date_time", "missing"),
        ((0, "conversation", "session_1", 0, "speaker"), "Cleo", "$[0].conversation.session_1[0].speaker", "'Cleo' is neither"),
        ((1, "conversation", "session_10", 0, "dia_id"), "D10-1", "$[1].conversation.session_10[0].dia_id", "expected a dia_id"),
        ((1, "conversation", "session_2", 0, "dia_id"), "D1:1", "$[1].conversation.session_2[0].dia_id", "duplicate 'D1:1'"),
        ((0, "qa", 3, "category"), "4", "$[0].qa[3].category", "expected an int, got string"),
        ((1, "qa", 0, "category"), True, "$[1].qa[0].category", "expected an int, got bool"),
        ((1, "qa", 3, "answer"), DELETE, "$[1].qa[3].answer", "missing"),
        ((0, "qa", 1, "answer"), ["Rex"], "$[0].qa[1].answer", "expected a string or a number, got list"),
        ((0, "qa", 0, "evidence"), "D1:2", "$[0].qa[0].evidence", "expected a list, got string"),
        ((0, "qa", 0, "evidence"), [12], "$[0].qa[0].evidence[0]", "expected a string, got int"),
        ((0, "qa"), DELETE, "$[0].qa", "missing"),
        (
            (0, "observation", "session_1_observation", "Ben", 0),
            ["Ben runs."],
            "$[0].observation.session_1_observation.Ben[0]",
            "expected a [fact, dia_id] pair",
        ),
        ((0, "observation", "session_3_observation"), {}, "$[0].observation.session_3_observation", "no session_3"),
        ((0, "observation", "summary"), {}, "$[0].observation.summary", "expected a key like 'session_1_observation'"),
    ],
)
def test_malformed_file_names_file_and_json_path(
    tmp_path: Path, keys: tuple[str | int, ...], value: Any, json_path: str, problem: str
) -> None:
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps(_edited(json.loads(FIXTURE.read_text()), keys, value)))
    with pytest.raises(DatasetFormatError) as caught:
        load_locomo(path)
    assert caught.value.json_path == json_path
    assert problem in caught.value.problem
    assert str(caught.value).startswith(f"{path}: {json_path}: ")


def test_invalid_json_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "locomo10.json"
    path.write_text('[\n  {"sample_id": "x",\n   "qa": [}\n]\n')
    with pytest.raises(DatasetFormatError, match=r"invalid JSON at line 3, column 11") as caught:
        load_locomo(path)
    assert str(caught.value).startswith(f"{path}: $: ")


# --- download ------------------------------------------------------------------------------------

PAYLOAD = b"hello locomo\n"
PAYLOAD_SHA256 = "43a3df94516c73c0fa224339362a722882f3a9d39007fc8c50b4d58df6d80386"  # sha256sum of PAYLOAD
OTHER_SHA256 = "0" * 64


def _unreachable_url() -> str:
    """An http URL on a loopback port nothing listens on: connecting is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/locomo10.json"


def test_download_from_file_url(tmp_path: Path) -> None:
    source = tmp_path / "source.json"
    source.write_bytes(PAYLOAD)
    target = tmp_path / "data" / "locomo10.json"
    assert ensure_file(target, source.as_uri(), PAYLOAD_SHA256, show_progress=False) == target
    assert target.read_bytes() == PAYLOAD
    assert sorted(p.name for p in target.parent.iterdir()) == ["locomo10.json"]


def test_download_with_wrong_checksum_leaves_nothing(tmp_path: Path) -> None:
    source = tmp_path / "source.json"
    source.write_bytes(PAYLOAD)
    target = tmp_path / "data" / "locomo10.json"
    with pytest.raises(ChecksumMismatchError) as caught:
        ensure_file(target, source.as_uri(), OTHER_SHA256, show_progress=False)
    assert (caught.value.expected, caught.value.actual) == (OTHER_SHA256, PAYLOAD_SHA256)
    assert list(target.parent.iterdir()) == []


def test_present_file_with_wrong_checksum_is_reported(tmp_path: Path) -> None:
    target = tmp_path / "locomo10.json"
    target.write_bytes(PAYLOAD)
    with pytest.raises(ChecksumMismatchError) as caught:
        ensure_file(target, _unreachable_url(), OTHER_SHA256, show_progress=False)
    message = str(caught.value)
    assert str(target) in message and OTHER_SHA256 in message and PAYLOAD_SHA256 in message
    assert target.read_bytes() == PAYLOAD


def test_present_file_with_right_checksum_needs_no_network(tmp_path: Path) -> None:
    target = tmp_path / "locomo10.json"
    target.write_bytes(PAYLOAD)
    assert ensure_file(target, _unreachable_url(), PAYLOAD_SHA256.upper(), show_progress=False) == target


def test_offline_download_says_where_to_put_the_file(tmp_path: Path) -> None:
    target = tmp_path / "data" / "locomo10.json"
    url = _unreachable_url()
    with pytest.raises(DownloadError) as caught:
        ensure_file(target, url, PAYLOAD_SHA256, show_progress=False)
    message = str(caught.value)
    assert f"could not download {url}" in message
    assert f"put it at {target} (sha256 {PAYLOAD_SHA256})" in message
    assert not target.exists() and list(target.parent.iterdir()) == []


# --- the data module -----------------------------------------------------------------------------


def test_default_locomo_path(tmp_path: Path) -> None:
    from memr1.datasets.locomo_file import default_locomo_path

    project = tmp_path / "main"
    project.mkdir()
    assert default_locomo_path(project) == project / "data" / "locomo10.json"
    shared = tmp_path / "shared" / "data" / "locomo10.json"
    shared.parent.mkdir(parents=True)
    shared.write_bytes(b"[]")
    assert default_locomo_path(project) == shared.resolve()


def test_data_module_downloads_parses_and_batches(tmp_path: Path) -> None:
    from memr1.data_modules.locomo import LoCoMoDataModule

    module = LoCoMoDataModule(
        path=tmp_path / "data" / "locomo10.json",
        url=FIXTURE.as_uri(),
        sha256=hashlib.sha256(FIXTURE.read_bytes()).hexdigest(),
        download=True,
        splits={"train": ["mini-1"], "validation": None, "test": []},
        batch_size=3,
    )
    module.prepare_data()
    module.setup("fit")
    assert module.conversations("train") == [MINI_1]
    assert module.questions("validation") == list(MINI_2.questions)
    assert module.questions("test") == []
    train_batches = list(module.train_dataloader())
    assert [len(batch) for batch in train_batches] == [3, 1]
    assert sorted(q.qid for batch in train_batches for q in batch) == [q.qid for q in MINI_1.questions]
    assert list(module.val_dataloader()) == [list(MINI_2.questions)]
    assert list(module.test_dataloader()) == []
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        module.questions("dev")


# ---- where the file comes from: data.path, data.download, data.sha256 --------------------------------


def test_a_missing_path_is_not_downloaded_unless_asked(tmp_path):
    from memr1.data_modules.locomo import LoCoMoDataModule

    missing = tmp_path / "typo" / "locomo10.json"
    with pytest.raises(FileNotFoundError, match=r"data.path=.*typo/locomo10.json: no such file.*data.download=true"):
        LoCoMoDataModule(path=missing).prepare_data()
    assert not missing.parent.exists()


def test_download_true_fetches_to_the_given_path_over_a_real_socket(tmp_path):
    import functools
    import http.server
    import threading

    from memr1.data_modules.locomo import LoCoMoDataModule
    from memr1.datasets.download import sha256_of

    served = tmp_path / "served"
    served.mkdir()
    (served / "locomo10.json").write_bytes(FIXTURE.read_bytes())
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        target = tmp_path / "data" / "locomo10.json"
        url = f"http://127.0.0.1:{server.server_address[1]}/locomo10.json"
        LoCoMoDataModule(path=target, url=url, sha256=sha256_of(FIXTURE), download=True).prepare_data()
    finally:
        server.shutdown()
    assert target.read_bytes() == FIXTURE.read_bytes()


def test_a_checksum_mismatch_says_how_to_use_ones_own_copy():
    from memr1.data_modules.locomo import LoCoMoDataModule
    from memr1.datasets.download import ChecksumMismatchError

    with pytest.raises(ChecksumMismatchError, match=r"data.sha256=null"):
        LoCoMoDataModule(path=FIXTURE, sha256="0" * 64).prepare_data()
    LoCoMoDataModule(path=FIXTURE, sha256=None).prepare_data()  # null: the file is used as it is
