"""The one place where values enter Milvus filter expressions.

A value is always written as a double-quoted string literal with every character that could end the
literal or start an escape escaped, so that no speaker name or text can close the literal and widen a
filter (`Bob" or speaker != "x`). Milvus (Go `strconv.Unquote`) and Milvus Lite (its own lexer) agree
on these escapes; a raw line break would make both reject the expression, hence its escape too.
"""

from __future__ import annotations

import re

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def string_literal(value: str) -> str:
    """`value` as a Milvus expression string literal that parses back to exactly `value`."""
    if not isinstance(value, str):
        raise TypeError(f"Milvus string literal: expected str, got {type(value).__name__}")
    return '"' + "".join(_ESCAPES.get(char, char) for char in value) + '"'


def field_equals(field: str, value: str) -> str:
    """The expression `field == "value"`, with `value` escaped."""
    if not _FIELD_NAME.fullmatch(field):
        raise ValueError(f"Milvus field name {field!r} is not an identifier")
    return f"{field} == {string_literal(value)}"
