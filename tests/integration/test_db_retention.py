"""Retention and garbage collection: unused entries go, then unreferenced blobs, never a reserved one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update

from tests.fixtures import factories
from warmup.db import models as m
from warmup.db.columns import db_now
from warmup.db.queue import TaskQueue
from warmup.db.repository import Repository
from warmup.db.retention import collect_garbage, expire_entries
from warmup.store import LocalBlobStore

pytestmark = pytest.mark.timeout(120)

TOOLCHAIN = factories.toolchain()


@pytest.fixture
def store(tmp_path: Path) -> LocalBlobStore:
    return LocalBlobStore(tmp_path / "blobs")


def build_entry(queue: TaskQueue, store: LocalBlobStore, tmp_path: Path, count: int = 2):
    """What a worker does: claim, reserve the blobs, upload them, complete."""
    result = queue.submit_job(factories.spec(), TOOLCHAIN, factories.signatures(1))
    task = queue.claim("w", TOOLCHAIN.key, lease_s=60)
    refs = []
    for i in range(count):
        path, ref = factories.artifact(tmp_path / "cache", f"g{i}.bin")
        refs.append(ref)
        queue.reserve_blobs([ref])
        store.put_file(path, ref.sha256)
    queue.complete(task.id, "w", refs, compile_seconds=1.0)
    return result, task, refs


def end_reservations(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(update(m.Blob).values(reserved_until=db_now(-1)))


def blob_rows(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(select(m.Blob.sha256)).scalars())


def test_reserved_and_referenced_blobs_survive_gc(
    db_engine: Engine, store: LocalBlobStore, tmp_path: Path
) -> None:
    queue = TaskQueue(db_engine)
    _, _, refs = build_entry(queue, store, tmp_path)
    # A worker uploading blobs for an entry it has not recorded yet.
    path, uploading = factories.artifact(tmp_path / "cache", "in-flight.bin")
    queue.reserve_blobs([uploading])
    store.put_file(path, uploading.sha256)

    report = collect_garbage(db_engine, store)
    assert report.blobs_deleted == 0
    assert {b.sha256 for b in store.iter_blobs()} == {r.sha256 for r in refs} | {uploading.sha256}

    end_reservations(db_engine)  # the in-flight upload was abandoned long ago
    report = collect_garbage(db_engine, store)
    assert report.blobs_deleted == 1 and report.bytes_freed == uploading.size
    assert not store.has(uploading.sha256)
    assert blob_rows(db_engine) == {r.sha256 for r in refs}  # referenced: kept however old


def test_unused_entries_expire_and_resubmission_requeues(
    db_engine: Engine, store: LocalBlobStore, tmp_path: Path
) -> None:
    queue, repo = TaskQueue(db_engine), Repository(db_engine)
    result, task, _refs = build_entry(queue, store, tmp_path)
    end_reservations(db_engine)
    assert expire_entries(db_engine, unused_for_s=3600) == 0  # used just now

    with db_engine.begin() as conn:
        conn.execute(update(m.Entry).values(last_used_at=db_now(-90 * 86400)))
    assert expire_entries(db_engine, unused_for_s=30 * 86400, blob_grace_s=3600) == 1
    status = repo.job_status(result.job_id)
    assert status.state == "incomplete" and status.counts == {"missing": 1}

    # A pod that read the manifest a moment ago can still fetch the blobs during the grace period.
    assert collect_garbage(db_engine, store).blobs_deleted == 0
    end_reservations(db_engine)
    assert collect_garbage(db_engine, store).blobs_deleted == 2
    assert list(store.iter_blobs()) == [] and blob_rows(db_engine) == set()

    again = queue.submit_job(factories.spec(), TOOLCHAIN, factories.signatures(1))
    assert again.job_id == result.job_id and again.enqueued == [task.signature_key]
    assert queue.claim("w", TOOLCHAIN.key, lease_s=60).id == task.id


def test_orphaned_objects_are_adopted_then_collected(
    db_engine: Engine, store: LocalBlobStore, tmp_path: Path
) -> None:
    path, ref = factories.artifact(tmp_path / "cache", "orphan.bin")
    store.put_file(path, ref.sha256)  # in the store, unknown to the database

    young = collect_garbage(db_engine, store)  # could be an upload in progress: left alone
    assert (young.orphans_adopted, young.blobs_deleted) == (0, 0) and store.has(ref.sha256)

    blob = store.root / "blobs" / ref.sha256[:2] / ref.sha256
    os.utime(blob, (1_000_000_000, 1_000_000_000))  # an object from 2001
    old = collect_garbage(db_engine, store)
    assert (old.orphans_adopted, old.blobs_deleted) == (1, 1)
    assert not store.has(ref.sha256) and blob_rows(db_engine) == set()


def test_the_temp_files_of_cut_off_uploads_go_once_old(db_engine: Engine, store: LocalBlobStore) -> None:
    (store.root / "blobs").mkdir(parents=True)
    cut_off = store.root / "blobs" / ".tmp-killed-mid-upload"  # what a worker killed mid-upload leaves
    cut_off.write_bytes(b"half a blob")
    in_progress = store.root / "blobs" / ".tmp-being-written"
    in_progress.write_bytes(b"a blob being")
    os.utime(cut_off, (1_000_000_000, 1_000_000_000))

    report = collect_garbage(db_engine, store)
    assert report.stale_uploads_removed == 1
    assert not cut_off.exists() and in_progress.exists()


def test_a_reservation_is_never_shortened(db_engine: Engine) -> None:
    queue = TaskQueue(db_engine)
    ref = factories.fake_files(1, count=1)[0]
    queue.reserve_blobs([ref], ttl_s=7200)
    queue.reserve_blobs([ref], ttl_s=60)
    with db_engine.connect() as conn:
        row = conn.execute(select(m.Blob.created_at, m.Blob.reserved_until)).one()
    assert (row.reserved_until - row.created_at).total_seconds() > 7000
