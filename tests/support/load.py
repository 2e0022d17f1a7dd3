"""The load scenario, shared by benchmarks/bench_load.py and tests/reliability/test_load.py.

A real `warmup serve` process (uvicorn, no in-process worker) on a database and a blob store, a warmed
cache of one spec published as workers leave it (entries recorded through the queue, blobs in the
store), then, all at once on the freshly started server:

- `pods` training pods, each an independent client (`warmup.client.pull` with its own HTTP client and
  connections, its own cache directory), run as threads spread over a few processes: the server is
  what is under test, and 200 Python processes on two cores would measure process start-up;
- `submissions` distinct warm-up submissions (SFT and DPO specs of different shapes) plus
  `duplicates` that repeat some of them, sent concurrently: identical specs must get the same job.

Nothing is retried behind the scenario's back: manifest requests and submissions use clients with
one attempt, so any 5xx is an error here; blob downloads keep the library's retries (as a real pod
does), and every retried download is counted. The server counts its own manifest and blob answers by
status (/metrics), which is where the 5xx figures come from.

    python -m tests.support.load pods CONFIG.json   # one pod process (started by `run_load`)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]

# The pods' toolchain, given (not computed), so that a pod process imports no torch.
TOOLCHAIN_FIELDS: dict[str, Any] = {
    "backend": "inductor",
    "device": "cpu",
    "python": "3.11.7",
    "torch": "2.13.0+cpu",
    "torch_key": "cd" * 32,
    "device_kind": "cpu",
    "cpu_isa": "avx512",
    "num_threads": 2,
}
SERVER_START_S = 300.0  # start-up imports torch and TRL: a minute or more on a busy machine


@dataclass(frozen=True)
class LoadConfig:
    pods: int = 200
    submissions: int = 50
    duplicates: int = 10  # submissions that repeat one of the distinct specs, sent in the same burst
    files_per_signature: int = 30  # the published spec plans 8 signatures: 240 files per pull
    pod_processes: int = 4
    pod_parallel: int = 4  # download threads per pod
    log_level: str = "warning"


# --- the warmed cache ---------------------------------------------------------------------------


def pulled_spec(model: Path) -> dict[str, Any]:
    """The spec every pod pulls: SFT on the tiny model, 8 signatures (lengths 64..512, batch 2)."""
    return job_spec("sft", model, max_length=512, batch=2)


def job_spec(trainer: str, model: Path, *, max_length: int, batch: int) -> dict[str, Any]:
    return {
        "trainer": trainer,
        "model": str(model),
        "args": {
            "per_device_train_batch_size": batch,
            "max_length": max_length,
            "pad_to_multiple_of": 64,
            "torch_compile": True,
            "bf16": False,
            "use_cpu": True,
        },
        "data": {"num_train_examples": 64, "min_tokens": 10, "max_tokens": max_length},
        "target": {"backend": "inductor", "device": "cpu"},
    }


def submission_specs(model: Path, distinct: int) -> list[dict[str, Any]]:
    """`distinct` different specs: SFT and DPO over five lengths and growing batch sizes."""
    specs = []
    for index in range(distinct):
        trainer = ("sft", "dpo")[index % 2]
        length = 128 * (1 + (index // 2) % 5)
        batch = 1 + index // 10
        specs.append(job_spec(trainer, model, max_length=length, batch=batch))
    assert len({json.dumps(s, sort_keys=True) for s in specs}) == distinct
    return specs


def cache_files(signature_key: str, count: int) -> list[tuple[str, bytes]]:
    """Files laid out as an Inductor cache lays them out (FX and AOT entries, kernels as .py, .cpp and
    .so), mostly small with a few larger ones, their bytes derived from the signature key."""
    rng = random.Random(signature_key)
    files = [
        (f"fxgraph/{signature_key[:2]}/f{signature_key[:24]}/entry", 2_000),
        (f"aotautograd/a{signature_key[:24]}/entry", 6_000),
    ]
    for index in range(count - len(files)):
        name = hashlib.sha256(f"{signature_key}/{index}".encode()).hexdigest()[:28]
        suffix = (".py", ".cpp", ".so")[index % 3]
        files.append((f"{name[:2]}/c{name}{suffix}", int(rng.lognormvariate(8.3, 1.0)) % 120_000 + 200))
    return [(path, rng.randbytes(size)) for path, size in files]


def publish_warmed_cache(
    services: Any, spec: Any, toolchain: Any, files_per_signature: int, scratch: Path
) -> dict[str, str]:
    """Submit `spec`, complete every task with its files as a worker does (reserve, upload, complete),
    and publish the manifest; returns the cache a pod must end up with: {path: sha256}."""
    from tests.support.pods import publish
    from warmup.db.records import FileRef, Keyed
    from warmup.planner.planning import plan_spec

    signatures = [Keyed.of(s) for s in plan_spec(spec).signatures]
    services.queue.submit_job(Keyed.of(spec), Keyed.of(toolchain), signatures)
    expected: dict[str, str] = {}
    staging = scratch / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    while (task := services.queue.claim("load-worker", toolchain.key(), 60)) is not None:
        refs = []
        for path, content in cache_files(task.signature_key, files_per_signature):
            sha = hashlib.sha256(content).hexdigest()
            (staging / sha).write_bytes(content)
            refs.append(FileRef(path=path, sha256=sha, size=len(content)))
            expected[path] = sha
        services.queue.reserve_blobs(refs)
        for ref in refs:
            services.store.put_file(staging / ref.sha256, ref.sha256)
        services.queue.complete(task.id, "load-worker", refs, compile_seconds=20.0)
    publish(services, spec, toolchain)
    return expected


# --- the server ----------------------------------------------------------------------------------


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def cpu_seconds(self) -> float:
        """User + system CPU the server process has used so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def status_counts(self) -> dict[tuple[str, str], int]:
        """The server's own count of manifest and blob answers, by (kind, status)."""
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        counts: dict[tuple[str, str], int] = {}
        pattern = r'^warmup_pull_requests_total\{kind="(\w+)",status="(\d+)"\} ([0-9.e+]+)$'
        for kind, status, value in re.findall(pattern, text, flags=re.M):
            counts[(kind, status)] = int(float(value))
        return counts


