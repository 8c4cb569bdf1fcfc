"""The Responses API's store: what `store: true` keeps (the response object, the request's input
items, the response it continued), bounded by count, bytes and age, so that a client can read a
response back (`GET /v1/responses/{id}`), list its input items, delete it, and continue a
conversation with `previous_response_id`.

In memory by default; in the SQLite database under `--data-dir` (kiln.database) when one is
given, so a conversation survives a restart. The oldest records go first when a bound is passed;
an id that was evicted is told apart from one never seen (while this process remembers it)."""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from kiln.config import ServerConfig
from kiln.database import Database

REMEMBERED_EVICTIONS = 4096  # evicted ids kept to say "evicted" rather than "unknown"
MAX_CHAIN = 10_000  # previous_response_id links followed at most (a loop guard)


@dataclass(frozen=True)
class Stored:
    """One stored response: its object, its own input items (with ids), the one it continued."""

    id: str
    created_at: float
    previous_id: str | None
    response: dict[str, Any]
    input_items: list[dict[str, Any]]

    def encode(self) -> bytes:
        return msgspec.json.encode({"response": self.response, "input_items": self.input_items})


def _decode(rid: str, created_at: float, previous_id: str | None, blob: bytes) -> Stored:
    body = msgspec.json.decode(blob)
    return Stored(rid, created_at, previous_id, body["response"], body["input_items"])


class _Memory:
    def __init__(self) -> None:
        self.rows: OrderedDict[str, tuple[Stored, int]] = OrderedDict()
        self.bytes = 0

    def put(self, rec: Stored, blob: bytes) -> None:
        self.delete(rec.id)
        self.rows[rec.id] = (rec, len(blob))
        self.bytes += len(blob)

    def get(self, rid: str) -> Stored | None:
        found = self.rows.get(rid)
        return found[0] if found else None

    def delete(self, rid: str) -> bool:
        found = self.rows.pop(rid, None)
        if found is None:
            return False
        self.bytes -= found[1]
        return True

    def totals(self) -> tuple[int, int]:
        return len(self.rows), self.bytes

    def oldest(self) -> tuple[str, float] | None:
        for rid, (rec, _) in self.rows.items():  # insertion order is age order
            return rid, rec.created_at
        return None


class _Sqlite:
    def __init__(self, db: Database) -> None:
        self.db = db

    def put(self, rec: Stored, blob: bytes) -> None:
        with self.db.lock:
            self.db.conn.execute(
                "INSERT OR REPLACE INTO responses (id, created_at, previous_id, size, record) "
                "VALUES (?, ?, ?, ?, ?)", (rec.id, rec.created_at, rec.previous_id, len(blob), blob))

    def get(self, rid: str) -> Stored | None:
        with self.db.lock:
            row = self.db.conn.execute(
                "SELECT id, created_at, previous_id, record FROM responses WHERE id = ?",
                (rid,)).fetchone()
        return None if row is None else _decode(row[0], row[1], row[2], row[3])

    def delete(self, rid: str) -> bool:
        with self.db.lock:
            cur = self.db.conn.execute("DELETE FROM responses WHERE id = ?", (rid,))
        return cur.rowcount > 0

    def totals(self) -> tuple[int, int]:
        with self.db.lock:
            count, size = self.db.conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM responses").fetchone()
        return int(count), int(size)

    def oldest(self) -> tuple[str, float] | None:
        with self.db.lock:
            row = self.db.conn.execute(
                "SELECT id, created_at FROM responses ORDER BY created_at, id LIMIT 1").fetchone()
        return None if row is None else (str(row[0]), float(row[1]))


class ResponseStore:
    """Bounded by ``max_count`` records, ``max_bytes`` of encoded records and ``max_age_s``."""

    def __init__(self, max_count: int, max_bytes: int, max_age_s: float,
                 db: Database | None = None, clock: Callable[[], float] = time.time) -> None:
        self.max_count, self.max_bytes, self.max_age_s = max_count, max_bytes, max_age_s
        self.table: _Memory | _Sqlite = _Sqlite(db) if db is not None else _Memory()
        self.clock = clock
        self.evicted: deque[str] = deque(maxlen=REMEMBERED_EVICTIONS)
        self.persistent = db is not None

    @classmethod
    def from_config(cls, config: ServerConfig, db: Database | None) -> ResponseStore:
        """The store of ``config``'s bounds, in ``db`` (the app's one database) when given."""
        return cls(config.responses_max_count, config.responses_max_mb * 1024 * 1024,
                   config.responses_max_age_s, db)

    def bounds(self) -> str:
        return (f"the store keeps at most {self.max_count} responses and "
                f"{self.max_bytes // (1024 * 1024)} MiB, each for {self.max_age_s:g} s")

    def put(self, rec: Stored) -> bool:
        """Store ``rec``; False (and nothing stored) when it alone is over the byte bound."""
        blob = rec.encode()
        if len(blob) > self.max_bytes:
            return False
        self.table.put(rec, blob)
        self._evict()
        return True

    def get(self, rid: str) -> Stored | None:
        self._evict()
        return self.table.get(rid)

    def delete(self, rid: str) -> bool:
        return self.table.delete(rid)

    def was_evicted(self, rid: str) -> bool:
        return rid in self.evicted

    def _evict(self) -> None:
        horizon = self.clock() - self.max_age_s
        while True:
            count, size = self.table.totals()
            oldest = self.table.oldest()
            if oldest is None:
                return
            if count <= self.max_count and size <= self.max_bytes and oldest[1] >= horizon:
                return
            self.table.delete(oldest[0])
            self.evicted.append(oldest[0])

    def chain(self, rid: str) -> list[Stored]:
        """The stored responses from the first of the conversation to ``rid``, oldest first;
        KeyError naming the first id that is not (or no longer) stored."""
        out: list[Stored] = []
        at: str | None = rid
        while at is not None:
            rec = self.get(at)
            if rec is None:
                raise KeyError(at)
            out.append(rec)
            if len(out) > MAX_CHAIN:
                raise KeyError(at)
            at = rec.previous_id
        out.reverse()
        return out
