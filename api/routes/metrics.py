"""GET /metrics: Prometheus text format, every name prefixed `warmup_`.

Most numbers are read from the database at scrape time (a collector over `api.stats.Stats`), so they
are the same whichever API replica answers: aggregate them with max(), not sum(). Pull requests are
counted in this process (a counter per replica: sum() them). Blob downloads that go straight to S3
through presigned URLs do not pass through the API and are not counted here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from warmup.api.deps import authorize, bearer_token
from warmup.api.stats import Histogram, Stats

router = APIRouter(tags=["metrics"])
log = logging.getLogger("warmup.metrics")


class Metrics:
    """The app's registry: the database collector and the in-process pull counter."""

    def __init__(self, stats: Callable[[], Stats]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.pulls = Counter(
            "warmup_pull_requests",
            "Manifest and blob requests answered by this API process, by kind and HTTP status.",
            ["kind", "status"],
            registry=self.registry,
        )
        self.registry.register(DatabaseCollector(stats))


class DatabaseCollector(Collector):
    def __init__(self, stats: Callable[[], Stats]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("warmup_database_up", "1 when the scrape could read the database.")
        try:
            families = list(self._families(self.stats()))
        except Exception as error:  # the scrape still answers, and says the database did not
            log.warning("metrics: cannot read the database: %s", error)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _families(self, stats: Stats) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("warmup_jobs", "Warm-up jobs by state.", labels=["state"])
        for state, count in sorted(stats.job_states().items()):
            jobs.add_metric([state], count)
        yield jobs

        tasks = stats.tasks()
        workers = stats.workers()
        labels = stats.toolchain_labels({key for key, _ in tasks} | set(workers))
        depth = GaugeMetricFamily(
            "warmup_tasks",
            "Compile tasks by toolchain and state; queued and running are the queue depth.",
            labels=["toolchain", "toolchain_key", "state"],
        )
        for (key, state), count in sorted(tasks.items()):
            depth.add_metric([labels.get(key, "?"), key[:12], state], count)
        yield depth
        online = GaugeMetricFamily(
            "warmup_workers",
            "Workers seen in the last 5 minutes, by toolchain.",
            labels=["toolchain", "toolchain_key"],
        )
        for key, count in sorted(workers.items()):
            online.add_metric([labels.get(key, "?"), key[:12]], count)
        yield online

        yield _histogram(
            "warmup_task_duration_seconds",
            "Wall time of finished tasks, from claim to done (rehearsal and upload).",
            stats.task_durations(),
        )
        yield _histogram(
            "warmup_compile_duration_seconds",
            "Compile seconds of the entries in the caches.",
            stats.compile_durations(),
        )

        blob_count, blob_bytes = stats.blobs()
        yield GaugeMetricFamily("warmup_blobs", "Blobs in the store.", value=blob_count)
        yield GaugeMetricFamily("warmup_blob_bytes", "Bytes of the blobs in the store.", value=blob_bytes)
        damaged, _found = stats.damaged_blobs()
        yield GaugeMetricFamily(
            "warmup_damaged_blobs",
            "Blobs `warmup store check` found missing or altered in the store and nobody stored again yet; "
            "the jobs that listed them are not ready until submitted again.",
            value=damaged,
        )
        entries = GaugeMetricFamily(
            "warmup_entries", "Cache entries by toolchain.", labels=["toolchain", "toolchain_key"]
        )
        for cache in stats.caches():
            entries.add_metric([cache.toolchain, cache.toolchain_key[:12]], cache.entries)
        yield entries

        reports, fresh, saved = stats.coverage_totals()
        yield CounterMetricFamily(
            "warmup_coverage_reports", "Coverage reports posted by training runs.", value=reports
        )
        yield CounterMetricFamily(
            "warmup_fresh_compiles", "Compiles training runs still had to do, as they reported.", value=fresh
        )
        yield CounterMetricFamily(
            "warmup_compile_seconds_saved",
            "Compile seconds training runs did not spend: for each coverage report, the compile "
            "seconds of the entries of the signatures it met warm.",
            value=saved,
        )


def _histogram(name: str, documentation: str, histogram: Histogram) -> HistogramMetricFamily:
    def bound(value: float) -> str:
        return "+Inf" if value == float("inf") else repr(value)

    return HistogramMetricFamily(
        name,
        documentation,
        buckets=[(bound(le), count) for le, count in histogram.buckets],
        sum_value=histogram.total,
    )


class PullCounter:
    """Counts manifest (POST /v1/manifests) and blob (GET /v1/blobs/...) requests by status."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = _pull_kind(scope) if scope["type"] == "http" else None
        if kind is None:
            await self.app(scope, receive, send)
            return
        status = 500  # if the app fails before it answers

        async def record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record)
        finally:
            self.metrics.pulls.labels(kind, str(status)).inc()


def _pull_kind(scope: Scope) -> str | None:
    path, method = scope.get("path", ""), scope.get("method", "")
    if method == "POST" and path == "/v1/manifests":
        return "manifest"
    if method in ("GET", "HEAD") and path.startswith("/v1/blobs/"):
        return "blob"
    return None


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(request: Request) -> Response:
    services = request.app.state.services
    if not services.settings.metrics_public:
        authorize(services, bearer_token(request), "read")
    registry = request.app.state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
