"""Load: 200 concurrent pods pulling the same cache and 50 concurrent submissions on a freshly started
server: no errors, every pod's cache installed byte for byte, identical specs share one job.

The scenario is tests/support/load.py (benchmarks/bench_load.py runs the same one with a larger
cache and prints the figures); latencies are recorded in the ledger, never asserted. The pods' cache
is small here (16 files) so that the run fits in CI; the benchmark pulls 240 files a pod.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.reliability.audit import audit_store
from tests.reliability.ledger import Row, record
from tests.support.load import LoadConfig, LoadResult, installed_mismatches, percentile, run_load
from warmup.api.services import TTLCache
from warmup.db.engine import make_engine
from warmup.store import open_store


def check_outcome(result: LoadResult) -> None:
    """What every load run must show, whatever its scale."""
    assert result.errors == []
    assert result.responses_5xx == 0
    assert "Traceback" not in result.server_log and "database is locked" not in result.server_log
    assert len(result.pods) == result.config.pods
    for pod in result.pods:
        assert pod.files == len(result.expected), pod
        assert installed_mismatches(Path(pod.dest), result.expected) == [], f"pod {pod.pod}"
    # Every file downloaded once, but for GETs the client retried because they timed out (30 s): on an
    # overloaded CI machine a few can; any other failure (a dropped connection, a bad answer) fails.
    assert result.blob_gets == result.config.pods * len(result.expected) + result.blob_failures
    assert all("TimeoutError" in reason for reason in result.blob_failure_reasons), (
        result.blob_failure_reasons
    )

    jobs_by_spec: dict[int, set[str]] = defaultdict(set)
    for submission in result.submissions:
        assert submission.job_id is not None, submission
        jobs_by_spec[submission.spec_index].add(submission.job_id)
    assert len(jobs_by_spec) == result.config.submissions
    assert all(len(jobs) == 1 for jobs in jobs_by_spec.values()), "an identical spec got two jobs"
    assert len({next(iter(jobs)) for jobs in jobs_by_spec.values()}) == result.config.submissions
    # One 201 per new spec; 200 for the repeats and for the spec the pods pull (its job exists, ready).
    created = {s.spec_index for s in result.submissions if s.status == 201}
    assert len([s for s in result.submissions if s.status == 201]) == len(created)
    assert created == set(jobs_by_spec) - {result.pulled_spec_index}


def record_figures(result: LoadResult, name: str) -> None:
    latencies = result.latencies()
    manifests = sum(n for (kind, _), n in result.server_counts.items() if kind == "manifest")
    blobs = sum(n for (kind, _), n in result.server_counts.items() if kind == "blob")
    record(
        Row(
            scenario=f"{name}: {result.config.pods} pods pull at once (whole pull)",
            requests=manifests + blobs,
            responses_5xx=result.responses_5xx,
            p99_ms=round(percentile(latencies["whole pull"], 99), 1),
        )
    )
    record(
        Row(
            scenario=f"{name}: manifest requests of those pods",
            requests=manifests,
            responses_5xx=sum(
                n
                for (kind, status), n in result.server_counts.items()
                if kind == "manifest" and status.startswith("5")
            ),
            p99_ms=round(percentile(latencies["manifest request"], 99), 1),
        )
    )
    record(
        Row(
            scenario=f"{name}: {len(result.submissions)} submissions at once ({result.config.duplicates} repeats)",
            requests=len(result.submissions),
            responses_5xx=sum(1 for s in result.submissions if s.status is not None and s.status >= 500),
            p99_ms=round(percentile(latencies["submission"], 99), 1),
        )
    )


def test_200_pods_and_50_submissions_on_a_fresh_postgres_server(pg_url, tiny_model_dir, tmp_path):
    config = LoadConfig(pods=200, submissions=50, duplicates=10, files_per_signature=2)
    result = run_load(
        config, work=tmp_path, model=tiny_model_dir, database_url=pg_url, store_url=str(tmp_path / "blobs")
    )
    print(result.table())
    check_outcome(result)
    audit = audit_store(make_engine(pg_url), open_store(str(tmp_path / "blobs")))
    assert audit.lost == 0 and audit.entries == 8
    record_figures(result, "load, PostgreSQL")


def test_the_embedded_sqlite_default_under_moderate_load(tiny_model_dir, tmp_path):
    """The README's one-command setup (SQLite file, local blobs): 50 pods and 25 submissions at once."""
    config = LoadConfig(pods=50, submissions=20, duplicates=5, files_per_signature=2, pod_processes=2)
    database_url = f"sqlite:///{tmp_path / 'service' / 'warmup.db'}"
    result = run_load(
        config,
        work=tmp_path,
        model=tiny_model_dir,
        database_url=database_url,
        store_url=str(tmp_path / "service" / "blobs"),
    )
    print(result.table())
    check_outcome(result)
    record_figures(result, "load, embedded SQLite")


# --- contention bugs found by the load scenario ------------------------------------------------

COLD_CONFIG_CLASSES = """
import sys, threading
sys.setswitchinterval(1e-4)  # switch threads often: the import race shows on every run, not one in three
from warmup.trainers.registry import FAMILIES
from warmup.job.trl_args import config_class
kinds = list(FAMILIES) * 8
start, errors = threading.Barrier(len(kinds)), []
def resolve(kind):
    start.wait()
    try:
        assert config_class(kind).__name__ == FAMILIES[kind].config_class
    except Exception as error:
        errors.append(f"{kind}: {type(error).__name__}: {error}")
threads = [threading.Thread(target=resolve, args=(kind,)) for kind in kinds]
[t.start() for t in threads]
[t.join() for t in threads]
print(len(errors), sorted(set(errors))[:3])
"""


def test_concurrent_config_class_lookups_in_a_cold_process_resolve_every_trl_config_class():
    """The API plans requests in threads; on a fresh process TRL's lazy package gave "module 'trl' has
    no attribute 'SFTConfig'" (a 500) to some of the concurrent requests."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(COLD_CONFIG_CLASSES)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "0 []"


def test_concurrent_misses_of_one_key_compute_it_once():
    """200 pods asking a cold server for one manifest build it once, not 200 times at once."""
    cache: TTLCache[str, int] = TTLCache(16, 60.0)
    calls = []
    start = threading.Barrier(20)

    def compute() -> int:
        calls.append(1)
        time.sleep(0.2)
        return 42

    def ask() -> None:
        start.wait()
        assert cache.get_or_compute("manifest", compute) == 42

    threads = [threading.Thread(target=ask) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert cache._computing == {}  # no lock left behind


def test_a_failed_compute_is_not_cached_and_the_next_caller_tries_again():
    cache: TTLCache[str, int] = TTLCache(16, 60.0)

    def fail() -> int:
        raise ValueError("plan too large")

    with pytest.raises(ValueError):
        cache.get_or_compute("spec", fail)
    assert cache.get_or_compute("spec", lambda: 7) == 7
