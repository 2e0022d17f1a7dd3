"""Database restart: PostgreSQL goes away while a job is in flight; the API and a real worker ride it out.

A private PostgreSQL server (started here on a free port, never the shared one) is stopped and
started again while a real `warmup worker` process works through a job and a live API serves it:

- while the database is down, every route that needs it answers 503 `database_unavailable` with
  Retry-After (never a 500, never a hang), /readyz says why, /healthz stays 200;
- once it is back, the API answers again without being restarted, the worker (the same process)
  carries on, and the job completes with each task done once and no blob lost;
- the worker logs one line when an outage starts and one when it ends, not one per retry.

The fast test runs a job of eager signatures (the whole worker path, no compile), submitted through
the queue because the API never enqueues eager signatures (they have nothing to warm); it stops the
server twice, once cleanly (`-m fast`) and once as a crash (`-m immediate`: crash recovery on start).
The slow test submits a compiling job through the API and stops the server while the worker is
mid-compile, so its heartbeats, and then its upload and completion, meet the outage.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError, OperationalError

from tests.fixtures.factories import artifact, eager_signatures, one_signature_sft
from tests.fixtures.services import PostgresServer, _postgres_bindir, _tail, free_port
from tests.reliability.audit import audit_store
from tests.reliability.ledger import Row, record
from tests.support.live_server import serve
from warmup.api.services import Services
from warmup.db import models as m
from warmup.db.engine import POSTGRES_CONNECT_TIMEOUT_S, make_engine
from warmup.db.migrate import upgrade
from warmup.db.outage import Outage, is_unavailable
from warmup.db.records import Keyed
from warmup.job.spec import Spec, load_spec
from warmup.settings import Settings
from warmup.toolchain.model import Toolchain
from warmup.toolchain.probes import current_toolchain

EAGER_TASKS = 60
OUTAGE_S = 4.0  # how long the server stays down: longer than a heartbeat period, so every client notices
UNAVAILABLE = "database unavailable ("  # the worker's line when an outage starts
BACK = "database answers again after"  # ... and when it ends


# --- a private PostgreSQL server that can be stopped and started -------------------------------


@dataclass
class PrivatePostgres:
    server: PostgresServer
    bindir: Path
    data: Path
    log: Path
    options: str
    run_as: str | None

    def _pg_ctl(self, *args: str) -> None:
        result = subprocess.run(
            [str(self.bindir / "pg_ctl"), "-D", str(self.data), *args],
            user=self.run_as,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise AssertionError(
                f"pg_ctl {args[-1]} failed:\n{result.stdout}{result.stderr}\n{_tail(self.log)}"
            )

    def start(self) -> None:
        self._pg_ctl("-l", str(self.log), "-o", self.options, "-w", "-t", "60", "start")

    def stop(self, mode: str) -> None:
        """`fast`: a clean shutdown (sessions terminated); `immediate`: a crash, recovered at start."""
        self._pg_ctl("-m", mode, "-w", "-t", "60", "stop")

    def fresh_database(self) -> str:
        url = self.server.create_database(f"warmup_restart_{uuid.uuid4().hex[:10]}")
        upgrade(url)
        return url


@pytest.fixture(scope="module")
def private_postgres() -> Iterator[PrivatePostgres]:
    """Like tests/fixtures/services.py's throwaway server, but ours to stop and start."""
    bindir = _postgres_bindir()
    root = Path(tempfile.mkdtemp(prefix="warmup-pg-restart-"))
    run_as = "postgres" if os.geteuid() == 0 else None  # initdb refuses to run as root
    if run_as:
        account = pwd.getpwnam(run_as)
        os.chown(root, account.pw_uid, account.pw_gid)
    port = free_port()
    # synchronous_commit stays on: after an immediate stop, every commit a client saw must be there.
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    pg = PrivatePostgres(
        PostgresServer("127.0.0.1", port, throwaway=True),
        bindir,
        root / "data",
        root / "server.log",
        options,
        run_as,
    )
    try:
        subprocess.run(
            [
                str(bindir / "initdb"),
                "-D",
                str(pg.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            user=run_as,
            capture_output=True,
            check=True,
            timeout=120,
        )
        pg.start()
        yield pg
    finally:
        if (pg.data / "postmaster.pid").exists():
            subprocess.run(
                [str(bindir / "pg_ctl"), "-D", str(pg.data), "-m", "immediate", "-w", "stop"],
                user=run_as,
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(root, ignore_errors=True)


# --- what clients see -------------------------------------------------------------------------


@dataclass
class Answers:
    """Every HTTP answer the test got: a 5xx is unexpected unless it is the documented 503."""

    requests: int = 0
    unavailable: int = 0  # 503 database_unavailable with Retry-After (or /readyz's 503)
    unexpected_5xx: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, http: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response:
        started = time.monotonic()
        try:
            response = http.request(method, path, **kwargs)
        except httpx.TransportError as error:  # a hang or a dropped connection is a failure too
            with self.lock:
                self.requests += 1
                self.unexpected_5xx.append(f"{method} {path}: no answer ({error!r})")
            raise
        with self.lock:
            self.requests += 1
            self.latencies_ms.append((time.monotonic() - started) * 1000)
            if response.status_code >= 500:
                if _is_documented_503(path, response):
                    self.unavailable += 1
                else:
                    self.unexpected_5xx.append(
                        f"{method} {path}: {response.status_code} {response.text[:300]}"
                    )
        return response

    def p99_ms(self) -> float:
        ordered = sorted(self.latencies_ms)
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1)


def _is_documented_503(path: str, response: httpx.Response) -> bool:
    if response.status_code != 503 or not response.headers.get("retry-after", "").isdigit():
        return False
    body = response.json()
    if path == "/readyz":
        return body["status"] == "unavailable" and any(p.startswith("database") for p in body["problems"])
    return body["detail"]["error"] == "database_unavailable"


class Poller(threading.Thread):
    """Asks for the job's status every 50 ms for the whole test: sees the transitions a restart goes
    through (shutting down, refused, starting up, stale pooled connections) as a client would."""

    def __init__(self, base_url: str, job_id: str, answers: Answers) -> None:
        super().__init__(daemon=True)
        self.base_url, self.job_id, self.answers = base_url, job_id, answers
        self.done = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=15) as http:
            while not self.done.wait(0.05):
                with contextlib.suppress(httpx.TransportError):  # counted as unexpected
                    self.answers.get(http, "GET", f"/v1/warmups/{self.job_id}")


def probe_while_down(http: httpx.Client, answers: Answers, spec: Spec, toolchain: Toolchain) -> None:
    """Every kind of route while the database is down: the documented 503, or an answer without it."""
    assert answers.get(http, "GET", "/healthz").status_code == 200  # the process itself is fine
    ready = answers.get(http, "GET", "/readyz")
    assert ready.status_code == 503 and ready.headers["retry-after"].isdigit(), ready.text
    assert "database" in ready.json()["problems"][0]
    body = {"spec": spec.model_dump(mode="json"), "toolchain": toolchain.model_dump(mode="json")}
    for method, path, kwargs in [
        ("GET", "/v1/warmups", {}),
        ("GET", f"/v1/warmups/{uuid.uuid4()}", {}),
        ("POST", "/v1/warmups", {"json": body}),
        ("POST", "/v1/manifests", {"json": body}),
        ("GET", "/v1/tasks/1/log", {}),
        ("GET", "/", {}),
    ]:
        response = answers.get(http, method, path, **kwargs)
        assert response.status_code == 503, f"{method} {path}: {response.status_code} {response.text[:300]}"
        assert response.headers["retry-after"].isdigit()
        detail = response.json()["detail"]
        assert detail["error"] == "database_unavailable" and "retry" in detail["message"]
    # The scrape still answers (and says the database did not), so dashboards see the outage.
    assert answers.get(http, "GET", "/metrics").status_code == 200


def wait_for(what: str, check: Any, timeout: float, *, worker: subprocess.Popen[bytes], log: Path) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert worker.poll() is None, f"the worker died ({worker.returncode}):\n{_tail(log, 60)}"
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}:\n{_tail(log, 60)}")


