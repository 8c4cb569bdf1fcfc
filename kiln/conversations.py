"""The conversations the web page (/ui) keeps on the server: listed, created, read, renamed or
rewritten, deleted and exported through /v1/conversations (kiln/api/handlers/conversations.py).

In the SQLite database under ``--data-dir`` (kiln.database, shared with the stored responses)
when one is given, so that they survive a restart; else in memory for the server's lifetime.
A conversation is one row: its id, times, title, message count, and one encoded record (its
messages and the client's settings). The store knows nothing of HTTP: the handlers turn its
errors into the API's envelope."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import msgspec

from kiln.database import Database

MAX_CONVERSATIONS = 10_000  # per store: past it, creating one is refused until some are deleted
DEFAULT_TITLE = "New conversation"
ID_PREFIX = "conv_"

Storage = Literal["sqlite", "memory"]


class ConversationLimit(Exception):
    """The store holds ``MAX_CONVERSATIONS`` already."""


def new_id() -> str:
    return ID_PREFIX + secrets.token_hex(16)


def is_id(text: str) -> bool:
    """Whether ``text`` has the shape of a conversation id (contract: ConversationId)."""
    hexpart = text[len(ID_PREFIX):]
    return (text.startswith(ID_PREFIX) and len(hexpart) == 32
            and all(c in "0123456789abcdef" for c in hexpart))


@dataclass(frozen=True)
class Conversation:
    """One conversation; ``messages`` and ``settings`` are plain JSON values, as the contract's
    ConversationMessage and the client's free-form settings."""

    id: str
    title: str
    created_at: float
    updated_at: float
    messages: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    def record(self) -> bytes:
        return msgspec.json.encode({"messages": self.messages, "settings": self.settings})

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "object": "conversation", "title": self.title,
                "created_at": self.created_at, "updated_at": self.updated_at,
                "message_count": len(self.messages)}

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "object": "conversation", "title": self.title,
                "created_at": self.created_at, "updated_at": self.updated_at,
                "messages": self.messages, "settings": self.settings}

    def export(self) -> dict[str, Any]:
        """Chat format (role, content, reasoning_content where there was some), each message's
        meta beside it in ``records``."""
        messages, records = [], []
        for m in self.messages:
            out = {"role": m["role"], "content": m["content"]}
            if m.get("reasoning_content"):
                out["reasoning_content"] = m["reasoning_content"]
            messages.append(out)
            records.append(m.get("meta") or {})
        return {"object": "conversation.export", "id": self.id, "title": self.title,
                "created_at": self.created_at, "updated_at": self.updated_at,
                "messages": messages, "records": records}


def _from_row(row: tuple[Any, ...]) -> Conversation:
    rid, created, updated, title, _count, blob = row
    body = msgspec.json.decode(blob)
    return Conversation(str(rid), str(title), float(created), float(updated),
                        list(body.get("messages", [])), dict(body.get("settings", {})))


class _Memory:
    def __init__(self) -> None:
        self.rows: dict[str, Conversation] = {}

    def put(self, conv: Conversation) -> None:
        self.rows[conv.id] = conv

    def get(self, cid: str) -> Conversation | None:
        return self.rows.get(cid)

    def delete(self, cid: str) -> bool:
        return self.rows.pop(cid, None) is not None

    def count(self) -> int:
        return len(self.rows)

    def summaries(self) -> list[dict[str, Any]]:
        ordered = sorted(self.rows.values(), key=lambda c: (c.updated_at, c.id), reverse=True)
        return [c.summary() for c in ordered]


class _Sqlite:
    def __init__(self, db: Database) -> None:
        self.db = db

    def put(self, conv: Conversation) -> None:
        with self.db.lock:
            self.db.conn.execute(
                "INSERT OR REPLACE INTO conversations "
                "(id, created_at, updated_at, title, message_count, record) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (conv.id, conv.created_at, conv.updated_at, conv.title, len(conv.messages),
                 conv.record()))

    def get(self, cid: str) -> Conversation | None:
        with self.db.lock:
            row = self.db.conn.execute(
                "SELECT id, created_at, updated_at, title, message_count, record "
                "FROM conversations WHERE id = ?", (cid,)).fetchone()
        return None if row is None else _from_row(row)

    def delete(self, cid: str) -> bool:
        with self.db.lock:
            cur = self.db.conn.execute("DELETE FROM conversations WHERE id = ?", (cid,))
        return cur.rowcount > 0

    def count(self) -> int:
        with self.db.lock:
            return int(self.db.conn.execute("SELECT COUNT(*) FROM conversations").fetchone()[0])

    def summaries(self) -> list[dict[str, Any]]:
        with self.db.lock:
            rows = self.db.conn.execute(
                "SELECT id, created_at, updated_at, title, message_count FROM conversations "
                "ORDER BY updated_at DESC, id DESC").fetchall()
        return [{"id": r[0], "object": "conversation", "title": r[3], "created_at": r[1],
                 "updated_at": r[2], "message_count": r[4]} for r in rows]


class ConversationStore:
    """The conversations, in ``db`` when one is given, else in memory."""

    def __init__(self, db: Database | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.table: _Memory | _Sqlite = _Sqlite(db) if db is not None else _Memory()
        self.storage: Storage = "sqlite" if db is not None else "memory"
        self.clock = clock

    def summaries(self) -> list[dict[str, Any]]:
        """One summary per conversation, the most recently changed first."""
        return self.table.summaries()

    def create(self, title: str | None = None, messages: list[dict[str, Any]] | None = None,
               settings: dict[str, Any] | None = None) -> Conversation:
        if self.table.count() >= MAX_CONVERSATIONS:
            raise ConversationLimit(f"the server keeps at most {MAX_CONVERSATIONS} "
                                    "conversations; delete some first")
        now = self.clock()
        conv = Conversation(new_id(), title or DEFAULT_TITLE, now, now,
                            list(messages or []), dict(settings or {}))
        self.table.put(conv)
        return conv

    def get(self, cid: str) -> Conversation | None:
        return self.table.get(cid)

    def update(self, cid: str, *, title: str | None = None,
               messages: list[dict[str, Any]] | None = None,
               settings: dict[str, Any] | None = None) -> Conversation | None:
        """What is given replaces what was stored; None when there is no such conversation."""
        conv = self.table.get(cid)
        if conv is None:
            return None
        changed = replace(
            conv, updated_at=max(self.clock(), conv.updated_at),
            title=conv.title if title is None else title,
            messages=conv.messages if messages is None else list(messages),
            settings=conv.settings if settings is None else dict(settings))
        self.table.put(changed)
        return changed

    def delete(self, cid: str) -> bool:
        return self.table.delete(cid)
