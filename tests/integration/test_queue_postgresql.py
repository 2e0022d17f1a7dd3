"""The queue's tests of tests/unit/test_queue.py, every one that takes a database, on PostgreSQL (the unit
tier runs them on SQLite). A test added there that takes a database is imported here too."""

from __future__ import annotations

import pytest

from tests.unit.test_queue import (  # noqa: F401 (pytest collects what is imported)
    pytestmark,
    queue,
    repo,
    test_a_permanent_failure_skips_the_retries,
    test_a_stalled_task_on_its_last_attempt_fails,
    test_an_expired_lease_still_counts_until_someone_claims_the_task,
    test_claim_hands_out_signature_and_spec,
    test_complete_is_refused_after_the_lease_was_lost,
    test_complete_validates_the_files,
    test_concurrent_identical_submissions_make_one_job_threads,
    test_coverage_report_turns_missed_signatures_into_tasks,
    test_entries_for_a_manifest_and_their_last_use,
    test_failures_are_retried_with_backoff_then_fail_with_their_log,
    test_heartbeat_extends_the_lease_and_keeps_the_log,
    test_list_jobs_newest_first_with_counts,
    test_release_gives_the_task_back_without_counting_the_attempt,
    test_submit_is_idempotent_and_reuses_entries_across_specs,
    test_workers_register_and_pools_follow_the_newest_toolchain,
)


@pytest.fixture(params=["postgresql"])
def db_url(pg_url: str) -> str:
    return pg_url
