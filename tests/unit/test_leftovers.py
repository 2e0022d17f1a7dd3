"""What killed workers leave behind is removed when a worker starts; what live ones hold stays."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from tests.fixtures.factories import cpu_toolchain
from warmup.db.engine import make_engine
from warmup.leftovers import locked_temp_dir, remove_abandoned
from warmup.store import LocalBlobStore
from warmup.worker.loop import TASK_FOLDER, Worker, WorkerOptions


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
