"""A SQLite file used the way MGit uses its catalog and its checks: one connection per
thread, WAL so that readers run beside a writer, every write one transaction that rolls
back on any exception, and named schema migrations, each recorded in the transaction that
applies it (as sqlite-utils does)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mgit.errors import StorageFullError

Migrations = list[tuple[str, list[str]]]


class Database:
    def __init__(self, path: Path, migrations: Migrations, *, synchronous: str = "FULL") -> None:
        self.path = path
        self._migrations = migrations
        self._synchronous = synchronous
        self._local = threading.local()
        self.migrate()

    @property
    def db(self) -> sqlite3.Connection:
        # One connection per thread: sqlite3 connections must not be shared across threads.
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            conn.execute("PRAGMA busy_timeout=60000")
            self._local.conn = conn
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    @contextmanager
    def atomic(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE takes the write lock up front, so two
        writers queue instead of failing on upgrade); rolled back on any exception."""
        db = self.db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if "full" in str(exc):  # SQLITE_FULL: "database or disk is full"
                raise StorageFullError(str(self.path)) from None
            raise

    def migrate(self) -> list[str]:
        """Apply the migrations not applied yet, each with its record in one transaction."""
        self.db.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
        applied = []
        for name, statements in self._migrations:
            with self.atomic() as tx:
                if tx.execute("SELECT 1 FROM migrations WHERE name = ?", (name,)).fetchone():
                    continue
                for sql in statements:
                    tx.execute(sql)
                tx.execute("INSERT INTO migrations VALUES (?, datetime('now'))", (name,))
                applied.append(name)
        return applied
