"""Engines for SQLite (the embedded default) and PostgreSQL (production).

Nothing here runs at import time: callers build an engine with `make_engine(url)` and pass it on.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

# How long a SQLite writer waits for another one before giving up (ms). Claims and completions are
# short transactions, so a long wait only happens under real overload.
SQLITE_BUSY_TIMEOUT_MS = 30_000
# How long opening a PostgreSQL connection may take (s). libpq waits forever by default: a server that
# accepts TCP but never answers (overloaded, half-failed-over) would hang every request and worker.
POSTGRES_CONNECT_TIMEOUT_S = 10


def normalize_url(url: str | URL) -> URL:
    """`postgresql://` and `postgres://` mean psycopg 3, the driver we ship."""
    parsed = make_url(url) if isinstance(url, str) else url
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise ValueError(
            f"unsupported database URL {parsed.render_as_string()!r}: use sqlite:/// or postgresql://"
        )
    return parsed


def make_engine(url: str | URL, **kwargs: Any) -> Engine:
    """An engine with the settings our queue relies on.

    SQLite: WAL (readers do not block the writer), a busy timeout, foreign keys on, and every
    transaction opened with BEGIN IMMEDIATE so that a read-then-write transaction can never fail
    with "database is locked" halfway through: writers queue up at BEGIN instead.
    PostgreSQL: psycopg 3 with pre-ping, so a server restart costs one reconnect, not an error,
    and a connect timeout, so a server that does not answer is an error, not a hang.
    """
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "postgresql":
        kwargs.setdefault("pool_pre_ping", True)
        if "connect_timeout" not in parsed.query:  # the URL's own ?connect_timeout= wins
            kwargs["connect_args"] = {
                "connect_timeout": POSTGRES_CONNECT_TIMEOUT_S,
                **kwargs.get("connect_args", {}),
            }
        # The queue's statements are written for READ COMMITTED (ON CONFLICT waits for the other
        # insert, SKIP LOCKED skips rows being claimed); do not inherit a server-wide default.
        kwargs.setdefault("isolation_level", "READ COMMITTED")
        return create_engine(parsed, **kwargs)

    database = parsed.database
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed, **kwargs)
    _configure_sqlite(engine)
    return engine


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide where transactions begin (see "begin").
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if engine.url.database not in (None, "", ":memory:"):
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """Sessions whose objects stay readable after commit (results outlive their transaction)."""
    return sessionmaker(engine, expire_on_commit=False)


def is_postgresql(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


def dialect_insert(session: Session, table: Any) -> Any:
    """An INSERT that supports ON CONFLICT (DO NOTHING / DO UPDATE) on the session's backend."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)
