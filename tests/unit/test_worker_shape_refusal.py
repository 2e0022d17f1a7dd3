"""A rehearsal whose trainer did not produce the unit's shapes fails the same way at every attempt (the spec
cannot make that signature): the worker records it once, with the reason, and does not retry it (issue 35).
A crash, by contrast, is retried. The real worker loop; the rehearsal's outcome is given, not run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.fixtures import factories
from tests.fixtures.factories import cpu_toolchain
from warmup.db.engine import make_engine
from warmup.db.queue import TaskQueue
from warmup.rehearsal.runner import SignatureResult
from warmup.signature import Signature
from warmup.store import LocalBlobStore
from warmup.worker.loop import Worker, WorkerOptions


@pytest.mark.parametrize(("permanent", "state"), [(True, "failed"), (False, "queued")])
def test_a_shape_the_spec_does_not_produce_is_not_retried_and_a_crash_is(
    sqlite_url: str, tmp_path: Path, permanent, state
):
    engine = make_engine(sqlite_url)
    queue = TaskQueue(engine)
    toolchain = factories.toolchain()
    queue.submit_job(factories.spec(), toolchain, factories.signatures(1))
    task = queue.claim("w-1", toolchain.key, lease_s=60)
    assert task is not None
    worker = Worker(
        WorkerOptions(database_url=sqlite_url, store_url=str(tmp_path / "blobs"), worker_id="w-1"),
        engine=engine,
        store=LocalBlobStore(tmp_path / "blobs"),
        toolchain=cpu_toolchain(),
    )
    signature = Signature.model_validate(task.signature)
    note = "the trainer produced batch shapes [(2, 128)], the unit needs only (4, 128)"
    result = SignatureResult(
        key=task.signature_key, signature=signature, status="failed", note=note, permanent=permanent
    )
    outcome = worker._record(task, signature, result, time.monotonic())
    assert outcome.status == ("failed" if permanent else "retry")
    log = worker.repository.task_log(task.id)
    assert log is not None and (log.state, log.attempts) == (state, 1) and note in (log.error or "")
    engine.dispose()
