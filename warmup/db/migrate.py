"""Bring a database to the schema this code expects: `upgrade(url)` at server start-up.

The schema lives only in `migrations/` (Alembic), which `warmup/db/migrations` links to, so that the
wheel carries it as part of this package (a checkout, an editable install and a wheel all find it
here). It runs against the URL given, on the same engine settings the service uses (warmup.db.engine).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import OperationalError

from warmup.db.engine import make_engine
from warmup.errors import DatabaseError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
MIGRATION_LOCK_KEY = 0x7761726D7570  # "warmup": the advisory lock that serialises migrations


def alembic_config() -> Config:
    if not (MIGRATIONS / "env.py").is_file():
        raise DatabaseError(
            f"the database migrations are not at {MIGRATIONS}: this install of trl-warmup is incomplete; "
            "reinstall it (pip install --force-reinstall 'trl-warmup[server]')"
        )
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def upgrade(url: str | URL | Engine, revision: str = "head") -> None:
    """Migrate the database at `url` (or behind an engine) to `revision`."""
    _run(url, lambda config: command.upgrade(config, revision))


def downgrade(url: str | URL | Engine, revision: str) -> None:
    _run(url, lambda config: command.downgrade(config, revision))


def current_revision(url: str | URL | Engine) -> str | None:
    engine = url if isinstance(url, Engine) else make_engine(url)
    quiet = logging.getLogger("alembic.runtime.migration")  # its "Context impl" lines say nothing here
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        quiet.setLevel(level)
        if engine is not url:
            engine.dispose()


def require_migrated(url: str | URL) -> None:
    """Raise DatabaseError when the database at `url` was never migrated: a worker does not migrate (the
    service does, as it starts), and without the schema it would stop on a missing table. A database it
    cannot reach now is left to the worker, which waits out outages."""
    try:
        revision = current_revision(url)
    except OperationalError:
        return
    if revision is None:
        where = make_url(url).render_as_string(hide_password=True)
        raise DatabaseError(
            f"the database at {where} has no trl-warmup schema: start the service against it first "
            "(`warmup serve` migrates it as it starts), or check the URL"
        )


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def _run(url: str | URL | Engine, action: Callable[[Config], None]) -> None:
    config = alembic_config()
    engine = url if isinstance(url, Engine) else make_engine(url)
    try:
        with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                # API replicas starting together migrate one at a time: the others wait here, then
                # find the schema already at head (the lock goes with the transaction).
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            config.attributes["connection"] = connection
            action(config)
    except OperationalError as error:
        raise DatabaseError(
            f"cannot migrate the database at {engine.url.render_as_string(hide_password=True)}: "
            f"{error.orig or error}; check that it is running and that the URL is right"
        ) from error
    finally:
        if engine is not url:
            engine.dispose()
