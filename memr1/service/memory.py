"""`memr1.Memory`: the trained agents as a memory layer, with Mem0's call shapes.

    m = Memory("memories/", manager=text_model("runs/train/manager/policy/best"), answerer=...)
    m.add([{"role": "user", "content": "I adopted a dog named Buddy"}], user_id="andrew")
    m.search("pets", user_id="andrew")          # {"results": [{"id", "memory", "score", ...}]}
    m.answer("What are Andrew's dogs called?", user_id="andrew")

Each scope (user_id / agent_id / run_id, as Mem0) is a scope of the store the training banks use
(`memr1.memory.stores`; the service's own collection): Milvus Lite under `path` by default, or `uri`:
a Milvus server, which several `memr1 serve` replicas can share, Qdrant, or ":memory:". Memories are
the banks' records and change by the banks' rules (`memr1.memory.records`). `add` turns messages into
facts (the extractor model, or each message as it is), shows each fact its most similar memories and
lets the Memory Manager choose ADD / UPDATE / DELETE / NOOP (or ADDs everything when no Manager is
configured). Deletes are soft and every write is in the memory's revision history: `history` reads it
and `restore` undoes a DELETE. Memories kept by the layouts of earlier versions are moved in when
`path` is opened (`memr1.service.migrate`), with their ids.

Thread safety: a lock per scope (striped) around every retrieve -> decide -> write and every write by
id, so two requests of this process never decide on the same stale memories. Replicas do not share
locks: ADDs from several replicas never collide (each draws its own UUIDs), while two replicas
updating the same memory at the same moment keep the later write.
"""

from __future__ import annotations

import hashlib
import threading
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memr1.agents.answer import AnswerAgent
from memr1.agents.extractor import FactExtractor
from memr1.agents.manager import ManagerAgent
from memr1.banks.policies import add_op
from memr1.embed import Embedder
from memr1.memory.errors import MemoryBankError
from memr1.memory.records import MAX_TEXT_BYTES, StoredMemory, added, check_op, deleted, restored, updated, with_metadata
from memr1.memory.stores import open_store, resolve_store_uri
from memr1.service.migrate import migrate_earlier_layouts
from memr1.service.models import TextModel
from memr1.service.scopes import (
    EVENTS,
    SCOPE_KEYS,
    SERVICE_COLLECTION,
    MemoryNotFound,
    dialogue_time,
    from_unix,
    is_memory_id,
    now,
    scope_of,
    uuid7,
)
from memr1.types import Fact, MemoryEntry, MemoryOp, OpKind, Turn

SCOPE_LOCKS = 256  # stripes: a bounded set of locks however many scopes there are


