"""The Responses API's store: bounded by count, bytes and age, the oldest evicted first, an
evicted id told apart, conversations followed link by link; in memory and in SQLite (which a
second store over the same directory reads back)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.api.response_store import ResponseStore, Stored
from kiln.database import FILE_NAME, SCHEMA_VERSION, open_database


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rec(rid: str, at: float, previous: str | None = None, text: str = "x") -> Stored:
    return Stored(rid, at, previous, {"id": rid, "output": [{"type": "message", "text": text}]},
                  [{"type": "message", "id": f"in_{rid}", "role": "user", "content": text}])


def stores(tmp_path: Path, clock: Clock, **bounds: float) -> list[ResponseStore]:
    limits = {"max_count": 3, "max_bytes": 10_000, "max_age_s": 60.0, **bounds}
    memory = ResponseStore(int(limits["max_count"]), int(limits["max_bytes"]),
                           limits["max_age_s"], clock=clock)
    sqlite = ResponseStore(int(limits["max_count"]), int(limits["max_bytes"]),
                           limits["max_age_s"], open_database(str(tmp_path)), clock=clock)
    return [memory, sqlite]


@pytest.mark.parametrize("kind", [0, 1], ids=["memory", "sqlite"])
def test_count_bound_evicts_the_oldest(tmp_path: Path, kind: int) -> None:
    clock = Clock()
    store = stores(tmp_path, clock)[kind]
    for i in range(4):
        assert store.put(rec(f"r{i}", clock.now + i))
    assert store.get("r0") is None and store.was_evicted("r0")
    assert [store.get(f"r{i}") is not None for i in range(1, 4)] == [True] * 3
    assert not store.was_evicted("never")


@pytest.mark.parametrize("kind", [0, 1], ids=["memory", "sqlite"])
def test_byte_bound(tmp_path: Path, kind: int) -> None:
    clock = Clock()
    one = len(rec("a0", 0).encode())
    store = stores(tmp_path, clock, max_count=100, max_bytes=2 * one + one // 2)[kind]
    for i in range(3):
        store.put(rec(f"a{i}", clock.now + i))
    assert store.get("a0") is None and store.get("a1") is not None and store.get("a2") is not None
    assert not store.put(rec("big", clock.now, text="y" * 100_000))  # alone over the bound
    assert store.get("big") is None and store.get("a2") is not None


@pytest.mark.parametrize("kind", [0, 1], ids=["memory", "sqlite"])
def test_age_bound(tmp_path: Path, kind: int) -> None:
    clock = Clock()
    store = stores(tmp_path, clock)[kind]
    store.put(rec("old", clock.now))
    clock.now += 30
    store.put(rec("new", clock.now))
    clock.now += 31  # "old" is 61 s old, "new" 31 s
    assert store.get("old") is None and store.was_evicted("old")
    assert store.get("new") is not None


@pytest.mark.parametrize("kind", [0, 1], ids=["memory", "sqlite"])
def test_chain_and_delete(tmp_path: Path, kind: int) -> None:
    clock = Clock()
    store = stores(tmp_path, clock)[kind]
    store.put(rec("a", clock.now))
    store.put(rec("b", clock.now + 1, "a"))
    store.put(rec("c", clock.now + 2, "b"))
    assert [r.id for r in store.chain("c")] == ["a", "b", "c"]
    assert store.delete("b") and not store.delete("b")
    with pytest.raises(KeyError) as missing:
        store.chain("c")
    assert missing.value.args[0] == "b"


def test_sqlite_survives_a_new_store(tmp_path: Path) -> None:
    clock = Clock()
    first = ResponseStore(10, 10_000, 60.0, open_database(str(tmp_path)), clock=clock)
    first.put(rec("kept", clock.now, text="héllo"))
    again = ResponseStore(10, 10_000, 60.0, open_database(str(tmp_path)), clock=clock)
    got = again.get("kept")
    assert got == rec("kept", clock.now, text="héllo")
    db = open_database(str(tmp_path))
    assert (tmp_path / FILE_NAME).exists()
    assert db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    db = open_database(str(tmp_path))
    db.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(RuntimeError, match="newer Kiln"):
        open_database(str(tmp_path))
