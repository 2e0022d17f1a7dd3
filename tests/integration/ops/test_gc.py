"""`warmup gc`: entries unused for N days go, then blobs no entry references; a blob a worker has
reserved for an entry it is still building survives, also while gc and uploads run at once."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, update

from tests.fixtures import factories
from warmup.cli import main
from warmup.db import models as m
from warmup.db.columns import db_now
from warmup.db.engine import make_engine
from warmup.db.queue import TaskQueue
from warmup.db.records import FileRef
from warmup.store import LocalBlobStore

pytestmark = pytest.mark.timeout(300)
TOOLCHAIN = factories.toolchain()


def build_entry(queue: TaskQueue, store: LocalBlobStore, directory: Path, name: str) -> list[FileRef]:
    """What a worker does after compiling: reserve the blobs, upload them, record the entry."""
    task = queue.claim("w", TOOLCHAIN.key, lease_s=60)
    assert task is not None
    refs = []
    for i in range(2):
        path, ref = factories.artifact(directory, f"{name}-{i}.bin")
        queue.reserve_blobs([ref])
        store.put_file(path, ref.sha256)
        refs.append(ref)
    queue.complete(task.id, "w", refs, compile_seconds=1.0)
    return refs


def gc(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["gc", *args]) == 0
    return capsys.readouterr().out


def expire_reservations(engine: Engine, shas: list[str]) -> None:
    with engine.begin() as connection:
        connection.execute(update(m.Blob).where(m.Blob.sha256.in_(shas)).values(reserved_until=db_now(-1)))


def test_gc_removes_unused_entries_and_unreferenced_blobs(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = make_engine(db_url)
    queue, store = TaskQueue(engine), LocalBlobStore(tmp_path / "blobs")
    queue.submit_job(factories.spec(), TOOLCHAIN, factories.signatures(2))
    recent = build_entry(queue, store, tmp_path / "cache", "recent")
    old = build_entry(queue, store, tmp_path / "cache", "old")
    with engine.begin() as connection:  # the second entry: last listed in a manifest 90 days ago
        old_entry = select(m.EntryFile.entry_id).where(m.EntryFile.blob_sha256 == old[0].sha256)
        connection.execute(
            update(m.Entry).where(m.Entry.id.in_(old_entry)).values(last_used_at=db_now(-90 * 86400))
        )
    # A worker uploading the blob of an entry it has not recorded yet: reserved, not referenced.
    path, in_flight = factories.artifact(tmp_path / "cache", "in-flight.bin")
    queue.reserve_blobs([in_flight])
    store.put_file(path, in_flight.sha256)
    # An abandoned upload: unreferenced, reservation over.
    path, abandoned = factories.artifact(tmp_path / "cache", "abandoned.bin")
    queue.reserve_blobs([abandoned])
    store.put_file(path, abandoned.sha256)
    expire_reservations(engine, [abandoned.sha256] + [r.sha256 for r in recent + old])
    # An object the database never heard of (a crash before the row), from long ago.
    path, orphan = factories.artifact(tmp_path / "cache", "orphan.bin")
    store.put_file(path, orphan.sha256)
    os.utime(store.root / "blobs" / orphan.sha256[:2] / orphan.sha256, (1_000_000_000, 1_000_000_000))

    location = ["--database-url", db_url, "--store", str(store.root)]
    out = gc(capsys, "--unused-days", "30", *location)
    assert out.startswith("expired 1 entries unused for 30 days; deleted 2 blobs")
    assert "adopted 1 orphaned store objects" in out
    present = {b.sha256 for b in store.iter_blobs()}
    assert present == {r.sha256 for r in recent + old} | {in_flight.sha256}
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(m.Entry)).scalar_one() == 1

    # The old entry's blobs stay for the grace hour (a pod may have just read its manifest) ...
    assert gc(capsys, "--unused-days", "30", *location).startswith(
        "expired 0 entries unused for 30 days; deleted 0 blobs"
    )
    # ... and go at the first run after it.
    expire_reservations(engine, [r.sha256 for r in old])
    assert "deleted 2 blobs" in gc(capsys, "--unused-days", "30", *location)
    assert {b.sha256 for b in store.iter_blobs()} == {r.sha256 for r in recent} | {in_flight.sha256}
    engine.dispose()


def test_gc_on_the_embedded_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WARMUP_DATABASE_URL", raising=False)
    monkeypatch.delenv("WARMUP_STORE_URL", raising=False)
    assert main(["gc", "--unused-days", "7"]) == 1
    assert "give --data-dir" in capsys.readouterr().err
    assert main(["gc", "--unused-days", "7", "--data-dir", str(tmp_path / "nothing")]) == 1
    assert "no database at" in capsys.readouterr().err
    from warmup.db.migrate import upgrade

    (tmp_path / "data").mkdir()
    upgrade(f"sqlite:///{tmp_path / 'data' / 'warmup.db'}")
    capsys.readouterr()
    assert gc(capsys, "--unused-days", "7", "--data-dir", str(tmp_path / "data")).startswith(
        "expired 0 entries"
    )


def test_gc_while_workers_upload_never_loses_a_referenced_blob(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Workers build entries out of blobs that gc is busy deleting (same content, so the same sha256):
    every entry recorded must have all its blobs in the store."""
    engine = make_engine(pg_url)
    queue, store = TaskQueue(engine), LocalBlobStore(tmp_path / "blobs")
    contents = [f"shared artifact {i}".encode() * 64 for i in range(40)]
    files = []
    for i, content in enumerate(contents):
        path = tmp_path / "src" / f"{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        files.append(
            (
                path,
                FileRef(path=f"graph/{i}.bin", sha256=hashlib.sha256(content).hexdigest(), size=len(content)),
            )
        )
        queue.reserve_blobs([files[-1][1]])
        store.put_file(path, files[-1][1].sha256)
    expire_reservations(engine, [ref.sha256 for _, ref in files])  # all of them: garbage right now
    queue.submit_job(factories.spec(), TOOLCHAIN, factories.signatures(20))

    done = threading.Event()
    errors: list[BaseException] = []
    gc_runs = 0

    def collect() -> None:
        nonlocal gc_runs
        try:
            while True:  # at least once, then until the uploads are over
                assert (
                    main(["gc", "--unused-days", "30", "--database-url", pg_url, "--store", str(store.root)])
                    == 0
                )
                gc_runs += 1
                if done.is_set():
                    break
        except BaseException as error:
            errors.append(error)

    collector = threading.Thread(target=collect)
    collector.start()
    try:
        for n in range(20):  # each entry reuses two of the doomed blobs
            task = queue.claim("w", TOOLCHAIN.key, lease_s=60)
            assert task is not None
            picked = [files[(2 * n) % 40], files[(2 * n + 1) % 40]]
            queue.reserve_blobs([ref for _, ref in picked])
            for path, ref in picked:
                store.put_file(path, ref.sha256)
            queue.complete(task.id, "w", [ref for _, ref in picked], compile_seconds=1.0)
    finally:
        done.set()
        collector.join(timeout=120)
    assert not errors, errors
    deleted = sum(int(line.split("deleted ")[1].split()[0]) for line in capsys.readouterr().out.splitlines())
    print(f"{gc_runs} gc runs during the uploads deleted {deleted} blobs")
    expire_reservations(engine, [ref.sha256 for _, ref in files])  # a day later
    gc(capsys, "--unused-days", "30", "--database-url", pg_url, "--store", str(store.root))
    with engine.connect() as connection:
        referenced = set(connection.execute(select(m.EntryFile.blob_sha256)).scalars())
    assert len(referenced) == 40
    missing = [sha for sha in referenced if not store.has(sha)]
    assert not missing, f"{len(missing)} blobs of recorded entries were removed"
    engine.dispose()
