"""Column types and SQL expressions shared by the models and the queue.

Time comes from the database, not from the workers: leases, heartbeats and backoff compare
timestamps written by many machines, and the database clock is the one they all share.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Dialect, Float, bindparam
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import TypeDecorator

# JSON documents (specs, toolchains, signatures): JSONB on PostgreSQL, JSON text on SQLite.
JSONDocument = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend.

    PostgreSQL stores `timestamptz`. SQLite has no time zones: values are stored as naive UTC text in
    one fixed format (so that text order is time order) and come back aware.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class db_now(FunctionElement[datetime]):
    """The database's current time plus `offset_s` seconds, as a SQL expression.

    PostgreSQL: `statement_timestamp()` (the time the statement started, not the transaction).
    SQLite: `strftime(... 'now' ...)` padded to the microsecond format SQLAlchemy stores.
    """

    type = UTCDateTime()
    inherit_cache = True
    name = "db_now"

    def __init__(self, offset_s: float = 0.0) -> None:
        super().__init__(bindparam(None, float(offset_s), type_=Float(), unique=True))


@compiles(db_now, "postgresql")
def _db_now_postgresql(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    offset = compiler.process(element.clauses, **kw)
    return f"(statement_timestamp() + CAST({offset} AS DOUBLE PRECISION) * INTERVAL '1 second')"


@compiles(db_now, "sqlite")
def _db_now_sqlite(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    offset = compiler.process(element.clauses, **kw)
    return f"(strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.6f seconds', {offset})) || '000')"
