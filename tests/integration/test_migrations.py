"""The migrations are the schema: they match the models, and go up, down and up again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from tests.fixtures.services import free_port
from warmup.db.engine import make_engine
from warmup.db.migrate import current_revision, downgrade, head_revision, upgrade
from warmup.db.models import Base
from warmup.errors import DatabaseError

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


def schema_diff(url: str) -> list:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            return compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrations_match_the_models(empty_db_url: str) -> None:
    upgrade(empty_db_url)
    assert current_revision(empty_db_url) == head_revision()
    assert schema_diff(empty_db_url) == []


def test_upgrade_downgrade_upgrade(empty_db_url: str) -> None:
    upgrade(empty_db_url)
    assert tables(empty_db_url) == set(Base.metadata.tables) | {"alembic_version"}
    downgrade(empty_db_url, "base")
    assert tables(empty_db_url) == {"alembic_version"}
    assert current_revision(empty_db_url) is None
    upgrade(empty_db_url)
    assert schema_diff(empty_db_url) == []
    upgrade(empty_db_url)  # at head already: nothing to do


def test_the_alembic_command_takes_the_url(empty_db_url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("WARMUP_DATABASE_URL", None)
    command = [sys.executable, "-m", "alembic", "-x", f"url={empty_db_url}", "upgrade", "head"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert current_revision(empty_db_url) == head_revision()

    no_url = subprocess.run(
        [*command[:3], "upgrade", "head"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert no_url.returncode != 0 and "no database URL" in no_url.stderr


def test_constraints_hold_on_both_backends(db_url: str) -> None:
    columns = "signature_key, toolchain_key, state, attempts, run_after, created_at, updated_at"
    t = "'2020-01-01'"
    engine = make_engine(db_url)
    try:
        with pytest.raises(IntegrityError), engine.begin() as conn:  # foreign keys are on (SQLite too)
            conn.execute(text(f"INSERT INTO tasks ({columns}) VALUES ('x', 'y', 'queued', 0, {t}, {t}, {t})"))
        with engine.begin() as conn:
            conn.execute(text(f"INSERT INTO signatures (key, data, created_at) VALUES ('s', '{{}}', {t})"))
            conn.execute(text(f"INSERT INTO toolchains (key, data, created_at) VALUES ('t', '{{}}', {t})"))
        with pytest.raises(IntegrityError), engine.begin() as conn:  # states are checked
            conn.execute(
                text(f"INSERT INTO tasks ({columns}) VALUES ('s', 't', 'exploded', 0, {t}, {t}, {t})")
            )
    finally:
        engine.dispose()


def test_upgrade_names_an_unreachable_database() -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(DatabaseError, match=f"127.0.0.1:{port}/nowhere"):
        upgrade(f"postgresql://postgres@127.0.0.1:{port}/nowhere")


def test_replicas_starting_together_migrate_one_at_a_time(pg_empty_url: str) -> None:
    """Four API replicas on an empty database at once: each upgrade succeeds, the schema is made once."""
    script = f"from warmup.db.migrate import upgrade; upgrade({pg_empty_url!r})"
    replicas = [
        subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True) for _ in range(4)
    ]
    errors = [replica.communicate(timeout=100)[1] for replica in replicas]
    assert [replica.returncode for replica in replicas] == [0, 0, 0, 0], errors
    assert current_revision(pg_empty_url) == head_revision()
    assert schema_diff(pg_empty_url) == []
