"""The task queue with real worker processes, on SQLite and PostgreSQL (tests/unit/test_queue.py: the queue's
operations in this process)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest
from sqlalchemy import select

from tests.fixtures import factories, workers
from tests.unit.test_queue import TOOLCHAIN, count, task_row
from warmup.db import models as m
from warmup.db.queue import TaskQueue
from warmup.db.repository import Repository

pytestmark = pytest.mark.timeout(180)


SPAWN = multiprocessing.get_context("spawn")


def test_concurrent_identical_submissions_make_one_job_processes(db_url: str) -> None:
    start, results = SPAWN.Event(), SPAWN.Queue()
    args = (factories.spec(), TOOLCHAIN, factories.signatures(10), start, results)
    procs = [
        SPAWN.Process(target=workers.submit, args=(db_url, f"p{i}", *args), daemon=True) for i in range(4)
    ]
    for p in procs:
        p.start()
    start.set()
    answers = workers.collect(results, len(procs)).values()
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0

    assert len({job_id for job_id, _ in answers}) == 1
    assert sum(created for _, created in answers) == 1
    from warmup.db.engine import make_engine

    engine = make_engine(db_url)
    assert count(engine, m.Job) == 1
    assert count(engine, m.Task) == 10
    engine.dispose()


def test_four_worker_processes_do_each_of_twenty_tasks_exactly_once(db_url: str) -> None:
    from warmup.db.engine import make_engine

    engine = make_engine(db_url)
    result = TaskQueue(engine).submit_job(factories.spec(), TOOLCHAIN, factories.signatures(20))
    start, results = SPAWN.Event(), SPAWN.Queue()
    procs = [
        SPAWN.Process(
            target=workers.drain, args=(db_url, TOOLCHAIN.key, f"worker-{i}", start, results), daemon=True
        )
        for i in range(4)
    ]
    for p in procs:
        p.start()
    start.set()
    reports = workers.collect(results, len(procs))
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0

    claimed = [task_id for ids in reports.values() for task_id in ids]
    with engine.connect() as conn:
        all_ids = sorted(conn.execute(select(m.Task.id)).scalars())
        done_by = dict(
            conn.execute(select(m.Task.id, m.Task.lease_owner).where(m.Task.state == "done")).all()
        )
    assert len(all_ids) == 20
    assert sorted(claimed) == all_ids  # every task claimed, none twice
    assert done_by == {task_id: worker for worker, ids in reports.items() for task_id in ids}
    assert count(engine, m.Entry) == 20
    status = Repository(engine).job_status(result.job_id)
    assert status.state == "ready" and status.counts == {"ready": 20}
    engine.dispose()


def test_killed_worker_loses_its_lease_and_another_worker_finishes(db_url: str) -> None:
    from warmup.db.engine import make_engine

    engine = make_engine(db_url)
    queue = TaskQueue(engine)
    result = queue.submit_job(factories.spec(), TOOLCHAIN, factories.signatures(1))
    lease_s = 2.0
    claimed = SPAWN.Queue()
    holder = SPAWN.Process(
        target=workers.hold, args=(db_url, TOOLCHAIN.key, "doomed", lease_s, claimed), daemon=True
    )
    holder.start()
    try:
        task_id = claimed.get(timeout=60)
        assert task_id is not None

        # While it heartbeats, its lease outlives the original expiry and nobody else gets the task.
        time.sleep(lease_s * 1.5)
        assert queue.claim("rescuer", TOOLCHAIN.key, lease_s=60) is None
        assert task_row(engine, task_id).heartbeat_at > task_row(engine, task_id).started_at
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # mid-task: no release, no last heartbeat
        holder.join(timeout=30)
    assert holder.exitcode == -signal.SIGKILL

    deadline = time.monotonic() + 30
    task = None
    while task is None and time.monotonic() < deadline:
        task = queue.claim("rescuer", TOOLCHAIN.key, lease_s=60)
        time.sleep(0.2)
    assert task is not None, "the dead worker's task never became claimable"
    assert task.id == task_id and task.attempts == 2
    assert "doomed" in task_row(engine, task_id).error

    queue.complete(task.id, "rescuer", factories.fake_files(task.id), compile_seconds=3.0)
    row = task_row(engine, task_id)
    assert (row.state, row.lease_owner) == ("done", "rescuer")
    assert Repository(engine).job_status(result.job_id).state == "ready"
    engine.dispose()
