"""GET /metrics against real databases: every number checked against a state built with the queue."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures import factories
from warmup.api.app import create_app
from warmup.api.services import Services
from warmup.db.tokens import TokenStore
from warmup.settings import Settings

pytestmark = pytest.mark.timeout(120)
A, B = factories.toolchain("cpu-avx2"), factories.toolchain("cpu-avx512")


def scrape(client: TestClient, **kwargs) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = client.get("/metrics", **kwargs)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def complete(services: Services, toolchain_key: str, seconds: float) -> int:
    task = services.queue.claim("w", toolchain_key, lease_s=60)
    assert task is not None
    files = factories.fake_files(task.id)
    services.queue.reserve_blobs(files)
    services.queue.complete(task.id, "w", files, compile_seconds=seconds)
    return task.id


@pytest.fixture
def services(db_url: str, tmp_path: Path):
    started = Services.start(Settings(data_dir=tmp_path, database_url=db_url, auth="off"))
    yield started
    started.close()


def test_metrics_report_the_database(services: Services) -> None:
    ready = services.queue.submit_job(factories.spec(max_length=512), A, factories.signatures(2))
    complete(services, A.key, 30.0)
    complete(services, A.key, 90.0)
    services.queue.submit_job(factories.spec(max_length=1024), A, factories.signatures(3, batch=8))
    complete(services, A.key, 10.0)
    assert services.queue.claim("w", A.key, lease_s=60) is not None  # one running, one queued
    services.queue.submit_job(factories.spec(max_length=2048), B, factories.signatures(1))
    failing = services.queue.claim("w", B.key, lease_s=60)
    services.queue.fail(failing.id, "w", "boom", retry=False)
    services.repository.register_worker("worker-1", A, pool="cpu")

    signatures = [s.key for s in factories.signatures(2)]
    services.queue.record_coverage(ready.job_id, met=signatures, missed=[], fresh_compiles=0)
    services.queue.record_coverage(
        ready.job_id, met=signatures, missed=[factories.signatures(2)[1]], fresh_compiles=1
    )

    with TestClient(create_app(services=services)) as client:
        client.post("/v1/manifests", json={})  # 422
        client.get(f"/v1/blobs/{factories.fake_files(1)[0].sha256}")  # recorded, but no bytes: 404
        client.get("/v1/warmups")  # not a pull
        metrics = scrape(client)
        # A later run: the running total of seconds saved adds it, and only it.
        services.queue.record_coverage(ready.job_id, met=signatures, missed=[], fresh_compiles=0)
        again = scrape(client)

    def value(name: str, **labels: str) -> float:
        return metrics[(name, tuple(sorted(labels.items())))]

    assert value("warmup_database_up") == 1
    assert {
        s: value("warmup_jobs", state=s) for s in ("ready", "running", "queued", "failed", "incomplete")
    } == {
        "ready": 1,
        "running": 1,
        "queued": 0,
        "failed": 1,
        "incomplete": 0,
    }
    a, b = (
        {"toolchain": "inductor/cpu-avx2", "toolchain_key": A.key[:12]},
        {
            "toolchain": "inductor/cpu-avx512",
            "toolchain_key": B.key[:12],
        },
    )
    assert value("warmup_tasks", state="done", **a) == 3
    assert value("warmup_tasks", state="running", **a) == 1
    assert value("warmup_tasks", state="queued", **a) == 1
    assert value("warmup_tasks", state="failed", **b) == 1
    assert value("warmup_workers", **a) == 1
    assert value("warmup_entries", **a) == 3

    assert value("warmup_compile_duration_seconds_count") == 3
    assert value("warmup_compile_duration_seconds_sum") == 130
    assert value("warmup_compile_duration_seconds_bucket", le="5.0") == 0
    assert value("warmup_compile_duration_seconds_bucket", le="15.0") == 1
    assert value("warmup_compile_duration_seconds_bucket", le="30.0") == 2
    assert value("warmup_compile_duration_seconds_bucket", le="60.0") == 2
    assert value("warmup_compile_duration_seconds_bucket", le="120.0") == 3
    assert value("warmup_compile_duration_seconds_bucket", le="+Inf") == 3
    assert value("warmup_task_duration_seconds_count") == 3  # the done tasks; durations vary
    assert value("warmup_task_duration_seconds_bucket", le="+Inf") == 3
    assert value("warmup_task_duration_seconds_sum") >= 0

    assert value("warmup_blobs") == 6 and value("warmup_blob_bytes") == 60  # 3 entries x 2 files x 10 B
    assert value("warmup_coverage_reports_total") == 2
    assert value("warmup_fresh_compiles_total") == 1
    # Report 1 met both signatures warm (30 s + 90 s); report 2 compiled the second one afresh.
    status = services.repository.job_status(ready.job_id)
    seconds = {s.key: s.compile_seconds for s in status.signatures}
    assert sorted(seconds.values()) == [30.0, 90.0]
    assert value("warmup_compile_seconds_saved_total") == 120.0 + seconds[signatures[0]]
    assert again[("warmup_compile_seconds_saved_total", ())] == 240.0 + seconds[signatures[0]]
    assert again[("warmup_coverage_reports_total", ())] == 3

    assert value("warmup_pull_requests_total", kind="manifest", status="422") == 1
    assert value("warmup_pull_requests_total", kind="blob", status="404") == 1
    assert not [k for k in metrics if k[0] == "warmup_pull_requests_total" and ("status", "200") in k[1]]


def test_metrics_auth_and_a_database_that_does_not_answer(sqlite_url: str, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=sqlite_url, auth="required", metrics_public=False)
    services = Services.start(settings)
    _, reader = TokenStore(services.engine).create("prometheus", ["read"])
    with TestClient(create_app(services=services)) as client:
        assert client.get("/metrics").status_code == 401
        assert scrape(client, headers={"Authorization": f"Bearer {reader}"})[("warmup_database_up", ())] == 1
        # The scrape still answers, and says so, when a query fails.
        with services.engine.begin() as connection:
            connection.exec_driver_sql("DROP TABLE coverage_reports")
        down = scrape(client, headers={"Authorization": f"Bearer {reader}"})
        assert down[("warmup_database_up", ())] == 0
        assert not [name for name, _ in down if name.startswith("warmup_jobs")]
    services.close()