@contextlib.contextmanager
def warmup_server(
    *, url: str, database_url: str, store_url: str, data_dir: Path, env: dict[str, str], log_level: str
) -> Iterator[Server]:
    """`python -m warmup serve --no-worker` at `url` (http://127.0.0.1:PORT), a fresh process; stopped on exit."""
    port = int(url.rsplit(":", 1)[1])
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir / "server.log"
    command = [
        sys.executable, "-m", "warmup", "serve", "--no-worker", "--host", "127.0.0.1", "--port", str(port),
        "--data-dir", str(data_dir), "--database-url", database_url, "--store", store_url, "--auth", "off",
    ]  # fmt: skip
    server_env = {**env, "WARMUP_LOG_LEVEL": log_level.upper(), "PYTHONPATH": str(REPO_ROOT)}
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=server_env)
    server = Server(url, process, log)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"warmup serve exited with {process.returncode}:\n{log.read_text()[-3000:]}"
                )
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200:  # started, TRL imported
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"warmup serve did not answer in {SERVER_START_S:.0f} s")
            time.sleep(0.1)
        yield server
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- pods (run inside pod processes) --------------------------------------------------------------


@dataclass
class PodOutcome:
    pod: int
    dest: str
    manifest_ms: float | None = None
    pull_ms: float | None = None
    files: int = 0
    error: str | None = None


class _Downloads:
    """Counts blob GETs and their failures in this process (retried ones included)."""

    lock = threading.Lock()
    opened = 0
    failed = 0
    reasons: dict[str, int] = {}  # why they failed, by error type and message start


