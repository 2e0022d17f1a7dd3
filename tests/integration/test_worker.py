"""Real `warmup worker` processes against a real database and store.

Signatures that compile nothing (labelled eager by the planner) go through the whole worker path
(claim, rehearse, upload, complete, publish the manifest) in a fraction of a second, which lets these
tests run many tasks; the compiling paths are in tests/reliability/test_worker_killed_mid_compile.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from tests.fixtures.factories import eager_signatures
from tests.support.tiny_model import write_tiny_model
from warmup.db import models as m
from warmup.db.engine import make_engine
from warmup.db.manifests import manifest_object_key
from warmup.db.queue import TaskQueue
from warmup.db.records import Keyed
from warmup.db.repository import Repository
from warmup.job.spec import load_spec
from warmup.signature import Signature
from warmup.store import open_store
from warmup.toolchain.probes import current_toolchain
from warmup.worker.loop import Worker, WorkerOptions


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model"))


def spec_of(model_dir: Path):
    return load_spec(
        {
            "trainer": "sft",
            "model": str(model_dir),
            "args": {
                "per_device_train_batch_size": 2,
                "max_length": 64,
                "pad_to_multiple_of": 32,
                "torch_compile": True,
                "bf16": False,
            },
            "target": {"backend": "inductor", "device": "cpu"},
        }
    )


def worker_command(db_url: str, store_url: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "warmup",
        "worker",
        "--database-url",
        db_url,
        "--store",
        store_url,
        "--exit-when-idle",
        *extra,
    ]


def test_four_worker_processes_do_twenty_tasks_exactly_once(pg_url, tmp_path, model_dir):
    store_url = str(tmp_path / "blobs")
    engine = make_engine(pg_url)
    toolchain = current_toolchain("inductor", "cpu")
    spec = spec_of(model_dir)
    result = TaskQueue(engine).submit_job(
        Keyed.of(spec), Keyed.of(toolchain), [Keyed.of(s) for s in eager_signatures(20)]
    )
    assert len(result.enqueued) == 20

    workers = [
        subprocess.Popen(worker_command(pg_url, store_url), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(4)
    ]
    logs = [w.communicate(timeout=300)[0].decode() for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0, 0], logs

    with engine.connect() as connection:
        tasks = connection.execute(select(m.Task.state, m.Task.attempts, m.Task.lease_owner)).all()
        entries = connection.execute(select(m.Entry.signature_key)).scalars().all()
    assert len(tasks) == 20 and {t.state for t in tasks} == {m.TaskState.done}
    assert all(t.attempts == 1 for t in tasks)  # nobody did a task twice
    assert len(entries) == len(set(entries)) == 20
    done_lines = sum(log.count(": done in") for log in logs)
    assert done_lines == 20
    status = Repository(engine).job_status(result.job_id)
    assert status.state == "ready"
    # The worker that completed the job wrote its manifest into the bucket for pods without the API.
    manifest = json.loads(open_store(store_url).get_object(manifest_object_key(spec.key(), toolchain.key())))
    assert len(manifest["signatures"]) == 20 and manifest["missing"] == []
    engine.dispose()


def test_a_supervisor_re_executes_itself_once_per_process(pg_url, tmp_path, model_dir):
    """`--concurrency 2` starts two worker processes, each the same command with its own arguments
    (and the settings the environment gives), which share the queue: every task done once."""
    engine = make_engine(pg_url)
    toolchain = current_toolchain("inductor", "cpu")
    result = TaskQueue(engine).submit_job(
        Keyed.of(spec_of(model_dir)), Keyed.of(toolchain), [Keyed.of(s) for s in eager_signatures(6)]
    )
    command = worker_command(pg_url, "IGNORED", "--concurrency", "2")
    command[command.index("IGNORED") - 1 : command.index("IGNORED") + 1] = []  # the store from the env
    env = {**os.environ, "WARMUP_STORE_URL": str(tmp_path / "blobs")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    workers = {
        line.split(" ready for ")[0].split()[-1] for line in done.stderr.splitlines() if " ready for " in line
    }
    assert len(workers) == 2, done.stderr
    with engine.connect() as connection:
        tasks = connection.execute(select(m.Task.state, m.Task.attempts)).all()
    assert len(tasks) == 6 and {(t.state, t.attempts) for t in tasks} == {(m.TaskState.done, 1)}
    assert Repository(engine).job_status(result.job_id).state == "ready"
    engine.dispose()


def test_a_worker_registers_its_pool_per_world_size(sqlite_url, tmp_path):
    options = WorkerOptions(
        database_url=sqlite_url,
        store_url=str(tmp_path / "blobs"),
        pool="cpu",
        world_sizes=(1, 2),
        exit_when_idle=True,
    )
    worker = Worker(options)
    repository = Repository(worker.engine)
    seen: dict[int, str | None] = {}

    # Registration happens when the worker runs; look while it is registered, from its own claim.
    original = worker._claim

    def claim_and_look():
        for size in (1, 2):
            found = repository.resolve_pool("cpu", size)
            seen[size] = found.key if found else None
        return original()

    worker._claim = claim_and_look  # type: ignore[method-assign]
    worker.run()
    assert seen[1] == current_toolchain("inductor", "cpu").key()
    assert seen[2] == current_toolchain("inductor", "cpu", world_size=2).key()
    assert repository.list_workers() == []  # removed on exit


def test_an_unrehearsable_task_fails_at_once_with_the_reason(sqlite_url, tmp_path, model_dir):
    engine = make_engine(sqlite_url)
    toolchain = current_toolchain("inductor", "cpu")
    # A GRPO training width no generation round can produce (24 is no 16-padded prompt + completion of <= 8):
    # the rehearsal refuses the signature before any work.
    grpo = load_spec(
        {
            "trainer": "grpo",
            "model": str(model_dir),
            "args": {
                "torch_compile": True,
                "bf16": False,
                "max_completion_length": 8,
                "pad_to_multiple_of": 16,
            },
            "target": {"backend": "inductor", "device": "cpu"},
        }
    )
    signature = Signature(
        phase="train", batch=8, seq_len=24, trainer="grpo", model="cafe", dtype="float32", compile="inductor"
    )
    TaskQueue(engine).submit_job(Keyed.of(grpo), Keyed.of(toolchain), [Keyed.of(signature)])
    done = subprocess.run(
        worker_command(sqlite_url, str(tmp_path / "blobs"), "--max-attempts", "3"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 3, done.stdout + done.stderr  # a task failed
    with engine.connect() as connection:
        task = connection.execute(select(m.Task.state, m.Task.attempts, m.Task.error)).one()
    assert task.state == m.TaskState.failed and task.attempts == 1  # permanent: not retried
    assert "cannot be split" in task.error
    engine.dispose()


def test_sigterm_with_nothing_running_exits_cleanly(sqlite_url, tmp_path):
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "warmup",
            "worker",
            "--database-url",
            sqlite_url,
            "--store",
            str(tmp_path / "b"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    engine = make_engine(sqlite_url)
    deadline = time.monotonic() + 120
    while not Repository(engine).list_workers():  # registered: its loop is running
        assert time.monotonic() < deadline and worker.poll() is None
        time.sleep(0.2)
    worker.terminate()
    output = worker.communicate(timeout=60)[0].decode()
    assert worker.returncode == 0, output
    assert Repository(engine).list_workers() == []
    engine.dispose()


@pytest.mark.parametrize("concurrency", ["1", "2"])
def test_a_worker_on_a_database_never_migrated_says_so_in_one_line(tmp_path, capsys, concurrency):
    """A worker does not migrate (the service does as it starts): a fresh database is named, not a missing
    table's traceback, and a group of workers says it once, before starting its processes."""
    from warmup.worker.main import main

    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    options = ["--database-url", url, "--store", str(tmp_path / "blobs"), "--exit-when-idle"]
    assert main([*options, "--concurrency", concurrency]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [
        f"error: the database at {url} has no trl-warmup schema: start the service against it first "
        "(`warmup serve` migrates it as it starts), or check the URL"
    ]
