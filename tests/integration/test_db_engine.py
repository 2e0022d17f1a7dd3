"""Engine settings and the database clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text

from warmup.db.columns import db_now
from warmup.db.engine import make_engine, normalize_url


def test_sqlite_settings(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 30_000
    engine.dispose()


def test_sqlite_file_directory_is_created(tmp_path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/data/sub/warmup.db")
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    assert (tmp_path / "data" / "sub" / "warmup.db").exists()
    engine.dispose()


def test_url_forms() -> None:
    assert normalize_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert normalize_url("postgres://u@h/db").drivername == "postgresql+psycopg"
    assert normalize_url("sqlite:///x.db").drivername == "sqlite"
    with pytest.raises(ValueError, match="unsupported database URL"):
        normalize_url("mysql://u@h/db")


def test_db_now_is_the_database_clock_in_utc(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        now, later, earlier = conn.execute(select(db_now(), db_now(90.5), db_now(-30))).one()
    engine.dispose()
    assert now.tzinfo is not None and abs(now - datetime.now(UTC)) < timedelta(minutes=5)
    assert (later - now).total_seconds() == pytest.approx(90.5, abs=0.01)
    assert (now - earlier).total_seconds() == pytest.approx(30, abs=0.01)
