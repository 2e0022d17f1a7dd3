"""What killed workers leave behind is removed when a worker starts; what live ones hold stays."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import pytest

from tests.fixtures import factories
from tests.fixtures.factories import cpu_toolchain
from warmup.db.engine import make_engine
from warmup.db.migrate import upgrade
from warmup.db.queue import TaskQueue
from warmup.leftovers import locked_temp_dir, remove_abandoned
from warmup.store import LocalBlobStore
from warmup.worker.loop import TASK_FOLDER, Worker, WorkerOptions, task_folder_owner, task_folder_prefix


def test_a_starting_worker_removes_what_killed_workers_left(tmp_path: Path, caplog) -> None:
    work, store = tmp_path / "work", LocalBlobStore(tmp_path / "store")
    work.mkdir()
    store.check()
    killed = work / f"{TASK_FOLDER}7-abc"  # a worker killed mid-task held its lock until it died
    (killed / "rehearsal" / "cache").mkdir(parents=True)
    (killed / "rehearsal" / "cache" / "kernel.so").write_bytes(b"k" * 5000)
    upload = store.root / "blobs" / ".tmp-cut-off"
    upload.write_bytes(b"half a blob")
    unrelated = work / "notes.txt"
    unrelated.write_text("not the worker's")
    lock, live = locked_temp_dir(work, f"{TASK_FOLDER}8-")  # another worker's task, in progress
    url = f"sqlite:///{tmp_path / 'never-opened.db'}"
    worker = Worker(
        WorkerOptions(database_url=url, store_url=str(store.root), work_dir=work),
        engine=make_engine(url),
        store=store,
        toolchain=cpu_toolchain(),
    )
    try:
        with caplog.at_level(logging.WARNING, logger="warmup.worker"):
            worker.remove_leftovers()
        assert not killed.exists() and not upload.exists()
        assert live.is_dir() and unrelated.exists()
        said = caplog.text
        assert (
            f"removed 1 task folders in {work} left by killed processes (5000 bytes): {killed.name}" in said
        )
        assert "removed 1 upload temp files in" in said and ".tmp-cut-off" in said
    finally:
        os.close(lock)
        worker.engine.dispose()
    assert remove_abandoned([live]).paths == [live]  # its worker is done: nothing holds it


def test_a_starting_worker_takes_back_at_once_the_task_a_killed_worker_held(tmp_path: Path) -> None:
    """`warmup serve` killed mid-task and started again: its new worker finds the old one's task folder
    abandoned, so the task is due now instead of when its lease runs out."""
    work, store = tmp_path / "work", LocalBlobStore(tmp_path / "store")
    work.mkdir()
    store.check()
    url = f"sqlite:///{tmp_path / 'warmup.db'}"
    engine = make_engine(url)
    upgrade(engine)
    queue, toolchain = TaskQueue(engine), factories.toolchain()
    queue.submit_job(factories.spec(), toolchain, factories.signatures(2))
    killed_id = "host-4242-0a1b2c"
    held = queue.claim(killed_id, toolchain.key, lease_s=600)
    live = queue.claim("host-77-live", toolchain.key, lease_s=600)
    assert held is not None and live is not None
    (work / f"{task_folder_prefix(held.id, killed_id)}x8_k2q").mkdir()  # its lock died with it
    lock, _ = locked_temp_dir(work, task_folder_prefix(live.id, "host-77-live"))  # a live worker's
    worker = Worker(
        WorkerOptions(database_url=url, store_url=str(store.root), work_dir=work),
        engine=engine,
        store=store,
        toolchain=cpu_toolchain(),
    )
    try:
        worker.remove_leftovers()
        again = queue.claim(worker.options.worker_id, toolchain.key, lease_s=60)
        assert again is not None and again.id == held.id
        assert queue.claim("another", toolchain.key, lease_s=60) is None  # the live one's stays held
    finally:
        os.close(lock)
        engine.dispose()


def test_a_task_folder_names_its_task_and_worker() -> None:
    prefix = task_folder_prefix(12, "pod-a-b-31-9f8e7d")
    assert task_folder_owner(f"{prefix}k_2j9x0q") == (12, "pod-a-b-31-9f8e7d")
    assert task_folder_owner(f"{TASK_FOLDER}7-abc") is None  # an older worker's name: no owner to read


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_link_is_not_followed(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "precious"
    if kind == "folder":
        target.mkdir()
    else:
        target.write_text("keep")
    link = tmp_path / f"{TASK_FOLDER}link"
    link.symlink_to(target)
    assert remove_abandoned([link]).paths == []
    assert target.exists()


def test_task_folders_go_to_a_folder_of_their_queue_unless_a_work_dir_is_given(tmp_path: Path) -> None:
    """Workers of one queue share where their task folders go (a restarted worker finds a killed one's); another
    queue's workers on the same host (another service) use another folder, so they never remove it first."""

    def options(url: str, work_dir: Path | None = None) -> WorkerOptions:
        return WorkerOptions(database_url=url, store_url=str(tmp_path / "store"), work_dir=work_dir)

    one, other = "postgresql://db-a/warmup", "postgresql://db-b/warmup"
    assert options(one).task_root() == options(one).task_root()
    assert options(one).task_root() != options(other).task_root()
    assert options(one).task_root().parent == Path(tempfile.gettempdir())
    assert "db-a" not in str(options(one).task_root())  # named by a digest: a URL may hold a password
    assert options(one, tmp_path / "work").task_root() == tmp_path / "work"
