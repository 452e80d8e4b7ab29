"""Find and read the first JSON object in a small model's free-form output.

Models wrap JSON in ``` fences, put chatter before and after it, and drift towards Python literals.
The reader accepts what has one obvious meaning -- text around the object, single-quoted strings,
trailing commas, Python's True / False / None, raw newlines inside strings -- and rejects everything
else: unquoted keys, comments, missing commas, NaN, and any object cut short by the end of the text.
"""

from __future__ import annotations

import json
import re
from typing import Any

# Depth beyond any real answer; it bounds the recursion of the reader on adversarial input.
MAX_DEPTH = 32
# Brace positions tried before giving up: each failed attempt costs a scan, and real outputs put
# their object within the first few braces.
MAX_ATTEMPTS = 16

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}
_LITERAL = re.compile("|".join(sorted(_LITERALS, key=len, reverse=True)))


class JSONTruncated(ValueError):
    """The text ended inside a value: the model's output was cut short."""


class JSONInvalid(ValueError):
    """The text is not (lenient) JSON at `position`."""

    def __init__(self, message: str, position: int) -> None:
        self.position = position
        super().__init__(f"{message} at character {position}")


def find_json_object(text: str) -> dict[str, Any]:
    """The first complete JSON object in `text`, read leniently.

    Scans the `{` characters from the left. After an attempt fails on a bad character, scanning
    resumes *after* that character: braces in chatter (`{note}`) and an unreadable head
    (`{memory: [{...}]}`) are skipped, but an object that comes before the break inside a broken one
    is never taken for the answer. An attempt that runs into the end of the text stops the search:
    the output was truncated, and any later brace could only be nested in it.

    Raises:
        JSONTruncated: the first object that does not fail on a bad character is cut short.
        JSONInvalid: no `{` starts a readable object.
    """
    start = text.find("{")
    if start < 0:
        raise JSONInvalid("no '{' in the text", 0)
    for _ in range(MAX_ATTEMPTS):
        try:
            value, _end = _Reader(text).value(start, depth=0)
        except JSONInvalid as error:
            start = text.find("{", max(error.position, start) + 1)
            if start < 0:
                raise
            continue
        return value
    raise JSONInvalid(f"no readable object in the first {MAX_ATTEMPTS} '{{'", start)


class _Reader:
    """A recursive-descent reader over one string; each method returns (value, next position)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def value(self, position: int, depth: int) -> tuple[Any, int]:
        if depth > MAX_DEPTH:
            raise JSONInvalid(f"nesting deeper than {MAX_DEPTH}", position)
        position = self._skip_space(position)
        char = self._char(position)
        if char == "{":
            return self._object(position + 1, depth + 1)
        if char == "[":
            return self._array(position + 1, depth + 1)
        if char in "\"'":
            return self._string(position)
        literal = _LITERAL.match(self.text, position)
        if literal:
            return _LITERALS[literal.group()], literal.end()
        number = _NUMBER.match(self.text, position)
        if number:
            return self._number(number, position)
        raise JSONInvalid(f"unexpected {char!r}", position)

    def _object(self, position: int, depth: int) -> tuple[dict[str, Any], int]:
        result: dict[str, Any] = {}
        while True:
            position = self._skip_space(position)
            char = self._char(position)
            if char == "}":
                return result, position + 1
            if char not in "\"'":
                raise JSONInvalid(f"expected a quoted key, got {char!r}", position)
            key, position = self._string(position)
            position = self._skip_space(position)
            if self._char(position) != ":":
                raise JSONInvalid(f"expected ':' after key {key!r}", position)
            result[key], position = self.value(position + 1, depth)
            position = self._after_item(position, "}")

    def _array(self, position: int, depth: int) -> tuple[list[Any], int]:
        result: list[Any] = []
        while True:
            position = self._skip_space(position)
            if self._char(position) == "]":
                return result, position + 1
            item, position = self.value(position, depth)
            result.append(item)
            position = self._after_item(position, "]")

    def _after_item(self, position: int, closer: str) -> int:
        """Past the comma after an item, or at the closer (so a trailing comma is fine)."""
        position = self._skip_space(position)
        char = self._char(position)
        if char == ",":
            return position + 1
        if char == closer:
            return position
        raise JSONInvalid(f"expected ',' or {closer!r}, got {char!r}", position)

    def _string(self, position: int) -> tuple[str, int]:
        quote = self.text[position]
        cursor = position + 1
        while True:
            char = self._char(cursor)
            if char == "\\":
                self._char(cursor + 1)
                cursor += 2
            elif char == quote:
                break
            else:
                cursor += 1
        body = self.text[position + 1 : cursor]
        if quote == "'":
            # Re-quote as JSON: \' becomes ', and a bare " must be escaped. A backslash pair (\\) is
            # kept whole first, so that "\\'" is an escaped backslash followed by the closing quote.
            body = re.sub(r"\\(.)|\"", _requote, body, flags=re.DOTALL)
        try:
            return json.loads(f'"{body}"', strict=False), cursor + 1
        except json.JSONDecodeError as error:
            raise JSONInvalid(
                f"bad string escape ({error.msg})", position + 1 + error.pos
            ) from None

    def _number(self, match: re.Match[str], position: int) -> tuple[int | float, int]:
        try:
            return json.loads(match.group()), match.end()
        except ValueError:  # Python refuses ints of more than 4300 digits
            raise JSONInvalid("number too large", position) from None

    def _skip_space(self, position: int) -> int:
        while position < len(self.text) and self.text[position] in " \t\r\n":
            position += 1
        return position

    def _char(self, position: int) -> str:
        if position >= len(self.text):
            raise JSONTruncated("the text ends inside a JSON value")
        return self.text[position]


def _requote(match: re.Match[str]) -> str:
    escaped = match.group(1)
    if escaped is None:
        return '\\"'
    return "'" if escaped == "'" else "\\" + escaped