class Memory:
    """Mem0's `Memory` over one collection of scoped memories, plus `answer` and `restore`."""

    def __init__(
        self,
        path: str | Path,
        *,
        uri: str | None = None,
        embedder: Embedder | None = None,
        extractor: TextModel | None = None,
        manager: TextModel | None = None,
        answerer: TextModel | None = None,
        num_candidates: int = 5,
        add_text: str = "fact",
        k: int = 30,
        distill: bool = True,
        max_answer_words: int = 6,
        max_new_tokens: int = 256,
    ) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.uri = resolve_store_uri(uri or self.path / "memories.db")
        self.embedder = embedder or Embedder()
        self.extractor, self.manager, self.answerer = extractor, manager, answerer
        self.num_candidates, self.k, self.max_new_tokens = num_candidates, k, max_new_tokens
        self.manager_agent = ManagerAgent(add_text)  # what the Manager's ADD stores (memr1.agents.manager)
        self.answer_agent = AnswerAgent(distill=distill, max_answer_words=max_answer_words)
        self.fact_extractor = FactExtractor()
        self.store = open_store(self.uri, self.embedder.dim, collection=SERVICE_COLLECTION)
        self._locks = [threading.RLock() for _ in range(SCOPE_LOCKS)]
        try:
            migrate_earlier_layouts(self.path, self.store)
        except BaseException:
            self.store.close()
            raise

    # -- scopes and ids -------------------------------------------------------------------------------
    def _lock(self, scope: str) -> threading.RLock:
        return self._locks[zlib.crc32(scope.encode()) % SCOPE_LOCKS]

    def record(self, memory_id: str) -> StoredMemory | None:
        """The memory `memory_id` as stored (deleted or not, any scope); None if there is none."""
        return self.store.get(memory_id) if is_memory_id(memory_id) else None

    def _stored(self, memory_id: str, live: bool = True) -> StoredMemory:
        """The memory `memory_id` (live, unless `live=False`); `MemoryNotFound` naming it otherwise."""
        memory = self.record(memory_id)
        if memory is None:
            raise MemoryNotFound(f"memory id {memory_id!r}: no such memory")
        if live and memory.deleted:
            raise MemoryNotFound(f"memory id {memory_id!r}: deleted (restore it first)")
        return memory

    def _embed(self, text: str) -> Any:
        return self.embedder.encode([text])[0]

    # -- results --------------------------------------------------------------------------------------
    @staticmethod
    def _item(memory: StoredMemory) -> dict[str, Any]:
        ids = dict(part.split("=", 1) for part in memory.scope.split("&"))
        text = memory.entry.text
        item = {
            "id": memory.id,
            "memory": text,
            "hash": hashlib.md5(text.encode()).hexdigest(),
            "metadata": memory.metadata,
            "created_at": memory.created_at,
            "updated_at": memory.entry.timestamp,
            **{key: ids.get(key) for key in SCOPE_KEYS if key in ids},
        }
        if memory.entry.score is not None:
            item["score"] = memory.entry.score
        return item

    @staticmethod
    def _entry(memory: StoredMemory) -> MemoryEntry:
        """A memory as the agents' prompts show it (the Manager by position, mapped back to `id`), dated
        as in their training data."""
        entry = memory.entry
        return MemoryEntry(entry.id, entry.text, memory.scope, dialogue_time(entry.timestamp), (), 0, 0, entry.score)

    def _search(self, scope: str, vector: Any, k: int) -> list[StoredMemory]:
        return self.store.search(vector[None, :], scope, None, k)[0]

    def _live(self, scope: str, with_vectors: bool = False) -> list[StoredMemory]:
        """The scope's live memories, oldest first (by creation time, then id)."""
        live = (memory for memory in self.store.rows(scope, with_vectors=with_vectors) if not memory.deleted)
        return sorted(live, key=lambda memory: (memory.created_at, memory.id))

    # -- Mem0's calls ---------------------------------------------------------------------------------
    def add(
        self,
        messages: str | Sequence[Mapping[str, str]],
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        infer: bool = True,
        timestamp: int | float | None = None,
    ) -> dict[str, Any]:
        """Remember what `messages` say. infer=True: facts (the extractor's, or each user message)
        each go to the Manager with their similar memories; infer=False: every message is ADDed as it
        is. `timestamp` (Mem0 2.x: Unix seconds) dates the memories, default now.

        Returns `{"results": [...]}`, one result per fact, saying what the Manager decided (Mem0's
        events, nothing left out): `{"id", "memory", "event", "fact"}` with `event` ADD, UPDATE (and
        `previous_memory`, the text it replaced), DELETE (`memory` is the deleted text) or NONE (`id`
        and `memory` name the memory judged equal, when the Manager named one). A fact is never lost
        in silence: when the Manager's reply does not parse, or names an operation that cannot be
        applied (an UPDATE of a memory deleted meanwhile), the fact is ADDed as told and the result's
        `reason` says why."""
        scope = scope_of(user_id, agent_id, run_id)
        turns = self._turns(messages, scope)
        stamp = now() if timestamp is None else from_unix(timestamp)
        facts = self._facts(turns, stamp) if infer else [Fact(t.text, scope, (t.dia_id,), 0, stamp) for t in turns]
        results: list[dict[str, Any]] = []
        with self._lock(scope):
            for fact in facts:
                vector = self._embed(fact.text)
                op, candidates = self._decide(scope, fact, vector) if infer else (add_op(fact), [])
                results.append(self._apply(scope, fact, vector, op, candidates, stamp, metadata))
        return {"results": results}

    def _apply(
        self,
        scope: str,
        fact: Fact,
        vector: Any,
        op: MemoryOp,
        candidates: Sequence[StoredMemory],
        stamp: str,
        metadata: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        """Write what `op` decided for `fact` (under the scope's lock) and say what happened."""
        reason = None
        if op.format_error is not None:
            reason = f"the Manager's reply did not parse ({op.format_error}); the fact was added as told"
        elif op.kind is OpKind.NOOP:
            equal = next((c for c in candidates if c.id == op.target_id), None)
            return {"id": equal and equal.id, "memory": equal.entry.text if equal else fact.text, "event": "NONE", "fact": fact.text}
        current = None
        if reason is None and op.kind is not OpKind.ADD:
            target = next((c for c in candidates if c.id == op.target_id), None)
            current = self.store.get(op.target_id, scope) if target is not None else None
            if current is None or current.deleted or current.scope != scope:
                reason = f"the Manager's {op.kind.value} names {op.target_id!r}, no live memory of this scope; the fact was added as told"
        try:
            if reason is not None:
                op = add_op(fact)
            check_op(op, "memories")
        except MemoryBankError as error:  # the Manager's UPDATE text over a memory's limit
            op, reason = add_op(fact), f"the Manager's {op.kind.value} was refused ({error}); the fact was added as told"
        if op.kind is OpKind.ADD:
            written = added(MemoryOp(OpKind.ADD, op.text, speaker=scope, timestamp=stamp), scope, uuid7(), 0, vector, metadata)
        elif op.kind is OpKind.UPDATE:
            change = MemoryOp(OpKind.UPDATE, op.text, target_id=current.id, timestamp=stamp)
            written = updated(current, change, len(current.history), self._embed(op.text))
        else:
            written = deleted(current, len(current.history), stamp)
        self.store.write([written])
        result = {"id": written.id, "memory": written.entry.text, "event": EVENTS[op.kind], "fact": fact.text}
        if op.kind is OpKind.UPDATE:
            result["previous_memory"] = current.entry.text
        if reason is not None:
            result["reason"] = reason
        return result

    def search(
        self,
        query: str,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        filters: Mapping[str, Any] | None = None,
        top_k: int = 20,
        limit: int | None = None,
        threshold: float | None = None,
    ) -> dict[str, Any]:
        """The `top_k` (Mem0 v1: `limit`) memories most similar to `query`, scores in [-1, 1]."""
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query: expected a non-empty string")
        k = limit if limit is not None else top_k
        if k < 1:
            raise ValueError(f"top_k: must be >= 1, got {k}")
        scope = scope_of(user_id, agent_id, run_id, filters)
        hits = [m for m in self._search(scope, self._embed(query), k) if threshold is None or (m.entry.score or 0.0) >= threshold]
        return {"results": [self._item(memory) for memory in hits]}

    def get_all(
        self,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        filters: Mapping[str, Any] | None = None,
        top_k: int = 100,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """The scope's live memories, oldest first."""
        scope = scope_of(user_id, agent_id, run_id, filters)
        k = limit if limit is not None else top_k
        return {"results": [self._item(memory) for memory in self._live(scope)[:k]]}

    def get(self, memory_id: str) -> dict[str, Any] | None:
        """The live memory `memory_id`, or None (as Mem0)."""
        memory = self.record(memory_id)
        return self._item(memory) if memory is not None and not memory.deleted else None

    def update(
        self, memory_id: str, data: str | None = None, *, text: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> dict[str, str]:
        """A new text (Mem0 1.x `data`, 2.x `text=`) and / or new metadata (2.x `metadata=`, replacing
        the old) for `memory_id`, written together. Both are checked before either is written."""
        if data is not None and text is not None and data != text:
            raise ValueError("update: data and text are the same argument (Mem0 1.x and 2.x names); give one")
        new_text = text if text is not None else data
        if new_text is None and metadata is None:
            raise ValueError("update: give text (or data) and / or metadata")
        if new_text is not None:
            if not isinstance(new_text, str) or not new_text.strip():
                raise ValueError("text: expected a non-empty string")
            size = len(new_text.encode("utf-8", errors="replace"))
            if size > MAX_TEXT_BYTES:
                raise ValueError(f"text: {size} UTF-8 bytes, over a memory's limit of {MAX_TEXT_BYTES}")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise ValueError(f"metadata: expected a mapping, got {type(metadata).__name__}")
        memory = self._stored(memory_id)
        with self._lock(memory.scope):
            memory = self._stored(memory_id)
            if new_text is not None:
                change = MemoryOp(OpKind.UPDATE, new_text, target_id=memory.id, timestamp=now())
                memory = updated(memory, change, len(memory.history), self._embed(new_text))
            if metadata is not None:
                memory = with_metadata(memory, metadata)
            self.store.write([memory])
        return {"message": "Memory updated successfully!"}

    def delete(self, memory_id: str) -> dict[str, str]:
        """Soft delete: the memory leaves search and listings; `restore` brings it back."""
        memory = self._stored(memory_id)
        with self._lock(memory.scope):
            current = self._stored(memory_id)
            self.store.write([deleted(current, len(current.history), now())])
        return {"message": "Memory deleted successfully!"}

    def restore(self, memory_id: str) -> dict[str, Any]:
        """Undo a DELETE (memr1's addition to Mem0's calls)."""
        memory = self._stored(memory_id, live=False)
        with self._lock(memory.scope):
            memory = self._stored(memory_id, live=False)
            if not memory.deleted:
                raise ValueError(f"restore of {memory_id!r}: the memory is not deleted")
            memory = restored(memory, len(memory.history), now())
            self.store.write([memory])
        return self._item(memory)

    def delete_all(self, *, user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None) -> dict[str, str]:
        scope = scope_of(user_id, agent_id, run_id)
        with self._lock(scope):
            when = now()
            self.store.write([deleted(memory, len(memory.history), when) for memory in self._live(scope, with_vectors=True)])
        return {"message": "Memories deleted successfully!"}

    def history(self, memory_id: str) -> list[dict[str, Any]]:
        """Every write to `memory_id`, oldest first, in Mem0's history rows."""
        memory = self._stored(memory_id, live=False)
        rows, previous = [], None
        for number, revision in enumerate(memory.history):
            rows.append({
                "id": f"{memory_id}#{number}",
                "memory_id": memory_id,
                "old_memory": previous,
                "new_memory": revision.text,
                "event": revision.action,
                "created_at": revision.timestamp,
                "updated_at": revision.timestamp,
                "is_deleted": revision.action == "DELETE",
            })
            previous = revision.text
        return rows

    def reset(self) -> None:
        """Forget everything: every scope's memories and metadata (for every replica of the store)."""
        self.store.clear()

    # -- memr1's addition: answers --------------------------------------------------------------------
    def answer(self, question: str, *, user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None) -> dict[str, Any]:
        """The Answer Agent's short answer from the scope's `k` most relevant memories, with the
        memories it distilled (`memories_used`) and all it was shown (`memories`)."""
        if self.answerer is None:
            raise ValueError("no Answer Agent configured: Memory(answerer=...)")
        if not isinstance(question, str) or not question.strip():
            raise ValueError("question: expected a non-empty string")
        scope = scope_of(user_id, agent_id, run_id)
        hits = self._search(scope, self._embed(question), self.k)
        entries, shown = [self._entry(memory) for memory in hits], [self._item(memory) for memory in hits]
        speaker = scope.split("&")[0].split("=", 1)[1]  # "user_id=andrew&run_id=3" -> "andrew"
        prompt = self.answer_agent.build_messages(question, {speaker: entries})
        reply = self.answerer.complete([prompt], self.max_new_tokens)[0]
        parsed = self.answer_agent.parse(reply)
        used = [item for item in shown if any(item["memory"] in line for line in parsed.selected)]
        return {"answer": parsed.answer, "memories_used": used, "memories": shown, "format_error": parsed.format_error}

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside add -----------------------------------------------------------------------------------
    @staticmethod
    def _turns(messages: str | Sequence[Mapping[str, str]], scope: str) -> list[Turn]:
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if not messages:
            raise ValueError("messages: empty; expected a string or a list of {role, content}")
        turns = []
        for index, message in enumerate(messages):
            content = message.get("content") if isinstance(message, Mapping) else None
            if not isinstance(content, str) or not content.strip():
                raise ValueError(f"messages[{index}].content: expected a non-empty string")
            size = len(content.strip().encode("utf-8", errors="replace"))
            if size > MAX_TEXT_BYTES:  # a memory's text field: refused before anything is written
                raise ValueError(f"messages[{index}].content: {size} UTF-8 bytes, over a memory's limit of {MAX_TEXT_BYTES}")
            role = str(message.get("role", "user"))
            speaker = scope if role == "user" else role
            turns.append(Turn(dia_id=f"M{index}", speaker=speaker, text=content.strip(), session=0, date_time=""))
        return turns

    def _facts(self, turns: Sequence[Turn], stamp: str) -> list[Fact]:
        """The facts about the scope's user in `turns`: the extractor's, or each user message."""
        users = [turn for turn in turns if not turn.speaker.startswith(("assistant", "system"))]
        if self.extractor is None:
            return [Fact(turn.text, turn.speaker, (turn.dia_id,), 0, stamp) for turn in users]
        prompts = [self.fact_extractor.build_messages(turn) for turn in users]
        replies = self.extractor.complete(prompts, 96)
        facts = [fact for turn, reply in zip(users, replies) for fact in self.fact_extractor.parse(reply, turn)]
        return [Fact(f.text, f.speaker, f.dia_ids, 0, stamp) for f in facts]

    def _decide(self, scope: str, fact: Fact, vector: Any) -> tuple[MemoryOp, list[StoredMemory]]:
        """The Manager's op for `fact` given the scope's memories most similar to it (`vector`), and
        those candidates (ADD, none, when no Manager is configured)."""
        if self.manager is None:
            return add_op(fact), []
        candidates = self._search(scope, vector, self.num_candidates)
        entries = [self._entry(memory) for memory in candidates]
        reply = self.manager.complete([self.manager_agent.build_messages(fact, entries)], 128)[0]
        return self.manager_agent.parse(reply, fact, entries), candidates
