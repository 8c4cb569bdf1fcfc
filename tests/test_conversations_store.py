"""kiln.conversations: the same behaviour in memory and in SQLite; a database file of schema
version 1 (stored responses only) gains the conversations table when opened and keeps its
responses; the bound on the number of conversations."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kiln import conversations
from kiln.conversations import ConversationLimit, ConversationStore, is_id
from kiln.database import FILE_NAME, SCHEMA, SCHEMA_VERSION, open_database


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def stores(tmp_path: Path) -> list[ConversationStore]:
    return [ConversationStore(clock=Clock()),
            ConversationStore(open_database(str(tmp_path)), clock=Clock())]


def test_memory_and_sqlite_behave_alike(tmp_path: Path) -> None:
    seen = []
    for store in stores(tmp_path):
        a = store.create("A", [{"role": "user", "content": "hi"}], {"seed": 1})
        b = store.create()
        assert is_id(a.id) and is_id(b.id) and a.id != b.id
        assert b.title == conversations.DEFAULT_TITLE and b.messages == [] and b.settings == {}
        assert [s["id"] for s in store.summaries()] == [b.id, a.id]
        renamed = store.update(a.id, title="A2")
        assert renamed is not None and renamed.messages == a.messages
        assert renamed.settings == {"seed": 1} and renamed.updated_at > a.updated_at
        assert [s["id"] for s in store.summaries()] == [a.id, b.id]
        assert store.get(a.id) == renamed
        assert store.update("conv_" + "f" * 32, title="x") is None
        assert store.delete(b.id) and not store.delete(b.id) and store.get(b.id) is None
        seen.append([(s["title"], s["message_count"]) for s in store.summaries()])
    assert seen[0] == seen[1] == [("A2", 1)]
    assert [store.storage for store in stores(tmp_path / "again")] == ["memory", "sqlite"]


def test_a_version_1_file_is_migrated_and_keeps_its_responses(tmp_path: Path) -> None:
    conn = sqlite3.connect(str(tmp_path / FILE_NAME), isolation_level=None)
    for statement in SCHEMA[1]:
        conn.execute(statement)
    conn.execute("INSERT INTO responses VALUES ('resp_1', 1.0, NULL, 2, x'7b7d')")
    conn.execute("PRAGMA user_version = 1")
    conn.close()
    db = open_database(str(tmp_path))
    assert db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    assert db.conn.execute("SELECT id FROM responses").fetchall() == [("resp_1",)]
    store = ConversationStore(db)
    made = store.create("kept")
    assert ConversationStore(open_database(str(tmp_path))).get(made.id) == made


def test_the_number_of_conversations_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conversations, "MAX_CONVERSATIONS", 2)
    store = ConversationStore()
    first = store.create()
    store.create()
    with pytest.raises(ConversationLimit, match="at most 2"):
        store.create()
    store.delete(first.id)
    store.create()
