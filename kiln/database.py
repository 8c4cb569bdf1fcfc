"""Kiln's SQLite database under ``--data-dir``: the one place that opens the file and owns its
schema. Every table Kiln keeps on disk is declared in ``SCHEMA`` here, so that the stored
responses (kiln.api.response_store), /ui's conversations (kiln.conversations) and any later
record of what was served share one file, one setting and one migration story. The app opens it
once (kiln.api.state) and hands it to every store. SQLite (the standard library's) is the
maintained engine for this; WAL mode lets a reader run beside the one writer."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

FILE_NAME = "kiln.sqlite3"
SCHEMA_VERSION = 2

# version -> the statements that bring the file from the version before to it
SCHEMA: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE responses (
               id TEXT PRIMARY KEY,
               created_at REAL NOT NULL,
               previous_id TEXT,
               size INTEGER NOT NULL,
               record BLOB NOT NULL
           )""",
        "CREATE INDEX responses_by_age ON responses (created_at)",
    ),
    2: (  # the conversations of /ui (kiln.conversations)
        """CREATE TABLE conversations (
               id TEXT PRIMARY KEY,
               created_at REAL NOT NULL,
               updated_at REAL NOT NULL,
               title TEXT NOT NULL,
               message_count INTEGER NOT NULL,
               record BLOB NOT NULL
           )""",
        "CREATE INDEX conversations_by_change ON conversations (updated_at)",
    ),
}


class Database:
    """One connection to the file, used under one lock (each use is a few small statements)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self._migrate()

    def _migrate(self) -> None:
        with self.lock:
            version = int(self.conn.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise RuntimeError(f"{self.path} has schema version {version}; this Kiln knows "
                                   f"{SCHEMA_VERSION} (a newer Kiln wrote it)")
            for v in range(version + 1, SCHEMA_VERSION + 1):
                self.conn.execute("BEGIN")
                for statement in SCHEMA[v]:
                    self.conn.execute(statement)
                self.conn.execute(f"PRAGMA user_version = {v}")
                self.conn.execute("COMMIT")

    def close(self) -> None:
        with self.lock:
            self.conn.close()


def open_database(data_dir: str) -> Database:
    """The database in ``data_dir`` (created, with the directory, when absent)."""
    folder = Path(data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return Database(folder / FILE_NAME)
