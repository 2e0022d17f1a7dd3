"""The status page in headless Chromium, against a live server with jobs in every state, caches under
two toolchains and coverage reports over a week. The screenshot is kept next to the test's temp files
(its path is printed) so that a person can look at it."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image
from sqlalchemy import update

from tests.fixtures import factories
from tests.support.chromium import Chromium, ensure_chromium
from tests.support.live_server import serve
from warmup.api.services import Services
from warmup.db import models as m
from warmup.db.columns import db_now
from warmup.db.records import FileRef
from warmup.db.tokens import TokenStore
from warmup.settings import Settings

pytestmark = pytest.mark.timeout(300)
A, B = factories.toolchain("cpu-avx2"), factories.toolchain("cpu-avx512")
WIDTH, HEIGHT = 1280, 1700


@pytest.fixture(scope="session")
def chromium_binary() -> str:
    return ensure_chromium()


def complete(services: Services, toolchain_key: str, seconds: float, size: int) -> str:
    task = services.queue.claim("w", toolchain_key, lease_s=60)
    assert task is not None
    files = [
        FileRef(
            path=f"{task.id}/{name}",
            sha256=hashlib.sha256(f"{task.id}{name}".encode()).hexdigest(),
            size=size,
        )
        for name in ("graph.bin", "kernel.so")
    ]
    services.queue.reserve_blobs(files)
    services.queue.complete(task.id, "w", files, compile_seconds=seconds)
    return task.signature_key


@pytest.fixture
def busy(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[Services, str]]:
    """A service with a ready job, a failed one (still running a task) and a queued one, and a week of
    training runs that compiled less and less."""
    services = Services.start(Settings(data_dir=tmp_path, database_url=sqlite_url, auth="required"))
    ready = services.queue.submit_job(factories.spec(max_length=512), A, factories.signatures(4))
    for seconds in (12.0, 45.0, 61.0, 130.0):
        complete(services, A.key, seconds, size=3_000_000)
    services.queue.submit_job(factories.spec(max_length=2048), A, factories.signatures(6, batch=8))
    complete(services, A.key, 20.0, size=1_500_000)
    complete(services, A.key, 25.0, size=1_500_000)
    failing = services.queue.claim("w", A.key, lease_s=60)
    services.queue.fail(failing.id, "w", "RehearsalError: out of memory", retry=False)
    services.queue.claim("w", A.key, lease_s=600)  # running
    services.queue.submit_job(factories.spec(max_length=1024), B, factories.signatures(3, batch=2))
    complete(services, B.key, 5.0, size=800_000)

    keys = [s.key for s in factories.signatures(4)]
    for fresh in [4, 3, 3, 2, 1, 1, 0, 0]:
        services.queue.record_coverage(ready.job_id, met=keys, missed=[], fresh_compiles=fresh)
    with services.engine.begin() as connection:  # spread the runs over the past week
        for report_id in range(1, 9):
            connection.execute(
                update(m.CoverageReport)
                .where(m.CoverageReport.id == report_id)
                .values(created_at=db_now(-(8 - report_id) * 86400.0))
            )
    _, token = TokenStore(services.engine).create("status", ["read"])
    yield services, token
    services.close()


def test_status_page_in_chromium(busy: tuple[Services, str], chromium_binary: str, tmp_path: Path) -> None:
    services, token = busy
    browser = Chromium(chromium_binary, tmp_path / "profile")
    with serve(services) as url:
        refused = browser.dump_dom(f"{url}/")
        assert "missing bearer token" in refused and "<table" not in refused
        assert httpx.get(f"{url}/", headers={"Authorization": f"Bearer {token}"}).status_code == 200

        page = f"{url}/?token={token}"
        dom = browser.dump_dom(page)
        shot = browser.screenshot(page, tmp_path / "status.png", WIDTH, HEIGHT)
    print(f"\nstatus page screenshot: {shot}")

    # The DOM: every job, its spec and toolchain, each signature's state and compile seconds.
    jobs = services.repository.list_jobs()
    assert len(jobs) == 3
    for job in jobs:
        assert str(job.id)[:8] in dom
    assert {job.state for job in jobs} == {"ready", "failed", "queued"}  # a failure fails its job
    assert "sft · tiny-llama" in dom
    assert "inductor/cpu-avx2" in dom and "inductor/cpu-avx512" in dom
    ready_titles = re.findall(r"<title>train 4x(\d+): ready, ([\d.]+) s</title>", dom)
    assert sorted(int(seq) for seq, _ in ready_titles) == [128, 256, 384, 512]
    assert sorted(float(s) for _, s in ready_titles) == [12.0, 45.0, 61.0, 130.0]
    assert len(re.findall(r"<title>train 8x\d+: (?:queued|running|failed)", dom)) == 4
    assert "RehearsalError: out of memory" in dom
    assert "3 blobs stored" not in dom and "14 blobs stored" in dom  # 7 entries x 2 files
    # Caches: 4 x 2 x 3 MB + 2 x 2 x 1.5 MB under A; 2 x 0.8 MB under B.
    assert "28.6 MiB" in dom and "1.5 MiB" in dom
    # Coverage: 8 runs, 14 fresh compiles, each run saved the 4 warm signatures' 248 s.
    assert "8 runs, 14 fresh compiles" in dom and "33m 04s" in dom
    assert dom.count('aria-label="fresh compiles per training run over time"') == 1
    assert dom.count("<rect") >= 4 + 6 + 3 + 2 + 16  # signature squares, bars, cache and coverage bars

    # The picture: the size asked for, not blank, and the chart colours are drawn.
    with Image.open(shot) as image:
        assert image.size == (WIDTH, HEIGHT)
        pixels = image.convert("RGB")
        colours = pixels.getcolors(maxcolors=1 << 20)
    assert colours is not None
    counts = {colour: count for count, colour in colours}
    assert len(counts) > 100  # text, tables and charts, not a uniform page
    for name, rgb in {"ready": (46, 125, 50), "failed": (198, 40, 40), "running": (21, 101, 192)}.items():
        assert counts.get(rgb, 0) > 50, f"no {name} colour in the screenshot"
