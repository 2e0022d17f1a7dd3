"""The HTTP API's tests of tests/unit/test_api.py that take `services`, on the real servers: SQLite with a
SeaweedFS S3 store, PostgreSQL with a local directory and with S3 (the unit tier runs SQLite with a local
directory). A test added there that takes `services` is imported here too."""

from __future__ import annotations

import pytest

from tests.unit.test_api import (  # noqa: F401 (pytest collects what is imported)
    api,
    model_dir,
    services,
    test_a_job_is_found_by_a_prefix_of_its_id_that_only_it_has,
    test_client_library_against_a_live_server,
    test_concurrent_identical_submissions_make_one_job,
    test_coverage_misses_become_tasks,
    test_entries_are_reused_across_specs,
    test_health,
    test_invalid_spec_is_422_with_field_and_reason,
    test_jobs_that_were_refused_are_submitted_and_a_bad_peft_block_is_422,
    test_manifest_is_refused_until_every_blob_is_in_the_store,
    test_oversized_body_is_413,
    test_plan_lists_signatures_and_estimates,
    test_submit_is_idempotent_and_manifest_follows_the_work,
    test_toolchain_mismatch_names_the_fields,
    test_unknown_pool_and_wrong_backend_are_422,
)


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
