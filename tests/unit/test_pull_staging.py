"""What a pull leaves and trusts: its own staging folder (a dead pull's is removed, a live one's kept),
the index's stat fields (a file altered with its size and mtime kept is hashed and replaced), the one
retry loop of the client, and the offline fallback's match of an install pulled with other data facts.

Processes killed for real, a disk sized for the cache and a service restarted are in
tests/reliability/test_pod_crashes.py.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

import pytest

from tests.unit.test_pull_install import manifest_of, server  # noqa: F401 (a fixture)
from warmup.client.installing import install
from warmup.client.local import INDEX_NAME, TEMP_DIR_NAME, find_installed, save_local_manifest
from warmup.client.sources import HttpBlobSource
from warmup.job.spec import DataFacts, Spec
from warmup.retry import Backoff, at_once, retry_budget_s, retrying


def dead_pulls_leftovers(dest: Path) -> None:
    """What two killed pulls leave: a staging folder nobody holds, and a loose file of an older client."""
    folder = dest / TEMP_DIR_NAME / "1234-dead"
    folder.mkdir(parents=True)
    (folder / "abc123tmp").write_bytes(b"x" * 1000)
    (dest / TEMP_DIR_NAME / "def456tmp").write_bytes(b"y" * 500)


def test_a_pull_removes_what_dead_pulls_left_and_keeps_a_live_ones(server, tmp_path):  # noqa: F811
    dest = tmp_path / "cache"
    files = [server.file(f"k{i}/entry", os.urandom(300)) for i in range(3)]
    install(manifest_of(files[:1]), dest, HttpBlobSource(None))
    dead_pulls_leftovers(dest)
    live = dest / TEMP_DIR_NAME / "999-live"
    live.mkdir()
    (live / "partial").write_bytes(b"z" * 10)
    handle = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(handle, fcntl.LOCK_EX)  # a pull running into the same directory holds its folder
    try:
        result = install(manifest_of(files), dest, HttpBlobSource(None))
        assert result.removed_leftovers == (2, 1500)
        assert result.downloaded == 2
        assert sorted(p.name for p in (dest / TEMP_DIR_NAME).iterdir()) == ["999-live"]
        assert (live / "partial").read_bytes() == b"z" * 10
    finally:
        os.close(handle)
    # Once that pull is gone, the next pull (with nothing to download) removes its folder and the staging one.
    again = install(manifest_of(files), dest, HttpBlobSource(None))
    assert again.removed_leftovers == (1, 10) and again.downloaded == 0
    assert not (dest / TEMP_DIR_NAME).exists()


def test_a_refused_pull_still_leaves_no_staging_folder_of_its_own(server, tmp_path):  # noqa: F811
    dest = tmp_path / "cache"
    install(manifest_of([server.file("a.bin", b"a")]), dest, HttpBlobSource(None))
    ghost = server.file("ghost.bin", b"never served")
    del server.blobs[ghost.sha256]
    with pytest.raises(Exception, match="HTTP 404"):
        install(manifest_of([ghost]), dest, HttpBlobSource(None))
    assert not (dest / TEMP_DIR_NAME).exists()


def test_a_file_altered_with_its_size_and_mtime_kept_is_hashed_and_replaced(server, tmp_path):  # noqa: F811
    file = server.file("fxgraph/ab/entry", b"the right bytes of a compiled graph")
    dest = tmp_path / "cache"
    install(manifest_of([file]), dest, HttpBlobSource(None))
    again = install(manifest_of([file]), dest, HttpBlobSource(None))
    assert (again.skipped, again.hashed) == (1, 0)  # unchanged by the index: not hashed

    target = dest / file.path
    stat = target.stat()
    target.write_bytes(b"THE right bytes of a compiled graph")  # same size
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # as `touch -r` restores it
    assert (target.stat().st_size, target.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)

    replaced = install(manifest_of([file]), dest, HttpBlobSource(None))
    assert (replaced.downloaded, replaced.skipped, replaced.hashed) == (1, 0, 0)  # hashed, found altered
    assert target.read_bytes() == b"the right bytes of a compiled graph"
    checked = install(manifest_of([file]), dest, HttpBlobSource(None), trust_index=False)
    assert (checked.downloaded, checked.skipped, checked.hashed) == (0, 1, 1)


def test_an_index_of_an_older_client_is_not_trusted(server, tmp_path):  # noqa: F811
    file = server.file("a.bin", b"content")
    install(manifest_of([file]), tmp_path, HttpBlobSource(None))
    stat = (tmp_path / "a.bin").stat()
    (tmp_path / INDEX_NAME).write_text(f'{{"files": {{"a.bin": ["{file.sha256}", 7, {stat.st_mtime_ns}]}}}}')
    again = install(manifest_of([file]), tmp_path, HttpBlobSource(None))
    assert (again.skipped, again.hashed) == (1, 1)


class Flaky(Exception):
    pass


def test_retrying_backs_off_until_the_call_succeeds_or_the_budget_runs_out(monkeypatch):
    slept: list[float] = []
    now = [0.0]

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    calls = iter([Flaky(), Flaky(), Flaky(), "answer"])

    def call() -> str:
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return value

    transient = lambda error: isinstance(error, Flaky)  # noqa: E731
    assert retrying(call, transient=transient, sleep=sleep, clock=lambda: now[0]) == "answer"
    assert slept == [0.5, 1.0, 2.0]

    def never() -> str:
        raise Flaky()

    slept.clear()
    with pytest.raises(Flaky):
        retrying(never, transient=transient, backoff=Backoff(budget_s=20), sleep=sleep, clock=lambda: now[0])
    assert slept == [0.5, 1.0, 2.0, 4.0, 8.0] and sum(slept) <= 20  # the next wait would pass the budget

    with pytest.raises(Flaky):
        retrying(never, transient=transient, backoff=Backoff(attempts=2), sleep=sleep, clock=lambda: now[0])

    def refused() -> str:
        raise ValueError("not transient")

    slept.clear()
    with pytest.raises(ValueError):
        retrying(refused, transient=transient, sleep=sleep, clock=lambda: now[0])
    assert slept == []

    class Busy(Flaky):
        retry_after_s = 7.0

    busy = iter([Busy(), "later"])

    def once_busy() -> str:
        value = next(busy)
        if isinstance(value, Exception):
            raise value
        return value

    assert retrying(once_busy, transient=transient, sleep=sleep, clock=lambda: now[0]) == "later"
    assert slept == [7.0]  # the service said when to come back

    slept.clear()
    with pytest.raises(Flaky):
        retrying(never, transient=transient, backoff=at_once(3), sleep=sleep, clock=lambda: now[0])
    assert slept == []  # tried again at once, three times in all

    monkeypatch.setenv("WARMUP_RETRY_S", "5")
    assert retry_budget_s() == 5.0
    monkeypatch.delenv("WARMUP_RETRY_S")
    assert retry_budget_s() == 60.0


def test_the_offline_fallback_finds_an_install_pulled_with_other_data_facts(tmp_path):
    spec = Spec.model_validate(
        {
            "trainer": "sft",
            "model": "tiny",
            "args": {"max_length": 64},
            "target": {"backend": "inductor", "device": "cpu"},
        }
    )
    with_facts = spec.model_copy(update={"data": DataFacts(max_tokens=40, num_train_examples=10)})
    other_job = spec.model_copy(update={"args": {"max_length": 128}})
    assert len({spec.key(), with_facts.key(), other_job.key()}) == 3
    for installed in (with_facts, other_job):
        save_local_manifest(
            tmp_path, manifest_of([]).model_copy(update={"spec_key": installed.key()}), installed
        )

    assert find_installed(tmp_path, with_facts) is not None
    manifest, found = find_installed(tmp_path, spec) or (None, None)
    assert found == with_facts and manifest is not None and manifest.spec_key == with_facts.key()
    other_config = spec.model_copy(update={"args": {"max_length": 256}})
    assert find_installed(tmp_path, other_config) is None


def test_pulls_into_one_directory_at_once_each_keep_their_staging_and_all_install(server, tmp_path):  # noqa: F811
    """Eight pulls at once (threads: an flock of one is held against the others' as between processes),
    with a dead pull's leftovers there: each installs, none removes another's staged files."""
    import threading

    files = [server.file(f"k{i:02d}/entry", os.urandom(2000 + i)) for i in range(40)]
    dest = tmp_path / "cache"
    dest.mkdir()
    dead_pulls_leftovers(dest)
    errors: list[BaseException] = []
    results = []

    def pull() -> None:
        try:
            results.append(install(manifest_of(files), dest, HttpBlobSource(None), parallel=2))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=pull) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(results) == 8
    assert sum(r.removed_leftovers[0] for r in results) == 2  # removed once, by whichever swept first
    assert not (dest / TEMP_DIR_NAME).exists()
    for file in files:
        assert hashlib.sha256((dest / file.path).read_bytes()).hexdigest() == file.sha256
