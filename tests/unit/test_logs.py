"""Structured logs: context fields (task and job ids) on every line, and no secret in any format."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tests.fixtures import factories
from tests.fixtures.factories import cpu_toolchain
from warmup.db.engine import make_engine
from warmup.db.queue import TaskQueue
from warmup.logs import configure_logging, log_context, redact
from warmup.store import LocalBlobStore
from warmup.worker.loop import Worker, WorkerOptions

SECRETS = {
    "Authorization: Bearer wu_AAAAbbbbCCCCdddd1234": "wu_AAAAbbbbCCCCdddd1234",
    "postgresql+psycopg://warmup:hunter2-pw@db:5432/warmup": "hunter2-pw",
    "GET /?token=wu_QQQQwwwwEEEErrrr5678 HTTP/1.1": "wu_QQQQwwwwEEEErrrr5678",
    "https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAEXAMPLE%2F20260101&X-Amz-Signature=deadbeefcafe": "deadbeefcafe",
    "host=db user=warmup password=letmein123 dbname=warmup": "letmein123",
    "aws_secret_access_key = wJalrXUtnFEMIK7MDENG": "wJalrXUtnFEMIK7MDENG",
}


@pytest.mark.parametrize("text", list(SECRETS))
def test_redact_removes_each_kind_of_secret(text: str) -> None:
    cleaned = redact(text)
    assert SECRETS[text] not in cleaned and "***" in cleaned


def test_redact_keeps_what_is_not_secret() -> None:
    text = "task 12 (train 4x256): done in 61.2s; store s3://bucket/prefix at http://seaweedfs:8333"
    assert redact(text) == text


class Captured:
    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def getvalue(self) -> str:
        return self.capsys.readouterr().err


@pytest.fixture
def captured(capsys: pytest.CaptureFixture[str]) -> Captured:
    """What the handler configure_logging installs writes to stderr (conftest puts the root back)."""
    return Captured(capsys)


def _install(fmt: str, captured: Captured) -> None:
    configure_logging(fmt, "INFO")
    captured.getvalue()  # start from here


def test_json_lines_carry_context_and_redact_tracebacks(captured: Captured) -> None:
    _install("json", captured)
    log = logging.getLogger("warmup.test")
    with log_context(task_id=7, signature="abc123"):
        log.info("uploading %d files", 3, extra={"job_id": "j-1"})
        try:
            raise RuntimeError("cannot connect to postgresql://u:pa55word@db/x")
        except RuntimeError:
            log.exception("failed")
    log.info("outside")
    first, second, third = (json.loads(line) for line in captured.getvalue().splitlines())
    assert first["task_id"] == 7 and first["signature"] == "abc123" and first["job_id"] == "j-1"
    assert (
        first["msg"] == "uploading 3 files" and first["level"] == "INFO" and first["logger"] == "warmup.test"
    )
    assert "RuntimeError" in second["msg"] and "pa55word" not in second["msg"] and "u:***@db" in second["msg"]
    assert "task_id" not in third


def test_kv_and_text_formats(captured: Captured) -> None:
    _install("kv", captured)
    with log_context(task_id=3):
        logging.getLogger("warmup.test").warning("token wu_0123456789abcdef leaked?")
    line = captured.getvalue().strip()
    assert " level=WARNING " in line and " task_id=3 " in line and 'msg="token wu_*** leaked?"' in line
    _install("text", captured)
    with log_context(job_id="j-9"):
        logging.getLogger("warmup.test").info("ready")
    assert captured.getvalue().splitlines()[-1].endswith("warmup.test: ready [job_id=j-9]")
    with pytest.raises(ValueError, match="log format"):
        configure_logging("xml")


def test_worker_log_lines_carry_the_task_id(sqlite_url: str, tmp_path: Path, captured: Captured) -> None:
    """The real worker loop, on a task no job needs any more (so it stops before compiling)."""
    _install("json", captured)
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
    outcome = worker.process(task.model_copy(update={"spec": None}))
    assert outcome.status == "failed"
    records = [json.loads(line) for line in captured.getvalue().splitlines()]
    rehearsing = next(r for r in records if "rehearsing" in r["msg"])
    assert rehearsing["task_id"] == task.id and rehearsing["worker_id"] == "w-1"
    assert rehearsing["signature"] == task.signature_key[:12]
    engine.dispose()
