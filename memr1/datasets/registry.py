"""What memr1 knows of a dataset (`DatasetSpec`), and the located-JSON reading its loaders share.

`data.kind` names a dataset: a module of `memr1.datasets` (`locomo`, `knowledge_update`, `longmemeval`,
`msc`) or, for one kept outside memr1, a dotted module path. The module defines `SPEC`, which
evaluation, training and `memr1 compare` read: its loader, what its question categories are called and
who says so, whether its conversations are split by id with evidence turns (LoCoMo's format, which RL
states need) or are a zero-shot test set. A module is imported only when its dataset is used.

Adding a dataset is its module (a loader and its `SPEC`) and a YAML in conf/data naming it.

`JsonNode` pairs a parsed JSON value with its file and JSON path, so each check of the LongMemEval and
MSC loaders fails with a `DatasetFormatError` naming where it failed, e.g.
``longmemeval_s.json: $[2].haystack_sessions[0][3].content: missing``.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memr1.datasets.errors import DatasetFormatError
from memr1.types import Conversation

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset, as the rest of memr1 sees it.

    title: how messages name it. load: `(path, **options) -> conversations`. categories: the name of
    each `Question.category`; categories_source: where those names come from (a mapping is a claim:
    say whose). locomo_format: LoCoMo's file layout, split by conversation id (`data.splits`), every
    question naming its evidence turns, so RL states can be built; otherwise a zero-shot test set.
    missing_file: what to do when `data.path` does not exist."""

    title: str
    load: Callable[..., list[Conversation]]
    categories: Mapping[int, str]
    categories_source: str
    locomo_format: bool
    missing_file: str


def dataset_spec(kind: str) -> DatasetSpec:
    """The `SPEC` of the dataset `kind` (a module of memr1.datasets, or a dotted module path)."""
    module_name = kind if "." in kind else f"memr1.datasets.{kind}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and module_name.startswith(error.name):  # the module itself, not one it imports
            shipped = ", ".join(sorted(("locomo", "knowledge_update", "longmemeval", "msc")))
            raise ValueError(f"data.kind: unknown {kind!r}; memr1's are {shipped}, or give a module path") from None
        raise
    spec = getattr(module, "SPEC", None)
    if not isinstance(spec, DatasetSpec):
        raise ValueError(f"data.kind={kind}: module {module_name} defines no SPEC (a memr1.datasets.registry.DatasetSpec)")
    return spec


def load_dataset(kind: str, path: str | Path, **kwargs: Any) -> list[Conversation]:
    """The conversations of the `kind` dataset file at `path`; `kwargs` go to its loader."""
    return dataset_spec(kind).load(path, **kwargs)


def category_names(kind: str) -> Mapping[int, str]:
    """The names of the `kind` dataset's question categories, keyed by `Question.category`."""
    return dataset_spec(kind).categories


# --- Located JSON -------------------------------------------------------------------------------


def json_type_name(value: object) -> str:
    """The JSON-ish name of a parsed value's type, for "expected X, got Y" messages."""
    names = {dict: "object", list: "list", str: "string", bool: "bool", int: "int", float: "float"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


@dataclass(frozen=True)
class JsonNode:
    """A parsed JSON value with the file it came from and its JSON path there (`$[2].dialog[0]`).

    The accessors check the value's type and raise `DatasetFormatError` naming file, path and problem.
    """

    file: Path
    path: str
    value: Any

    def error(self, problem: str) -> DatasetFormatError:
        return DatasetFormatError(self.file, self.path, problem)

    def child(self, key: str | int, value: Any) -> JsonNode:
        if isinstance(key, int):
            return JsonNode(self.file, f"{self.path}[{key}]", value)
        suffix = f".{key}" if _IDENTIFIER.fullmatch(key) else f"[{json.dumps(key)}]"
        return JsonNode(self.file, self.path + suffix, value)

    def has(self, key: str) -> bool:
        return key in self.as_object()

    def field(self, key: str) -> JsonNode:
        """The member `key` of this object; raises if this is no object or `key` is missing."""
        mapping = self.as_object()
        if key not in mapping:
            raise self.child(key, None).error("missing")
        return self.child(key, mapping[key])

    def as_object(self) -> dict[str, Any]:
        if not isinstance(self.value, dict):
            raise self.error(f"expected an object, got {json_type_name(self.value)}")
        return self.value

    def items(self) -> list[JsonNode]:
        """The elements of this list, each with its own path."""
        if not isinstance(self.value, list):
            raise self.error(f"expected a list, got {json_type_name(self.value)}")
        return [self.child(index, item) for index, item in enumerate(self.value)]

    def as_str(self, *, non_empty: bool = False) -> str:
        if not isinstance(self.value, str):
            raise self.error(f"expected a string, got {json_type_name(self.value)}")
        if non_empty and not self.value.strip():
            raise self.error("empty string")
        return self.value

    def as_answer(self) -> str:
        """A gold answer: a non-empty string or a number (datasets have `"answer": 3`), as a string."""
        if isinstance(self.value, bool) or not isinstance(self.value, (str, int, float)):
            raise self.error(f"expected a string or a number, got {json_type_name(self.value)}")
        text = str(self.value)
        if not text.strip():
            raise self.error("empty string")
        return text

    def as_bool(self) -> bool:
        if not isinstance(self.value, bool):
            raise self.error(f"expected a bool, got {json_type_name(self.value)}")
        return self.value

    def as_number(self) -> float:
        # bool is an int subclass, but `true` is never a count.
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            raise self.error(f"expected a number, got {json_type_name(self.value)}")
        return self.value


def read_json(path: str | Path) -> JsonNode:
    """The whole file parsed as one JSON document, at path `$`.

    Raises `DatasetFormatError` for text that is not UTF-8 or not JSON (with line and column),
    `FileNotFoundError` when the file is absent.
    """
    path = Path(path)
    text = _read_text(path)
    try:
        return JsonNode(path, "$", json.loads(text))
    except json.JSONDecodeError as error:
        raise DatasetFormatError(
            path, "$", f"invalid JSON at line {error.lineno}, column {error.colno}: {error.msg}"
        ) from error


def read_json_records(path: str | Path) -> list[JsonNode]:
    """The records of a file that is either one JSON list or JSON Lines (one object per line).

    A file whose first non-blank character is `[` is a JSON list: its items are at `$[i]`. Otherwise
    each non-blank line is a record at `line N: $`, so errors name the line to open. A file holding a
    single object (one line, or pretty-printed) is one record. Raises as `read_json` does, and for a
    file with no records.
    """
    path = Path(path)
    text = _read_text(path)
    if not text.strip():
        raise DatasetFormatError(path, "$", "empty file: no records")
    if text.lstrip().startswith("["):
        return read_json(path).items()
    try:
        return [JsonNode(path, "$", json.loads(text))]
    except json.JSONDecodeError:
        pass  # Not a single document: read it as JSON Lines, which locates errors by line.
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        root = f"line {number}: $"
        try:
            records.append(JsonNode(path, root, json.loads(line)))
        except json.JSONDecodeError as error:
            raise DatasetFormatError(
                path, root, f"invalid JSON at line {number}, column {error.colno}: {error.msg}"
            ) from error
    return records


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DatasetFormatError(path, "$", f"not UTF-8 text (byte {error.start})") from error