def _counting_blob_source() -> None:
    """Make the library's blob source count what it does, so a retried download is not invisible."""
    import warmup.client.pulling as pulling

    base = pulling.HttpBlobSource

    class CountingBlobSource(base):  # type: ignore[misc, valid-type]
        @contextlib.contextmanager
        def open(self, file: Any) -> Iterator[Iterator[bytes]]:
            with _Downloads.lock:
                _Downloads.opened += 1
            try:
                with super().open(file) as chunks:
                    yield chunks
            except BaseException as error:
                reason = f"{type(error).__name__}: {str(error)[:120]}"
                reason = re.sub(r"blob [0-9a-f]{12}", "blob ...", reason)
                with _Downloads.lock:
                    _Downloads.failed += 1
                    _Downloads.reasons[reason] = _Downloads.reasons.get(reason, 0) + 1
                raise

    pulling.HttpBlobSource = CountingBlobSource  # type: ignore[misc]  # what pull builds its source from


def _run_pod(pod: int, config: dict[str, Any]) -> PodOutcome:
    from warmup.client.pulling import pull
    from warmup.client.service import ServiceClient

    outcome = PodOutcome(pod=pod, dest=str(Path(config["dest_root"]) / f"pod-{pod:03d}"))

    class TimedClient(ServiceClient):
        def request(self, method: str, path: str, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return super().request(method, path, **kwargs)
            finally:
                if path == "/v1/manifests":
                    outcome.manifest_ms = (time.perf_counter() - started) * 1000

    # one attempt: a 5xx on the manifest is an error of this run, not something a retry hides
    client = TimedClient(config["url"], attempts=1)
    go, deadline = Path(config["go"]), time.monotonic() + 900
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.perf_counter()
    try:
        result = pull(
            config["spec"],
            outcome.dest,
            client=client,
            toolchain=config["toolchain"],
            parallel=config["parallel"],
        )
        outcome.files = result.downloaded + result.skipped
    except Exception as error:
        outcome.error = f"{type(error).__name__}: {error}"[:500]
    finally:
        outcome.pull_ms = (time.perf_counter() - started) * 1000
        client.close()
    return outcome


def pod_process_main(config_path: Path) -> None:
    """Run this process's pods in threads, all starting when the go file appears; print their outcomes as JSON."""
    config = json.loads(config_path.read_text())
    _counting_blob_source()
    with concurrent.futures.ThreadPoolExecutor(len(config["pods"])) as pool:
        outcomes = list(pool.map(lambda pod: _run_pod(pod, config), config["pods"]))
    report = {
        "pods": [asdict(o) for o in outcomes],
        "blob_gets": _Downloads.opened,
        "blob_failures": _Downloads.failed,
        "blob_failure_reasons": _Downloads.reasons,
    }
    print(json.dumps(report))


# --- the scenario --------------------------------------------------------------------------------


@dataclass
class Submission:
    index: int
    spec_index: int  # which distinct spec it sent
    latency_ms: float
    status: int | None = None
    job_id: str | None = None
    error: str | None = None


@dataclass
class LoadResult:
    config: LoadConfig
    pods: list[PodOutcome]
    submissions: list[Submission]
    expected: dict[str, str]  # path -> sha256 every pod must have
    server_counts: dict[tuple[str, str], int]
    server_cpu_s: float
    wall_s: float
    blob_gets: int
    blob_failures: int
    blob_failure_reasons: dict[str, int] = field(default_factory=dict)
    pod_stderr: list[str] = field(default_factory=list)
    pulled_spec_index: int | None = None  # the distinct submission that repeats the pulled spec, if any
    server_log: str = ""

    @property
    def errors(self) -> list[str]:
        found = [f"pod {p.pod}: {p.error}" for p in self.pods if p.error]
        found += [f"submission {s.index}: {s.error}" for s in self.submissions if s.error]
        found += [f"server answered {n} {kind} request(s) with {status}" for (kind, status), n in
                  self.server_counts.items() if status.startswith("5")]  # fmt: skip
        return found

    @property
    def responses_5xx(self) -> int:
        server = sum(n for (_, status), n in self.server_counts.items() if status.startswith("5"))
        return server + sum(1 for s in self.submissions if s.status is not None and s.status >= 500)

    @property
    def requests(self) -> int:
        """HTTP requests the API answered: manifests and blobs (its own count) and the submissions."""
        return sum(self.server_counts.values()) + len(self.submissions)

    def latencies(self) -> dict[str, list[float]]:
        return {
            "manifest request": [p.manifest_ms for p in self.pods if p.manifest_ms is not None],
            "whole pull": [p.pull_ms for p in self.pods if p.pull_ms is not None and not p.error],
            "submission": [s.latency_ms for s in self.submissions if not s.error],
        }

    def table(self) -> str:
        installed = sum(1 for p in self.pods if not p.error)
        lines = [
            f"{self.config.pods} pods x {len(self.expected)} files, {len(self.submissions)} submissions "
            f"({self.config.submissions} distinct + {self.config.duplicates} repeated), all at once",
            f"{'':<18}{'n':>6}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}{'max ms':>10}",
        ]
        for name, values in self.latencies().items():
            p50, p95, p99 = (percentile(values, q) for q in (50, 95, 99))
            lines.append(
                f"{name:<18}{len(values):>6}{p50:>10.0f}{p95:>10.0f}{p99:>10.0f}{max(values, default=0):>10.0f}"
            )
        files = installed * len(self.expected)
        lines += [
            f"errors: {len(self.errors)}; 5xx: {self.responses_5xx}; API requests: {self.requests}; "
            f"blob GETs {self.blob_gets} ({self.blob_failures} failed and retried)",
            f"throughput: {files / self.wall_s:.0f} files/s installed, {self.requests / self.wall_s:.0f} API "
            f"requests/s over {self.wall_s:.1f} s",
            f"server CPU: {self.server_cpu_s:.1f} s ({100 * self.server_cpu_s / self.wall_s:.0f}% of one core)",
        ]
        common = sorted(self.blob_failure_reasons.items(), key=lambda item: -item[1])[:5]
        lines += [f"  blob GET failed {count}x: {reason}" for reason, count in common]
        return "\n".join(lines)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _submit(
    url: str,
    index: int,
    spec_index: int,
    spec: dict[str, Any],
    toolchain: dict[str, Any],
    go: threading.Event,
) -> Submission:
    """One submission by a client of its own, sent when `go` is set; no retries."""
    with httpx.Client(timeout=httpx.Timeout(120.0, connect=10.0)) as http:
        go.wait()
        started = time.perf_counter()
        try:
            response = http.post(f"{url}/v1/warmups", json={"spec": spec, "toolchain": toolchain})
        except httpx.HTTPError as error:
            return Submission(index, spec_index, (time.perf_counter() - started) * 1000, error=repr(error))
        latency = (time.perf_counter() - started) * 1000
    submission = Submission(index, spec_index, latency, status=response.status_code)
    if response.status_code in (200, 201):
        submission.job_id = response.json()["id"]
    else:
        submission.error = f"HTTP {response.status_code}: {response.text[:300]}"
    return submission


def run_load(
    config: LoadConfig,
    *,
    work: Path,
    model: Path,
    database_url: str,
    store_url: str,
    env: dict[str, str] | None = None,
) -> LoadResult:
    """Start a fresh server while the warmed cache is published and the pod processes start; once all
    are ready, fire the pods and the submissions at once."""
    from tests.fixtures.services import free_port
    from warmup.db.migrate import upgrade
    from warmup.toolchain.model import Toolchain

    env = {**os.environ, **(env or {}), "PYTHONPATH": str(REPO_ROOT)}
    toolchain_doc = Toolchain(**TOOLCHAIN_FIELDS).model_dump(mode="json")
    spec_doc = pulled_spec(model)
    distinct = submission_specs(model, config.submissions)
    rng = random.Random(7)
    sent = list(range(len(distinct))) + [rng.randrange(len(distinct)) for _ in range(config.duplicates)]
    rng.shuffle(sent)
    url = f"http://127.0.0.1:{free_port()}"
    go = work / "go"  # created when everything is ready: the burst starts

    pod_runs = []
    groups = [list(range(config.pods))[i :: config.pod_processes] for i in range(config.pod_processes)]
    for number, pods in enumerate(g for g in groups if g):
        pod_config = {
            "url": url, "spec": spec_doc, "toolchain": toolchain_doc, "pods": pods, "go": str(go),
            "dest_root": str(work / "pods"), "parallel": config.pod_parallel,
        }  # fmt: skip
        path = work / f"pods-{number}.json"
        path.write_text(json.dumps(pod_config))
        command = [sys.executable, "-m", "tests.support.load", "pods", str(path)]
        pod_runs.append(
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT, env=env)
        )
    try:
        upgrade(database_url)  # before the server and the publisher both start on it
        with concurrent.futures.ThreadPoolExecutor(1) as background:
            published = background.submit(
                _publish, config, work, spec_doc, toolchain_doc, database_url, store_url
            )
            with warmup_server(
                url=url,
                database_url=database_url,
                store_url=store_url,
                data_dir=work / "service",
                env=env,
                log_level=config.log_level,
            ) as server:
                expected = published.result()
                result = _burst(config, server, go, pod_runs, distinct, sent, toolchain_doc)
    finally:
        for run in pod_runs:
            if run.poll() is None:
                run.kill()
                run.wait()
    result.expected = expected
    result.pulled_spec_index = next((i for i, s in enumerate(distinct) if s == spec_doc), None)
    return result


