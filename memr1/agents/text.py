"""Text helpers shared by the agents' prompts and parsers."""

from __future__ import annotations


def one_line(text: str) -> str:
    """Whitespace runs (newlines included) as one space: one memory is one line of a prompt."""
    return " ".join(text.split())