def job_counts(http: httpx.Client, job_id: str) -> dict[str, int] | None:
    response = http.get(f"/v1/warmups/{job_id}")
    return response.json()["counts"] if response.status_code == 200 else None


def outage(pg: PrivatePostgres, mode: str, during: Any) -> None:
    """Stop the server, run `during` against the dead database, keep it down OUTAGE_S, start it."""
    pg.stop(mode)
    down_at = time.monotonic()
    try:
        during()
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
    finally:
        pg.start()


def start_worker(db_url: str, store_url: str, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "warmup",
                "worker",
                "--database-url",
                db_url,
                "--store",
                store_url,
                *extra,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def seed_entries(services: Services, model_dir: Path, scratch: Path, count: int) -> None:
    """Entries with real blobs from before the outages: what a crash restart must not lose. Under
    another toolchain (world size 8), so that the worker leaves their tasks alone."""
    queue = services.queue
    spec = Keyed.of(eager_spec(model_dir))
    toolchain = Keyed.of(current_toolchain("inductor", "cpu", world_size=8))
    signatures = [Keyed.of(s) for s in eager_signatures(count, seq_offset=1000)]
    queue.submit_job(spec, toolchain, signatures)
    for _ in range(count):
        task = queue.claim("seeder", toolchain.key, lease_s=60)
        assert task is not None
        files = [artifact(scratch / f"task{task.id}", f"kernel{i}.so", size=4096) for i in range(2)]
        queue.reserve_blobs([ref for _, ref in files])
        for path, ref in files:
            services.store.put_file(path, ref.sha256)
        queue.complete(task.id, "seeder", [ref for _, ref in files], compile_seconds=1.0)


def eager_spec(model_dir: Path) -> Spec:
    return load_spec(
        {
            "trainer": "sft",
            "model": str(model_dir),
            "args": {
                "per_device_train_batch_size": 2,
                "max_length": 64,
                "torch_compile": True,
                "bf16": False,
            },
            "target": {"backend": "inductor", "device": "cpu"},
        }
    )


@pytest.fixture
def services_on(private_postgres: PrivatePostgres, tmp_path: Path) -> Iterator[Services]:
    url = private_postgres.fresh_database()
    settings = Settings(data_dir=tmp_path, database_url=url, store_url=str(tmp_path / "blobs"), auth="off")
    services = Services.start(settings)
    yield services
    services.close()


def task_rows(engine: Engine) -> list[Any]:
    with engine.connect() as connection:
        return connection.execute(
            select(m.Task.id, m.Task.state, m.Task.attempts, m.Task.toolchain_key)
        ).all()


# --- scenarios --------------------------------------------------------------------------------


def test_a_job_rides_out_a_clean_restart_and_a_crash_of_the_database(
    private_postgres: PrivatePostgres,
    services_on: Services,
    tiny_model_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    services, pg = services_on, private_postgres
    db_url = services.settings.resolved_database_url
    seed_entries(services, tiny_model_dir, tmp_path / "seed", count=3)
    spec, toolchain = eager_spec(tiny_model_dir), current_toolchain("inductor", "cpu")
    job = services.queue.submit_job(
        Keyed.of(spec), Keyed.of(toolchain), [Keyed.of(s) for s in eager_signatures(EAGER_TASKS)]
    )
    assert len(job.enqueued) == EAGER_TASKS
    job_id = str(job.job_id)
    answers = Answers()
    log = tmp_path / "worker.log"
    worker = start_worker(
        db_url, services.settings.resolved_store_url, log, "--poll-interval", "0.2", "--lease", "20"
    )
    with (
        caplog.at_level(logging.WARNING, logger="warmup.api"),
        serve(services) as base_url,
        httpx.Client(base_url=base_url, timeout=15) as http,
    ):
        poller = Poller(base_url, job_id, answers)
        poller.start()
        try:
            ready_at_outage: list[int] = []
            for mode, after_ready in (("fast", 5), ("immediate", EAGER_TASKS // 2)):
                counts = wait_for(
                    f"{after_ready} tasks done",
                    lambda n=after_ready: (c := job_counts(http, job_id)) and c.get("ready", 0) >= n and c,
                    180,
                    worker=worker,
                    log=log,
                )
                ready_at_outage.append(counts.get("ready", 0))
                outage(pg, mode, lambda: probe_while_down(http, answers, spec, toolchain))
                # The same API process answers again (its pool reconnects), and the worker is alive.
                wait_for(
                    "the API to answer again", lambda: job_counts(http, job_id), 30, worker=worker, log=log
                )
            wait_for(
                "the job to complete",
                lambda: http.get(f"/v1/warmups/{job_id}").json()["state"] == "ready",
                180,
                worker=worker,
                log=log,
            )
        finally:
            poller.done.set()
            poller.join(timeout=30)
            if worker.poll() is None:
                worker.terminate()
            worker.wait(timeout=60)
    output = log.read_text(errors="replace")
    assert worker.returncode == 0, output[-4000:]  # SIGTERM: a clean exit, not a crash
    # Both outages hit the job in flight: some tasks done, some still to do.
    assert all(0 < ready < EAGER_TASKS for ready in ready_at_outage), ready_at_outage

    # The worker rode out both outages in one process, saying so once per outage.
    assert output.count(UNAVAILABLE) == 2 and output.count(BACK) == 2, output[-4000:]
    assert "Traceback" not in output, output[-4000:]

    check = make_engine(db_url)
    try:
        tasks = [t for t in task_rows(check) if t.toolchain_key == toolchain.key()]
        assert len(tasks) == EAGER_TASKS and {t.state for t in tasks} == {m.TaskState.done}
        assert all(t.attempts == 1 for t in tasks)  # no task claimed or done twice
        assert output.count(": done in") == EAGER_TASKS
        with check.connect() as connection:
            entries = connection.execute(select(m.Entry.signature_key)).scalars().all()
        assert len(entries) == len(set(entries)) == EAGER_TASKS + 3
        audit = audit_store(check, services.store)
    finally:
        check.dispose()
    assert audit.lost == 0 and audit.files == 6, audit  # the seeded blobs survived the crash restart

    assert answers.unexpected_5xx == [], answers.unexpected_5xx
    # The poller saw the outages as 503s, not as errors or hangs; the API said so in a line or two
    # (one per outage at most: each is shorter than its log interval), not one per request.
    api_warnings = [r for r in caplog.records if r.name == "warmup.api" and UNAVAILABLE in r.getMessage()]
    assert 1 <= len(api_warnings) <= 2 < answers.unavailable, (len(api_warnings), answers.unavailable)
    record(
        Row(
            scenario="database restart (clean + crash) under a job of eager tasks",
            faults_injected=2,
            jobs_completed=1,
            data_lost=audit.lost,
            responses_5xx=len(answers.unexpected_5xx),
            requests=answers.requests,
            p99_ms=answers.p99_ms(),
        )
    )


def compiling_spec(model_dir: Path) -> Spec:
    """One training signature that Inductor compiles (20-50 s on a quiet CPU)."""
    return load_spec(one_signature_sft(model_dir))


def test_a_worker_mid_compile_rides_out_a_restart(
    private_postgres: PrivatePostgres, services_on: Services, tiny_model_dir: Path, tmp_path: Path
) -> None:
    services, pg = services_on, private_postgres
    db_url, store_url = services.settings.resolved_database_url, services.settings.resolved_store_url
    spec, toolchain = compiling_spec(tiny_model_dir), current_toolchain("inductor", "cpu")
    answers = Answers()
    log = tmp_path / "worker.log"
    with serve(services) as base_url, httpx.Client(base_url=base_url, timeout=15) as http:
        body = {"spec": spec.model_dump(mode="json"), "toolchain": toolchain.model_dump(mode="json")}
        submitted = answers.get(http, "POST", "/v1/warmups", json=body)
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["id"]
        assert submitted.json()["counts"] == {"queued": 1}
        # Heartbeats every 2 s: the outage below outlasts one, so the worker meets it mid-compile.
        worker = start_worker(db_url, store_url, log, "--poll-interval", "0.5", "--lease", "8")
        poller = Poller(base_url, job_id, answers)
        poller.start()
        try:
            wait_for(
                "the worker to start rehearsing",
                lambda: "rehearsing" in log.read_text(),
                300,
                worker=worker,
                log=log,
            )
            outage(pg, "fast", lambda: probe_while_down(http, answers, spec, toolchain))
            wait_for("the API to answer again", lambda: job_counts(http, job_id), 30, worker=worker, log=log)
            wait_for(
                "the job to complete",
                lambda: http.get(f"/v1/warmups/{job_id}").json()["state"] == "ready",
                600,
                worker=worker,
                log=log,
            )
        finally:
            poller.done.set()
            poller.join(timeout=30)
            if worker.poll() is None:
                worker.terminate()
            worker.wait(timeout=60)
    output = log.read_text(errors="replace")
    assert worker.returncode == 0, output[-4000:]

    # One outage, met while the task was being compiled, and the task finished after it.
    assert output.count(UNAVAILABLE) == 1 and output.count(BACK) == 1, output[-4000:]
    assert (
        output.index("rehearsing")
        < output.index(UNAVAILABLE)
        < output.index(BACK)
        < output.index(": done in")
    )
    assert "Traceback" not in output, output[-4000:]

    check = make_engine(db_url)
    try:
        tasks = task_rows(check)
        assert [(t.state, t.attempts) for t in tasks] == [(m.TaskState.done, 1)]  # done once, not redone
        audit = audit_store(check, services.store)
    finally:
        check.dispose()
    assert audit.entries == 1 and audit.files > 0 and audit.lost == 0, audit

    assert answers.unexpected_5xx == [], answers.unexpected_5xx
    record(
        Row(
            scenario="database restart while a worker compiles (job submitted through the API)",
            faults_injected=1,
            jobs_completed=1,
            data_lost=audit.lost,
            responses_5xx=len(answers.unexpected_5xx),
            requests=answers.requests,
            p99_ms=answers.p99_ms(),
        )
    )


def test_a_worker_stopped_during_an_outage_exits_cleanly(
    private_postgres: PrivatePostgres, services_on: Services, tmp_path: Path
) -> None:
    """SIGTERM while the worker waits out an outage (a node drain during a database failover): it
    stops waiting and exits 0, saying so, without a traceback."""
    settings = services_on.settings
    log = tmp_path / "worker.log"
    worker = start_worker(
        settings.resolved_database_url, settings.resolved_store_url, log, "--poll-interval", "0.2"
    )
    try:
        wait_for(
            "the worker to be ready", lambda: "ready for" in log.read_text(), 120, worker=worker, log=log
        )
        private_postgres.stop("fast")
        try:
            wait_for(
                "the worker to meet the outage",
                lambda: UNAVAILABLE in log.read_text(),
                60,
                worker=worker,
                log=log,
            )
            worker.terminate()
            worker.wait(timeout=30)
        finally:
            private_postgres.start()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    output = log.read_text(errors="replace")
    record(Row(scenario="worker: SIGTERM while it waits out a database outage", faults_injected=1))
    assert worker.returncode == 0, output[-4000:]
    assert "stopped while the database is unavailable" in output and "Traceback" not in output, output[-4000:]


def test_a_database_that_never_answers_is_an_error_not_a_hang() -> None:
    """A server that accepts TCP connections but never speaks (hung, half failed over): connecting
    fails within the connect timeout, as an error the API and the workers treat as unavailable."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # the kernel completes the handshakes; nobody ever reads or answers
        engine = make_engine(f"postgresql://postgres@127.0.0.1:{listener.getsockname()[1]}/warmup")
        outcome: dict[str, BaseException] = {}

        def connect() -> None:
            try:
                engine.connect().close()
            except BaseException as error:  # handed to the test thread
                outcome["error"] = error

        thread = threading.Thread(target=connect, daemon=True)
        thread.start()
        thread.join(POSTGRES_CONNECT_TIMEOUT_S + 30)
        assert not thread.is_alive(), "connecting to a database that never answers hung"
        engine.dispose()
    assert is_unavailable(outcome["error"]), repr(outcome.get("error"))


# --- the worker's retry policy, on its own ------------------------------------------------------


def _refused() -> OperationalError:
    return OperationalError("SELECT 1", {}, ConnectionRefusedError("connection refused"))


def _flaky(failures: int, error: Exception) -> Any:
    """An operation that raises `error` `failures` times, then answers."""
    calls = {"n": 0}

    def operation() -> str:
        calls["n"] += 1
        if calls["n"] <= failures:
            raise error
        return "answered"

    operation.calls = calls  # type: ignore[attr-defined]
    return operation


def test_an_outage_is_ridden_out_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage(first_delay_s=0.001, max_delay_s=0.002, logger=logging.getLogger("test.outage"))
    assert outage.call(lambda: "first") == "first"  # the database answered once
    operation = _flaky(20, _refused())
    with caplog.at_level(logging.INFO, logger="test.outage"):
        assert outage.call(operation) == "answered"
    assert operation.calls["n"] == 21 and outage.outages == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and lines[0].startswith(UNAVAILABLE) and lines[1].startswith(BACK), lines


def test_a_database_never_reached_or_a_bad_statement_is_raised_at_once() -> None:
    never = Outage(first_delay_s=0.001)
    operation = _flaky(1, _refused())
    with pytest.raises(OperationalError):  # a wrong URL at start-up: report it, do not wait forever
        never.call(operation)
    assert operation.calls["n"] == 1

    outage = Outage(first_delay_s=0.001)
    outage.call(lambda: None)
    duplicate = IntegrityError("INSERT", {}, Exception("duplicate key"))
    operation = _flaky(1, duplicate)
    with pytest.raises(IntegrityError):  # a bug, not an outage: retrying would not help
        outage.call(operation)
    assert operation.calls["n"] == 1 and outage.outages == 0


def test_a_stopping_worker_stops_waiting_for_the_database() -> None:
    stop = threading.Event()
    outage = Outage(stop, first_delay_s=0.01, max_delay_s=0.01)
    outage.call(lambda: None)
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(OperationalError):
        outage.call(_flaky(10**9, _refused()))
    assert outage.outages == 1