def _publish(
    config: LoadConfig,
    work: Path,
    spec_doc: dict[str, Any],
    toolchain_doc: dict[str, Any],
    database_url: str,
    store_url: str,
) -> dict[str, str]:
    from warmup.api.services import Services
    from warmup.job.spec import load_spec
    from warmup.settings import Settings
    from warmup.toolchain.model import Toolchain

    settings = Settings(
        data_dir=work / "publisher", database_url=database_url, store_url=store_url, auth="off"
    )
    services = Services.start(settings)
    try:
        spec, toolchain = load_spec(spec_doc), Toolchain.model_validate(toolchain_doc)
        return publish_warmed_cache(services, spec, toolchain, config.files_per_signature, work)
    finally:
        services.close()


def _burst(
    config: LoadConfig,
    server: Server,
    go: Path,
    pod_runs: list[subprocess.Popen[bytes]],
    distinct: list[dict[str, Any]],
    sent: list[int],
    toolchain_doc: dict[str, Any],
) -> LoadResult:
    started = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(max(1, len(sent))) as pool:
        futures = [
            pool.submit(_submit, server.url, index, spec_index, distinct[spec_index], toolchain_doc, started)
            for index, spec_index in enumerate(sent)
        ]
        time.sleep(0.5)  # the submitting threads are up and waiting
        cpu_before, start = server.cpu_seconds(), time.monotonic()
        go.touch()
        started.set()
        submissions = [f.result() for f in futures]
    outcomes: list[PodOutcome] = []
    blob_gets = blob_failures = 0
    reasons: dict[str, int] = {}
    stderr = []
    for run in pod_runs:
        out, err = run.communicate(timeout=900)
        stderr.append(err.decode(errors="replace")[-3000:])
        if run.returncode != 0:
            raise RuntimeError(f"a pod process failed ({run.returncode}):\n{stderr[-1]}")
        report = json.loads(out.decode().strip().splitlines()[-1])
        outcomes += [PodOutcome(**o) for o in report["pods"]]
        blob_gets += report["blob_gets"]
        blob_failures += report["blob_failures"]
        for reason, count in report["blob_failure_reasons"].items():
            reasons[reason] = reasons.get(reason, 0) + count
    wall = time.monotonic() - start
    return LoadResult(
        config=config,
        pods=sorted(outcomes, key=lambda o: o.pod),
        submissions=submissions,
        expected={},
        server_counts=server.status_counts(),
        server_cpu_s=server.cpu_seconds() - cpu_before,
        wall_s=wall,
        blob_gets=blob_gets,
        blob_failures=blob_failures,
        blob_failure_reasons=reasons,
        pod_stderr=stderr,
        server_log=server.log.read_text(errors="replace"),
    )


def installed_mismatches(dest: Path, expected: dict[str, str]) -> list[str]:
    """Paths of `expected` that are missing from `dest` or whose bytes hash to something else."""
    wrong = []
    for path, sha256 in expected.items():
        target = dest / path
        if not target.is_file() or hashlib.sha256(target.read_bytes()).hexdigest() != sha256:
            wrong.append(path)
    return wrong


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "pods":
        pod_process_main(Path(sys.argv[2]))
    else:
        raise SystemExit(__doc__)
