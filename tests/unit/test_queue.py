"""The task queue on SQLite, in this process. tests/integration/test_queue_postgresql.py runs the same tests
on PostgreSQL, and tests/integration/test_queue_processes.py runs the queue with worker processes."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from sqlalchemy import Engine, func, select, update

from tests.fixtures import factories
from warmup.db import models as m
from warmup.db.columns import db_now
from warmup.db.queue import RetryStrategy, TaskQueue
from warmup.db.records import FileRef
from warmup.db.repository import Repository
from warmup.errors import JobNotFoundError, LeaseLostError, UnsafeArtifactError

pytestmark = pytest.mark.timeout(180)

TOOLCHAIN = factories.toolchain()


@pytest.fixture
def queue(db_engine: Engine) -> TaskQueue:
    return TaskQueue(db_engine, retry=RetryStrategy(max_attempts=3, base_delay_s=60, factor=2))


@pytest.fixture
def repo(db_engine: Engine) -> Repository:
    return Repository(db_engine)


def submit(queue: TaskQueue, count: int = 3, **kwargs):
    return queue.submit_job(factories.spec(), TOOLCHAIN, factories.signatures(count), **kwargs)


def travel(engine: Engine, column, seconds: float, **where) -> None:
    """Move a task timestamp to `seconds` from now (negative: the past), instead of sleeping."""
    with engine.begin() as conn:
        conn.execute(update(m.Task).filter_by(**where).values({column: db_now(seconds)}))


def task_row(engine: Engine, task_id: int) -> m.Task:
    with engine.connect() as conn:
        return conn.execute(select(m.Task).where(m.Task.id == task_id)).one()


def count(engine: Engine, model) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(model)).scalar_one()


# --- submission --------------------------------------------------------------------------------


def test_submit_is_idempotent_and_reuses_entries_across_specs(queue: TaskQueue, repo: Repository) -> None:
    sigs = factories.signatures(3)
    first = queue.submit_job(factories.spec(), TOOLCHAIN, sigs, warnings=["eval shapes unknown"])
    assert first.created and first.reused == 0
    assert first.enqueued == sorted(s.key for s in sigs)

    again = queue.submit_job(factories.spec(), TOOLCHAIN, sigs)
    assert (again.job_id, again.created, again.enqueued) == (first.job_id, False, [])

    task = queue.claim("w1", TOOLCHAIN.key, lease_s=60)
    assert task is not None
    queue.complete(task.id, "w1", factories.fake_files(task.id), compile_seconds=1.0)

    # Another spec needing two of those signatures and a new one: the entry is reused, the queued
    # task is shared, only the new signature gets a task.
    new_sig = factories.signatures(1, batch=8)[0]
    shared = next(s for s in sigs if s.key != task.signature_key)
    done_sig = next(s for s in sigs if s.key == task.signature_key)
    other = queue.submit_job(factories.spec(max_length=1024), TOOLCHAIN, [done_sig, shared, new_sig])
    assert other.created and other.job_id != first.job_id
    assert other.reused == 1
    assert other.enqueued == [new_sig.key]
    assert count(queue.engine, m.Task) == 4

    status = repo.job_status(other.job_id)
    assert status is not None
    assert status.counts == {"ready": 1, "queued": 2}
    assert status.state == "queued"
    assert repo.job_status(first.job_id).warnings == ["eval shapes unknown"]

    # The same spec under another toolchain is another job with its own tasks.
    elsewhere = queue.submit_job(factories.spec(), factories.toolchain("trn2"), sigs)
    assert elsewhere.created and len(elsewhere.enqueued) == 3
    assert repo.find_job(factories.spec().key, TOOLCHAIN.key) == first.job_id


def test_claim_hands_out_signature_and_spec(queue: TaskQueue) -> None:
    result = submit(queue, 1)
    assert queue.claim("w1", factories.toolchain("other").key, lease_s=60) is None

    task = queue.claim("w1", TOOLCHAIN.key, lease_s=60)
    assert task is not None
    assert task.signature == factories.signatures(1)[0].data
    assert task.spec == factories.spec()
    assert task.attempts == 1
    assert task.signature_key == result.enqueued[0]
    assert queue.claim("w2", TOOLCHAIN.key, lease_s=60) is None  # the only task is leased


@pytest.mark.parametrize("threads", [8])
def test_concurrent_identical_submissions_make_one_job_threads(db_url: str, threads: int) -> None:
    from warmup.db.engine import make_engine

    engine = make_engine(db_url)
    queue = TaskQueue(engine)
    barrier = threading.Barrier(threads)
    results: list = []

    def run() -> None:
        barrier.wait(timeout=30)
        results.append(queue.submit_job(factories.spec(), TOOLCHAIN, factories.signatures(10)))

    pool = [threading.Thread(target=run) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=60)

    assert len(results) == threads
    assert len({r.job_id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert sorted(k for r in results for k in r.enqueued) == sorted(s.key for s in factories.signatures(10))
    assert count(engine, m.Job) == 1
    assert count(engine, m.Task) == 10
    engine.dispose()


# --- claiming with many workers ----------------------------------------------------------------


# --- leases ------------------------------------------------------------------------------------


def test_complete_is_refused_after_the_lease_was_lost(queue: TaskQueue, repo: Repository) -> None:
    result = submit(queue, 1)
    first = queue.claim("a", TOOLCHAIN.key, lease_s=60)
    travel(queue.engine, "lease_expires_at", -1, id=first.id)  # a stopped heartbeating
    stalled = repo.job_status(result.job_id).signatures[0]
    assert stalled.state == "running" and stalled.stalled and stalled.lease_owner == "a"
    second = queue.claim("b", TOOLCHAIN.key, lease_s=60)
    assert second is not None and second.id == first.id and second.attempts == 2

    stale_files = factories.fake_files(first.id)
    with pytest.raises(LeaseLostError, match="'a' no longer holds the lease"):
        queue.complete(first.id, "a", stale_files, compile_seconds=1.0)
    for refused in (
        lambda: queue.heartbeat(first.id, "a", lease_s=60),
        lambda: queue.fail(first.id, "a", "late error"),
        lambda: queue.release(first.id, "a"),
    ):
        with pytest.raises(LeaseLostError):
            refused()
    assert repo.entries_for([first.signature_key], TOOLCHAIN.key) == {}
    running = repo.job_status(result.job_id).signatures[0]
    assert running.state == "running" and not running.stalled and running.lease_owner == "b"

    files = [FileRef(path="b/graph.bin", sha256="b" * 64, size=7)]
    queue.complete(second.id, "b", files, compile_seconds=2.0)
    entry = repo.entries_for([first.signature_key], TOOLCHAIN.key)[first.signature_key]
    assert entry.files == files and entry.compile_seconds == 2.0
    with pytest.raises(LeaseLostError):  # done: nobody holds it any more
        queue.complete(second.id, "b", files, compile_seconds=2.0)


def test_an_expired_lease_still_counts_until_someone_claims_the_task(
    queue: TaskQueue, repo: Repository
) -> None:
    submit(queue, 1)
    task = queue.claim("slow", TOOLCHAIN.key, lease_s=60)
    travel(queue.engine, "lease_expires_at", -1, id=task.id)
    queue.complete(task.id, "slow", factories.fake_files(task.id), compile_seconds=1.0)
    assert task.signature_key in repo.entries_for([task.signature_key], TOOLCHAIN.key)
    assert queue.claim("other", TOOLCHAIN.key, lease_s=60) is None


def test_a_dead_workers_lease_ends_at_once_and_only_its_own(queue: TaskQueue) -> None:
    submit(queue, 2)
    killed = queue.claim("killed", TOOLCHAIN.key, lease_s=600)
    live = queue.claim("live", TOOLCHAIN.key, lease_s=600)
    assert queue.claim("restarted", TOOLCHAIN.key, lease_s=60) is None  # both leases run for 10 minutes
    assert not queue.end_lease_of_dead_worker(live.id, "killed")  # not the dead worker's: left alone
    assert queue.end_lease_of_dead_worker(killed.id, "killed")
    again = queue.claim("restarted", TOOLCHAIN.key, lease_s=60)
    assert again is not None and again.id == killed.id and again.attempts == 2
    assert "the previous attempt stopped: the lease of worker killed" in (
        task_row(queue.engine, again.id).error or ""
    )
    assert not queue.end_lease_of_dead_worker(killed.id, "killed")  # no longer its task


def test_heartbeat_extends_the_lease_and_keeps_the_log(queue: TaskQueue, repo: Repository) -> None:
    submit(queue, 1)
    task = queue.claim("w", TOOLCHAIN.key, lease_s=60)
    extended = queue.heartbeat(task.id, "w", lease_s=600, log_tail="compiling graph 3/7")
    assert extended > task.lease_expires_at
    assert task_row(queue.engine, task.id).lease_expires_at == extended
    assert repo.task_log(task.id).log_tail == "compiling graph 3/7"


def test_release_gives_the_task_back_without_counting_the_attempt(queue: TaskQueue, repo: Repository) -> None:
    result = submit(queue, 1)
    task = queue.claim("stopping", TOOLCHAIN.key, lease_s=60)
    queue.release(task.id, "stopping")
    assert repo.job_status(result.job_id).signatures[0].state == "queued"
    again = queue.claim("next", TOOLCHAIN.key, lease_s=60)
    assert again.id == task.id and again.attempts == 1


def test_a_stalled_task_on_its_last_attempt_fails(db_engine: Engine, repo: Repository) -> None:
    queue = TaskQueue(db_engine, retry=RetryStrategy(max_attempts=1))
    result = submit(queue, 1)
    task = queue.claim("vanished", TOOLCHAIN.key, lease_s=60)
    travel(db_engine, "lease_expires_at", -1, id=task.id)
    assert queue.claim("other", TOOLCHAIN.key, lease_s=60) is None
    status = repo.job_status(result.job_id)
    assert status.state == "failed"
    assert "vanished" in status.signatures[0].error and "last attempt" in status.signatures[0].error


# --- failures and retries ----------------------------------------------------------------------


def test_retry_strategy_backs_off_exponentially_then_gives_up() -> None:
    strategy = RetryStrategy(max_attempts=4, base_delay_s=10, factor=3, max_delay_s=60)
    assert [strategy.delay(n) for n in (1, 2, 3, 4)] == [10, 30, 60, None]
    with pytest.raises(ValueError):
        RetryStrategy(max_attempts=0)


def test_failures_are_retried_with_backoff_then_fail_with_their_log(
    queue: TaskQueue, repo: Repository
) -> None:
    result = submit(queue, 1)
    for attempt, delay in ((1, 60), (2, 120)):
        task = queue.claim("w", TOOLCHAIN.key, lease_s=60)
        assert task is not None and task.attempts == attempt
        assert queue.fail(task.id, "w", f"crash {attempt}", log_tail=f"log {attempt}") == "queued"
        row = task_row(queue.engine, task.id)
        assert (row.run_after - row.updated_at).total_seconds() == pytest.approx(delay, abs=1)
        status = repo.job_status(result.job_id)
        assert status.state == "queued" and status.signatures[0].error == f"crash {attempt}"
        assert queue.claim("w", TOOLCHAIN.key, lease_s=60) is None  # backing off
        travel(queue.engine, "run_after", -1, id=task.id)

    task = queue.claim("w", TOOLCHAIN.key, lease_s=60)
    assert task.attempts == 3
    long_log = "x" * 100_000 + "the last line"
    assert queue.fail(task.id, "w", "crash 3", log_tail=long_log) == "failed"

    assert queue.claim("w", TOOLCHAIN.key, lease_s=60) is None
    status = repo.job_status(result.job_id)
    assert status.state == "failed" and status.counts == {"failed": 1}
    assert status.signatures[0].error == "crash 3" and status.signatures[0].attempts == 3
    log = repo.task_log(task.id)
    assert log.log_tail.endswith("the last line") and len(log.log_tail) == queue.log_limit

    # Submitting again leaves a failed task alone, unless asked to retry it.
    assert submit(queue, 1).enqueued == []
    assert submit(queue, 1, retry_failed=True).enqueued == [task.signature_key]
    assert queue.claim("w", TOOLCHAIN.key, lease_s=60).attempts == 1


def test_a_permanent_failure_skips_the_retries(queue: TaskQueue, repo: Repository) -> None:
    result = submit(queue, 1)
    task = queue.claim("w", TOOLCHAIN.key, lease_s=60)
    queue.heartbeat(task.id, "w", lease_s=60, log_tail="building the trainer")
    assert queue.fail(task.id, "w", "the model config cannot be built", retry=False) == "failed"
    assert repo.job_status(result.job_id).state == "failed"
    assert repo.task_log(task.id).log_tail == "building the trainer"  # the heartbeats' log is kept


def test_complete_validates_the_files(queue: TaskQueue) -> None:
    submit(queue, 1)
    task = queue.claim("w", TOOLCHAIN.key, lease_s=60)
    twice = [FileRef(path="a.bin", sha256="a" * 64, size=1), FileRef(path="a.bin", sha256="b" * 64, size=1)]
    with pytest.raises(ValueError, match="twice"):
        queue.complete(task.id, "w", twice, compile_seconds=1.0)
    for unsafe in ("../escape.so", "/abs/path.so", "a/../../b.so"):
        with pytest.raises(UnsafeArtifactError):
            FileRef(path=unsafe, sha256="a" * 64, size=1)
    assert task_row(queue.engine, task.id).state == "running"  # nothing recorded


# --- coverage, entries, listings, workers ------------------------------------------------------


def test_coverage_report_turns_missed_signatures_into_tasks(queue: TaskQueue, repo: Repository) -> None:
    result = submit(queue, 2)
    while (task := queue.claim("w", TOOLCHAIN.key, lease_s=60)) is not None:
        queue.complete(task.id, "w", factories.fake_files(task.id), compile_seconds=1.0)
    assert repo.job_status(result.job_id).state == "ready"

    planned = factories.signatures(2)
    unplanned = factories.signatures(1, phase="eval")[0]
    report = queue.record_coverage(
        result.job_id,
        met=[s.key for s in planned] + [unplanned.key],
        missed=[unplanned, planned[0]],  # planned[0] has an entry: nothing to do for it
        fresh_compiles=1,
        details={"host": "pod-0"},
    )
    assert report.enqueued == [unplanned.key]

    status = repo.job_status(result.job_id)
    # evidence, not the job: the plan's signatures are all ready, the reported one is warming beside them
    assert status.state == "ready" and status.counts == {"ready": 2} and status.reported == {"queued": 1}
    assert {s.key: s.source for s in status.signatures}[unplanned.key] == "coverage"
    assert status.reported_pending() and set(status.manifest_keys()) == {s.key for s in planned}
    (stored,) = repo.coverage_reports(result.job_id)
    assert stored.fresh_compiles == 1 and stored.details == {"host": "pod-0"}
    assert sorted(stored.missed) == sorted([unplanned.key, planned[0].key])
    task = queue.claim("w", TOOLCHAIN.key, lease_s=60)
    assert task.signature_key == unplanned.key and task.spec == factories.spec()

    with pytest.raises(JobNotFoundError):
        queue.record_coverage(uuid.uuid4(), met=[], missed=[], fresh_compiles=0)


def test_a_reported_signature_that_fails_for_good_never_fails_the_job(
    queue: TaskQueue, repo: Repository
) -> None:
    """Issue 35: one misconfigured run reported a shape the spec cannot warm; its task failed after every
    attempt, and the job (so every correct pod) was `failed`. A report is evidence: the job stays ready."""
    result = submit(queue, 1)
    task = queue.claim("w", TOOLCHAIN.key, lease_s=60)
    queue.complete(task.id, "w", factories.fake_files(task.id), compile_seconds=1.0)
    (other,) = factories.signatures(1, batch=8)
    queue.record_coverage(result.job_id, met=[other.key], missed=[other], fresh_compiles=1)
    task = queue.claim("w", TOOLCHAIN.key, lease_s=60)
    assert task.signature_key == other.key
    assert queue.fail(task.id, "w", "RehearsalError: cannot", retry=False) == "failed"

    status = repo.job_status(result.job_id)
    assert status.state == "ready" and status.counts == {"ready": 1} and status.reported == {"failed": 1}
    assert status.manifest_keys() == [factories.signatures(1)[0].key] and not status.reported_pending()
    (listed,) = repo.list_jobs()
    assert (listed.state, listed.counts, listed.reported) == ("ready", {"ready": 1}, {"failed": 1})


def test_a_reported_signature_the_spec_cannot_produce_is_marked_once_and_gets_no_task(
    queue: TaskQueue, repo: Repository
) -> None:
    result = submit(queue, 1)
    task = queue.claim("w", TOOLCHAIN.key, lease_s=60)
    queue.complete(task.id, "w", factories.fake_files(task.id), compile_seconds=1.0)
    (bigger,) = factories.signatures(1, batch=8)
    why = "the spec's trainer makes train batches of at most 4 rows, this one has 8"
    for _ in range(2):  # two runs report it: recorded once, with its reason
        answer = queue.record_coverage(
            result.job_id, met=[bigger.key], missed=[bigger], fresh_compiles=1, unwarmable={bigger.key: why}
        )
        assert answer.enqueued == [] and answer.unwarmable == {bigger.key: why}
    assert queue.claim("w", TOOLCHAIN.key, lease_s=60) is None  # never rehearsed, never retried
    status = repo.job_status(result.job_id)
    assert status.state == "ready" and status.reported == {"unwarmable": 1}
    (shown,) = [s for s in status.signatures if s.key == bigger.key]
    assert (shown.state, shown.source, shown.error, shown.task_id) == ("unwarmable", "coverage", why, None)
    assert bigger.key not in status.manifest_keys()
    assert len(repo.coverage_reports(result.job_id)) == 2


def test_a_planned_signature_is_never_marked_unwarmable_by_a_report(
    queue: TaskQueue, repo: Repository
) -> None:
    result = submit(queue, 1)
    (planned,) = factories.signatures(1)
    answer = queue.record_coverage(
        result.job_id, met=[], missed=[planned], fresh_compiles=0, unwarmable={planned.key: "a wrong claim"}
    )
    assert answer.unwarmable == {}
    (shown,) = repo.job_status(result.job_id).signatures
    assert (shown.state, shown.source) == ("queued", "plan")


def test_a_task_is_rehearsed_with_a_spec_that_plans_it(queue: TaskQueue, repo: Repository) -> None:
    """A signature one job's run reported and another job plans: the worker gets the spec that plans it,
    which produces it, even when the reporting job is older."""
    reporting = submit(queue, 0)
    (shared,) = factories.signatures(1, batch=8)
    queue.record_coverage(reporting.job_id, met=[], missed=[shared], fresh_compiles=1)
    planning = queue.submit_job(factories.spec(max_length=1024), TOOLCHAIN, [shared])
    assert planning.job_id != reporting.job_id
    task = queue.claim("w", TOOLCHAIN.key, lease_s=60)
    assert task.signature_key == shared.key and task.spec == factories.spec(max_length=1024)


def test_entries_for_a_manifest_and_their_last_use(queue: TaskQueue, repo: Repository) -> None:
    result = submit(queue, 2)
    task = queue.claim("w", TOOLCHAIN.key, lease_s=60)
    files = factories.fake_files(task.id, count=3)
    queue.reserve_blobs(files)
    entry_id = queue.complete(task.id, "w", files, compile_seconds=4.5)

    keys = [s.key for s in repo.job_status(result.job_id).signatures]
    entries = repo.entries_for(keys, TOOLCHAIN.key)
    assert list(entries) == [task.signature_key]
    assert entries[task.signature_key].files == sorted(files, key=lambda f: f.path)
    assert entries[task.signature_key].compile_seconds == 4.5
    assert repo.entries_for(keys, factories.toolchain("other").key) == {}

    def last_used():
        with queue.engine.connect() as conn:
            return conn.execute(select(m.Entry.last_used_at).where(m.Entry.id == entry_id)).scalar_one()

    with queue.engine.begin() as conn:
        conn.execute(update(m.Entry).values(last_used_at=db_now(-7200)))
    before = last_used()
    repo.entries_for(keys, TOOLCHAIN.key, touch=False)
    assert last_used() == before
    repo.entries_for(keys, TOOLCHAIN.key)
    assert (last_used() - before).total_seconds() > 7000


def test_list_jobs_newest_first_with_counts(queue: TaskQueue, repo: Repository) -> None:
    older = queue.submit_job(factories.spec(), TOOLCHAIN, factories.signatures(2))
    time.sleep(0.01)  # SQLite's clock has millisecond steps: keep the two creation times apart
    newer = queue.submit_job(factories.spec(max_length=2048), TOOLCHAIN, factories.signatures(3))
    other = queue.submit_job(factories.spec(), factories.toolchain("trn2"), factories.signatures(1))
    task = queue.claim("w", TOOLCHAIN.key, lease_s=60)
    queue.complete(task.id, "w", factories.fake_files(task.id), compile_seconds=1.0)

    jobs = repo.list_jobs(toolchain_key=TOOLCHAIN.key)
    assert [j.id for j in jobs] == [newer.job_id, older.job_id]
    assert [sum(j.counts.values()) for j in jobs] == [3, 2]
    assert sum(j.counts.get("ready", 0) for j in jobs) == 2  # the shared signature is ready in both
    assert {j.id for j in repo.list_jobs()} == {older.job_id, newer.job_id, other.job_id}
    assert {j.toolchain_key for j in repo.list_jobs(spec_key=factories.spec().key)} == {
        TOOLCHAIN.key,
        factories.toolchain("trn2").key,
    }
    assert len(repo.list_jobs(limit=1, offset=1)) == 1
    assert repo.job_status(uuid.uuid4()) is None


def test_workers_register_and_pools_follow_the_newest_toolchain(repo: Repository) -> None:
    old, new = factories.toolchain("trn2-2.20"), factories.toolchain("trn2-2.21")
    repo.register_worker("w1", old, pool="trn2", host="node-a")
    assert repo.resolve_pool("trn2") == old
    repo.register_worker("w2", new, pool="trn2", host="node-b")
    assert repo.resolve_pool("trn2") == new
    assert repo.resolve_pool("nope") is None
    assert repo.get_toolchain(old.key) == old

    assert [(w.id, w.toolchain_key) for w in repo.list_workers(seen_within_s=60)] == [
        ("w1", old.key),
        ("w2", new.key),
    ]
    assert repo.touch_worker("w1") and not repo.touch_worker("ghost")
    repo.remove_worker("w1")
    assert [w.id for w in repo.list_workers()] == ["w2"]
