"""SQLite connections for files that several threads and processes write at once (results stores,
the service's job queue): write-ahead logging, so readers never block the writer, and a busy
timeout instead of ``database is locked`` errors."""

from __future__ import annotations

import sqlite3
from pathlib import Path

BUSY_TIMEOUT_S = 60.0


def connect(path: Path) -> sqlite3.Connection:
    """A connection in autocommit mode (each statement is its own transaction), WAL journal,
    usable from any thread (callers serialise their use of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn
