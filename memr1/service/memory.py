"""`memr1.Memory`: the trained agents as a memory layer, with Mem0's call shapes.

    m = Memory("memories/", manager=text_model("runs/train/manager/policy/best"), answerer=...)
    m.add([{"role": "user", "content": "I adopted a dog named Buddy"}], user_id="andrew")
    m.search("pets", user_id="andrew")          # {"results": [{"id", "memory", "score", ...}]}
    m.answer("What are Andrew's dogs called?", user_id="andrew")

Each scope (user_id / agent_id / run_id, as Mem0) is one memr1 `MemoryBank` (a Milvus collection at
`uri`, Milvus Lite under `path` by default). `add` turns messages into facts (the extractor model, or
each message as it is), shows each fact its most similar memories and lets the Memory Manager choose
ADD / UPDATE / DELETE / NOOP (or ADDs everything when no Manager is configured). Deletes are soft and
every write is in the bank's revision log: `history` reads it and `restore` undoes a DELETE.

Thread safety: one lock per bank around every read and every retrieve -> decide -> apply, so a reader
never sees half an operation and two writers never decide on the same stale memories.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from memr1.agents.answer import AnswerAgent
from memr1.agents.extractor import FactExtractor
from memr1.agents.manager import ManagerAgent
from memr1.embed import Embedder
from memr1.memory import MemoryBank, MemoryBankError, UnknownMemoryError
from memr1.memory.records import MAX_TEXT_BYTES
from memr1.service.models import TextModel
from memr1.service.scopes import EVENTS, SCOPE_KEYS, MemoryNotFound, collection_of, from_unix, now, scope_of
from memr1.types import Fact, MemoryEntry, MemoryOp, OpKind, Turn


class Memory:
    """Mem0's `Memory` over memr1 banks, plus `answer` and `restore`."""

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
        k: int = 30,
        distill: bool = True,
        max_answer_words: int = 6,
        max_new_tokens: int = 256,
    ) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.uri = uri or str(self.path / "memories.db")
        self.embedder = embedder or Embedder()
        self.extractor, self.manager, self.answerer = extractor, manager, answerer
        self.num_candidates, self.k, self.max_new_tokens = num_candidates, k, max_new_tokens
        self.manager_agent = ManagerAgent()
        self.answer_agent = AnswerAgent(distill=distill, max_answer_words=max_answer_words)
        self.fact_extractor = FactExtractor()
        self._banks: dict[str, MemoryBank] = {}
        self._locks: dict[str, threading.RLock] = {}
        self._registry_lock = threading.Lock()
        self._db = sqlite3.connect(self.path / "service.sqlite", check_same_thread=False, isolation_level=None)
        self._db.execute("CREATE TABLE IF NOT EXISTS scopes (collection TEXT PRIMARY KEY, scope TEXT NOT NULL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS metadata (id TEXT PRIMARY KEY, metadata TEXT NOT NULL)")

    # -- banks ----------------------------------------------------------------------------------------
    @contextmanager
    def _bank(self, collection: str, create_scope: str | None = None) -> Iterator[MemoryBank]:
        """The bank of a collection, opened once, with its lock held. `create_scope` registers a new
        scope; without it an unknown collection is `MemoryNotFound`."""
        with self._registry_lock:
            if collection not in self._banks:
                known = self._db.execute("SELECT scope FROM scopes WHERE collection = ?", (collection,)).fetchone()
                if known is None:
                    if create_scope is None:
                        raise MemoryNotFound(f"no memories in collection {collection!r}")
                    self._db.execute("INSERT INTO scopes VALUES (?, ?)", (collection, create_scope))
                self._banks[collection] = MemoryBank.open(self.uri, collection, self.embedder)
                self._locks[collection] = threading.RLock()
            bank, lock = self._banks[collection], self._locks[collection]
        with lock:
            yield bank

    def _scope_bank(self, scope: str, create: bool = False) -> Any:
        return self._bank(collection_of(scope), create_scope=scope if create else None)

    def _locate(self, memory_id: str) -> tuple[str, str]:
        collection, dot, local = str(memory_id).rpartition(".")
        if not dot or not collection.startswith("scope_"):
            raise MemoryNotFound(f"memory id {memory_id!r}: not a memr1 memory id")
        return collection, local

    def _scope_of_collection(self, collection: str) -> str:
        row = self._db.execute("SELECT scope FROM scopes WHERE collection = ?", (collection,)).fetchone()
        return row[0] if row else ""

    # -- results --------------------------------------------------------------------------------------
    def _item(self, collection: str, entry: MemoryEntry, bank: MemoryBank) -> dict[str, Any]:
        history = bank.history(entry.id)
        memory_id = f"{collection}.{entry.id}"
        row = self._db.execute("SELECT metadata FROM metadata WHERE id = ?", (memory_id,)).fetchone()
        ids = dict(part.split("=", 1) for part in entry.speaker.split("&"))
        item = {
            "id": memory_id,
            "memory": entry.text,
            "hash": hashlib.md5(entry.text.encode()).hexdigest(),
            "metadata": json.loads(row[0]) if row else None,
            "created_at": history[0].timestamp if history else entry.timestamp,
            "updated_at": entry.timestamp,
            **{key: ids.get(key) for key in SCOPE_KEYS if key in ids},
        }
        if entry.score is not None:
            item["score"] = entry.score
        return item

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
        is. `timestamp` (Mem0 2.x: Unix seconds) dates the memories, default now. Returns
        `{"results": [{"id", "memory", "event", ("previous_memory")}]}`, NOOPs left out."""
        scope = scope_of(user_id, agent_id, run_id)
        turns = self._turns(messages, scope)
        stamp = now() if timestamp is None else from_unix(timestamp)
        facts = self._facts(turns, stamp) if infer else [Fact(t.text, scope, (t.dia_id,), 0, stamp) for t in turns]
        collection = collection_of(scope)
        results: list[dict[str, Any]] = []
        with self._scope_bank(scope, create=True) as bank:
            for fact in facts:
                op, previous = self._decide(bank, fact) if infer else (self._add_op(fact), None)
                try:
                    entry = bank.apply(op)
                except MemoryBankError as error:  # a well-parsed op the bank refuses: a NOOP
                    results.append({"id": None, "memory": fact.text, "event": "NONE", "error": str(error)})
                    continue
                if entry is None:
                    continue
                memory_id = f"{collection}.{entry.id}"
                if metadata and op.kind is OpKind.ADD:
                    self._db.execute("INSERT OR REPLACE INTO metadata VALUES (?, ?)", (memory_id, json.dumps(dict(metadata))))
                result = {"id": memory_id, "memory": entry.text, "event": EVENTS[op.kind]}
                if previous is not None:
                    result["previous_memory"] = previous
                results.append(result)
        return {"results": results}

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
        collection = collection_of(scope)
        try:
            with self._scope_bank(scope) as bank:
                hits = [e for e in bank.search(query, k=k) if threshold is None or (e.score or 0.0) >= threshold]
                return {"results": [self._item(collection, entry, bank) for entry in hits]}
        except MemoryNotFound:
            return {"results": []}

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
        collection = collection_of(scope)
        k = limit if limit is not None else top_k
        try:
            with self._scope_bank(scope) as bank:
                return {"results": [self._item(collection, entry, bank) for entry in bank.entries()[:k]]}
        except MemoryNotFound:
            return {"results": []}

    def get(self, memory_id: str) -> dict[str, Any] | None:
        """The live memory `memory_id`, or None (as Mem0)."""
        collection, local = self._locate(memory_id)
        try:
            with self._bank(collection) as bank:
                entry = next((e for e in bank.entries() if e.id == local), None)
                return self._item(collection, entry, bank) if entry else None
        except MemoryNotFound:
            return None

    def update(
        self, memory_id: str, data: str | None = None, *, text: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> dict[str, str]:
        """A new text (Mem0 1.x `data`, 2.x `text=`) and / or new metadata (2.x `metadata=`, replacing
        the old) for `memory_id`. Both are checked before either is written."""
        if data is not None and text is not None and data != text:
            raise ValueError("update: data and text are the same argument (Mem0 1.x and 2.x names); give one")
        new_text = text if text is not None else data
        if new_text is None and metadata is None:
            raise ValueError("update: give text (or data) and / or metadata")
        if new_text is not None and (not isinstance(new_text, str) or not new_text.strip()):
            raise ValueError("text: expected a non-empty string")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise ValueError(f"metadata: expected a mapping, got {type(metadata).__name__}")
        if new_text is not None:
            self._write(memory_id, MemoryOp(OpKind.UPDATE, text=new_text, timestamp=now()))
        elif self.get(memory_id) is None:
            raise MemoryNotFound(f"memory id {memory_id!r}: no such live memory")
        if metadata is not None:
            self._db.execute("INSERT OR REPLACE INTO metadata VALUES (?, ?)", (memory_id, json.dumps(dict(metadata))))
        return {"message": "Memory updated successfully!"}

    def delete(self, memory_id: str) -> dict[str, str]:
        """Soft delete: the memory leaves search and listings; `restore` brings it back."""
        self._write(memory_id, MemoryOp(OpKind.DELETE, timestamp=now()))
        return {"message": "Memory deleted successfully!"}

    def restore(self, memory_id: str) -> dict[str, Any]:
        """Undo a DELETE (memr1's addition to Mem0's calls)."""
        collection, local = self._locate(memory_id)
        with self._bank(collection) as bank:
            try:
                entry = bank.restore(local)
            except UnknownMemoryError as error:
                raise MemoryNotFound(str(error)) from None
            return self._item(collection, entry, bank)

    def delete_all(self, *, user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None) -> dict[str, str]:
        scope = scope_of(user_id, agent_id, run_id)
        try:
            with self._scope_bank(scope) as bank:
                for entry in bank.entries():
                    bank.apply(MemoryOp(OpKind.DELETE, target_id=entry.id, timestamp=now()))
        except MemoryNotFound:
            pass
        return {"message": "Memories deleted successfully!"}

    def history(self, memory_id: str) -> list[dict[str, Any]]:
        """Every write to `memory_id`, oldest first, in Mem0's history rows."""
        collection, local = self._locate(memory_id)
        with self._bank(collection) as bank:
            try:
                revisions = bank.history(local)
            except UnknownMemoryError as error:
                raise MemoryNotFound(str(error)) from None
        rows, previous = [], None
        for number, revision in enumerate(revisions):
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
        """Forget everything: every bank's collection and the metadata."""
        with self._registry_lock:
            for bank in self._banks.values():
                bank.close()
            collections = [row[0] for row in self._db.execute("SELECT collection FROM scopes")]
            self._banks.clear()
            self._locks.clear()
            if collections:
                from pymilvus import MilvusClient

                client = MilvusClient(uri=self.uri)
                try:
                    for collection in collections:
                        if client.has_collection(collection):
                            client.drop_collection(collection)
                finally:
                    client.close()
            self._db.execute("DELETE FROM scopes")
            self._db.execute("DELETE FROM metadata")

    # -- memr1's addition: answers --------------------------------------------------------------------
    def answer(self, question: str, *, user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None) -> dict[str, Any]:
        """The Answer Agent's short answer from the scope's `k` most relevant memories, with the
        memories it distilled (`memories_used`) and all it was shown (`memories`)."""
        if self.answerer is None:
            raise ValueError("no Answer Agent configured: Memory(answerer=...)")
        if not isinstance(question, str) or not question.strip():
            raise ValueError("question: expected a non-empty string")
        scope = scope_of(user_id, agent_id, run_id)
        try:
            with self._scope_bank(scope) as bank:
                entries = bank.search(question, k=self.k)
                shown = [self._item(collection_of(scope), entry, bank) for entry in entries]
        except MemoryNotFound:
            entries, shown = [], []
        speaker = scope.split("&")[0].split("=", 1)[1]  # "user_id=andrew&run_id=3" -> "andrew"
        prompt = self.answer_agent.build_messages(question, {speaker: entries})
        reply = self.answerer.complete([prompt], self.max_new_tokens)[0]
        parsed = self.answer_agent.parse(reply)
        used = [item for item in shown if any(item["memory"] in line for line in parsed.selected)]
        return {"answer": parsed.answer, "memories_used": used, "memories": shown, "format_error": parsed.format_error}

    def close(self) -> None:
        with self._registry_lock:
            for bank in self._banks.values():
                bank.close()
            self._banks.clear()
            self._db.close()

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

    @staticmethod
    def _add_op(fact: Fact) -> MemoryOp:
        return MemoryOp(OpKind.ADD, text=fact.text, speaker=fact.speaker, timestamp=fact.date_time, provenance=fact.dia_ids)

    def _decide(self, bank: MemoryBank, fact: Fact) -> tuple[MemoryOp, str | None]:
        """The Manager's op for `fact` given its similar memories (ADD when no Manager is configured),
        and the text an UPDATE replaces."""
        if self.manager is None:
            return self._add_op(fact), None
        candidates = bank.search(fact.text, k=self.num_candidates)
        reply = self.manager.complete([self.manager_agent.build_messages(fact, candidates)], 128)[0]
        op = self.manager_agent.parse(reply, fact, candidates)
        previous = next((c.text for c in candidates if c.id == op.target_id), None) if op.kind is OpKind.UPDATE else None
        return op, previous

    def _write(self, memory_id: str, op: MemoryOp) -> None:
        collection, local = self._locate(memory_id)
        with self._bank(collection) as bank:
            try:
                bank.apply(MemoryOp(op.kind, text=op.text, target_id=local, timestamp=op.timestamp))
            except UnknownMemoryError as error:
                raise MemoryNotFound(str(error)) from None
