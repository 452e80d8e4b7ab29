"""Who a memory belongs to and what it is called: Mem0's user / agent / run ids as one scope string (the
store's partition key), the ids the service gives its memories, its times, and the names it reports
operations by."""

from __future__ import annotations

import math
import os
import re
import time
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from memr1.memory.records import MAX_SPEAKER_BYTES
from memr1.types import OpKind

SCOPE_KEYS = ("user_id", "agent_id", "run_id")
EVENTS = {OpKind.ADD: "ADD", OpKind.UPDATE: "UPDATE", OpKind.DELETE: "DELETE"}
# The service's collection of the store: beside the training banks' (memr1.memory.stores), never mixed
# with them (`Memory.reset` clears it whole).
SERVICE_COLLECTION = "memr1_service"
_UUID7 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
# Ids of memories written by the per-scope layout (before the shared collection), kept by its migration.
_LEGACY_ID = re.compile(r"scope_[0-9a-f]{24}\.m[0-9]+")


class MemoryNotFound(LookupError):
    """No memory has this id (HTTP 404)."""


def uuid7() -> str:
    """A version-7 UUID (RFC 9562): Unix milliseconds, then random bits; sorts by creation time. Drawn
    by whichever process writes: two replicas never give the same id."""
    millis = time.time_ns() // 1_000_000
    random = int.from_bytes(os.urandom(10), "big")  # 80 bits, 74 used
    value = (millis & (1 << 48) - 1) << 80 | 0x7 << 76 | (random >> 68) << 64 | 0b10 << 62 | random & (1 << 62) - 1
    return str(uuid.UUID(int=value))


def is_memory_id(memory_id: str) -> bool:
    """Whether `memory_id` has the shape of an id the service gives (or kept from the old layout)."""
    return isinstance(memory_id, str) and bool(_UUID7.fullmatch(memory_id) or _LEGACY_ID.fullmatch(memory_id))


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def from_unix(timestamp: int | float) -> str:
    """A Unix time in seconds (Mem0 2.x's `timestamp`) in `now()`'s format; a bad one is a ValueError."""
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)) or not math.isfinite(timestamp) or timestamp < 0:
        raise ValueError(f"timestamp: expected Unix seconds (a finite number >= 0), got {timestamp!r}")
    try:
        return datetime.fromtimestamp(timestamp, timezone.utc).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"timestamp: {timestamp!r} is out of the range of dates") from None


def dialogue_time(stamp: str) -> str:
    """A stored timestamp (`now()`'s format) as the agents were trained to read dates, LoCoMo's
    session time: "2023-05-08T13:56:00.000+00:00" -> "1:56 pm on 8 May, 2023" (in the stamp's own
    zone). Shown the ISO form, a trained agent copies its 29 characters into a "when" answer; a stamp
    in another format is shown as it is."""
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        return stamp
    meridiem = "am" if moment.hour < 12 else "pm"
    return f"{moment.hour % 12 or 12}:{moment.minute:02d} {meridiem} on {moment.day} {moment:%B}, {moment.year}"


def unix_of_dialogue_time(text: str) -> float:
    """LoCoMo's session time ("1:56 pm on 8 May, 2023", read as UTC) in Unix seconds, the `timestamp`
    that `Memory.add` takes: how a dataset's conversation is replayed into the service."""
    try:
        moment = datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y")
    except ValueError:
        raise ValueError(f"expected a session time like '1:56 pm on 8 May, 2023', got {text!r}") from None
    return moment.replace(tzinfo=timezone.utc).timestamp()


def scope_of(user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None, filters: Mapping[str, Any] | None = None) -> str:
    """The scope string of an id combination ("user_id=andrew"), Mem0's `filters` merged in."""
    ids = {"user_id": user_id, "agent_id": agent_id, "run_id": run_id}
    for key, value in (filters or {}).items():
        if key not in SCOPE_KEYS:
            raise ValueError(f"filters: unknown key {key!r}; expected some of {SCOPE_KEYS}")
        ids[key] = value
    parts = []
    for key in SCOPE_KEYS:
        value = ids[key]
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{key}: expected a non-empty string, got {value!r}")
        if "&" in value:  # "&" joins the scope string: user "andrew&agent_id=x" would be another scope
            raise ValueError(f"{key}: '&' is not allowed in an id (got {value[:64]!r})")
        parts.append(f"{key}={value.strip()}")
    if not parts:
        raise ValueError("at least one of user_id, agent_id, run_id is required")
    scope = "&".join(parts)
    size = len(scope.encode("utf-8", errors="replace"))
    if size > MAX_SPEAKER_BYTES:  # the bank's speaker field holds the scope: refused before any write
        named = ", ".join(key for key in SCOPE_KEYS if ids[key] is not None)
        raise ValueError(f"{named}: the scope they make ({size} UTF-8 bytes) is over the limit of {MAX_SPEAKER_BYTES}")
    return scope
