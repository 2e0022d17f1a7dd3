"""Real workers compiling real signatures, killed or stopped mid-task (slow: real compiles)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import select

from tests.fixtures.factories import one_signature_sft
from tests.reliability.audit import audit_store
from tests.reliability.ledger import Row, record
from warmup.db import models as m
from warmup.db.engine import make_engine
from warmup.db.migrate import upgrade
from warmup.db.queue import TaskQueue
from warmup.db.records import Keyed
from warmup.db.repository import Repository
from warmup.job.spec import load_spec
from warmup.planner.planning import plan_spec
from warmup.store import open_store
from warmup.toolchain.probes import current_toolchain


def submit_one_signature(db_url: str, model_dir: Path):
    spec = load_spec(one_signature_sft(model_dir))
    signatures = [s for s in plan_spec(spec).signatures if s.compile != "eager"]
    assert len(signatures) == 1
    upgrade(db_url)
    engine = make_engine(db_url)
    job = TaskQueue(engine).submit_job(
        Keyed.of(spec), Keyed.of(current_toolchain("inductor", "cpu")), [Keyed.of(s) for s in signatures]
    )
    return engine, job.job_id


def start_worker(db_url: str, store: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "warmup", "worker", "--database-url", db_url, "--store", str(store), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def task_row(engine):
    with engine.connect() as connection:
        return connection.execute(
            select(m.Task.state, m.Task.attempts, m.Task.lease_owner, m.Task.error, m.Task.heartbeat_at)
        ).one()


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def test_a_worker_killed_mid_compile_loses_its_lease_and_another_finishes(tmp_path, tiny_model_dir):
    db_url = f"sqlite:///{tmp_path / 'warmup.db'}"
    engine, job_id = submit_one_signature(db_url, tiny_model_dir)
    first = start_worker(db_url, tmp_path / "blobs", "--lease", "8")
    wait_for(lambda: task_row(engine).state == m.TaskState.running, 120, "the first worker to claim")
    time.sleep(4)  # well inside the rehearsal: torch is importing or compiling
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    killed_owner = task_row(engine).lease_owner

    second = start_worker(db_url, tmp_path / "blobs", "--lease", "8", "--poll-interval", "1")
    try:
        wait_for(lambda: task_row(engine).state == m.TaskState.done, 300, "the second worker to finish")
    finally:
        second.terminate()
        output = second.communicate(timeout=60)[0].decode()
    row = task_row(engine)
    assert row.attempts == 2 and row.lease_owner != killed_owner, output
    status = Repository(engine).job_status(job_id)
    assert status.state == "ready"
    entries = Repository(engine).entries_for(
        [status.signatures[0].key], current_toolchain("inductor", "cpu").key()
    )
    assert entries and entries[status.signatures[0].key].files  # compiled artifacts, uploaded
    audit = audit_store(engine, open_store(str(tmp_path / "blobs")))
    assert audit.lost == 0 and audit.files > 0
    engine.dispose()
    record(
        Row(
            scenario="worker: SIGKILL mid-compile (real compile)",
            faults_injected=1,
            jobs_completed=1,
            data_lost=audit.lost,
        )
    )


def test_sigterm_mid_compile_releases_the_task(tmp_path, tiny_model_dir):
    db_url = f"sqlite:///{tmp_path / 'warmup.db'}"
    engine, _ = submit_one_signature(db_url, tiny_model_dir)
    worker = start_worker(db_url, tmp_path / "blobs", "--grace", "1")
    wait_for(lambda: task_row(engine).state == m.TaskState.running, 120, "the worker to claim")
    time.sleep(2)
    worker.terminate()
    output = worker.communicate(timeout=120)[0].decode()
    assert worker.returncode == 0, output
    row = task_row(engine)
    assert row.state == m.TaskState.queued and row.attempts == 0, (
        output
    )  # released: the attempt is given back
    assert "released" in output or "finishing or releasing" in output
    engine.dispose()
