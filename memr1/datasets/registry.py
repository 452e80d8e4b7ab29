"""One entry point for every supported dataset, and the located-JSON reading its loaders share.

`load_dataset(kind, path, **kwargs)` dispatches to the dataset's loader, imported lazily so that
loading one dataset never imports another's module. Every loader returns `list[Conversation]`, so the
memory pipeline and evaluation run on all of them unchanged; `category_names(kind)` names the integer
question categories for reports.

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
from typing import Any, Literal, get_args

from memr1.datasets.errors import DatasetFormatError
from memr1.types import Conversation

DatasetKind = Literal["locomo", "longmemeval", "msc"]
DATASET_KINDS: tuple[str, ...] = get_args(DatasetKind)

# kind -> (module, loader). Each module also defines CATEGORY_NAMES: {category: name}.
_LOADERS: Mapping[str, tuple[str, str]] = {
    "locomo": ("memr1.datasets.locomo", "load_locomo"),
    "longmemeval": ("memr1.datasets.longmemeval", "load_longmemeval"),
    "msc": ("memr1.datasets.msc", "load_msc"),
}

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def load_dataset(kind: DatasetKind, path: str | Path, **kwargs: Any) -> list[Conversation]:
    """The conversations of the `kind` dataset file at `path`; `kwargs` go to that dataset's loader.

    locomo: `load_locomo(path, exclude_categories=(5,))`; longmemeval: `load_longmemeval(path)`;
    msc: `load_msc(path, anchor=MSC_ANCHOR)`. Raises ValueError for an unknown `kind`.
    """
    module_name, loader_name = _entry(kind)
    loader: Callable[..., list[Conversation]] = getattr(importlib.import_module(module_name), loader_name)
    return loader(path, **kwargs)


def category_names(kind: DatasetKind) -> Mapping[int, str]:
    """The names of the `kind` dataset's question categories, keyed by `Question.category`."""
    module_name, _ = _entry(kind)
    return importlib.import_module(module_name).CATEGORY_NAMES


def _entry(kind: str) -> tuple[str, str]:
    # Imported on use: loading one dataset never imports another's module.
    if kind not in _LOADERS:
        raise ValueError(f"dataset kind: unknown {kind!r}; expected one of {', '.join(DATASET_KINDS)}")
    return _LOADERS[kind]


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

