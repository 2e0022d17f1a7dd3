"""The HTTP API's tests of tests/unit/test_api.py that take `services`, on the real servers: SQLite with a
SeaweedFS S3 store, PostgreSQL with a local directory and with S3 (the unit tier runs SQLite with a local
directory). A test added there that takes `services` is imported here too."""

from __future__ import annotations

import pytest

from tests.support.twins import twins
from tests.unit import test_api

# Every test of the unit module that takes `services` (or the database and store under it), with its fixtures (tests/support/twins.py).
globals().update(twins(test_api, {"services", "db_url", "store_url"}))


@pytest.fixture(params=["sqlite-s3", "postgresql-local", "postgresql-s3"])
def backends(request: pytest.FixtureRequest) -> tuple[str, str]:
    database, store = request.param.split("-")
    return database, store


@pytest.fixture
def db_url(request: pytest.FixtureRequest, backends: tuple[str, str]) -> str:
    return request.getfixturevalue("sqlite_url" if backends[0] == "sqlite" else "pg_url")


@pytest.fixture
def store_url(request: pytest.FixtureRequest, backends: tuple[str, str], tmp_path) -> str:
    if backends[1] == "local":
        return str(tmp_path / "blobs")
    bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/warmup"
