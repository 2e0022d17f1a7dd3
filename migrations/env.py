"""Alembic environment: the database URL comes from the caller, never from a file.

In order: a connection handed over in `config.attributes["connection"]` (warmup.db.migrate and the
tests), `-x url=...` on the command line, `sqlalchemy.url` set on the Config, or WARMUP_DATABASE_URL.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from alembic import context
from sqlalchemy import Connection

from warmup.db.columns import UTCDateTime
from warmup.db.engine import make_engine
from warmup.db.models import Base

config = context.config
target_metadata = Base.metadata


def database_url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    url = url or os.environ.get("WARMUP_DATABASE_URL")
    if not url:
        raise SystemExit(
            "no database URL: run `alembic -x url=postgresql://... upgrade head` or set WARMUP_DATABASE_URL"
        )
    return url


def render_item(type_: str, obj: Any, autogen_context: Any) -> str | Literal[False]:
    # Migrations must not import application types: render our UTC wrapper as the column it stores.
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,  # SQLite can only ALTER by copying the table
        compare_type=True,
        render_item=render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


def main() -> None:
    if context.is_offline_mode():
        context.configure(url=database_url(), target_metadata=target_metadata, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        run(connection)
        return
    engine = make_engine(database_url())
    try:
        with engine.connect() as connection:
            run(connection)
    finally:
        engine.dispose()


main()
