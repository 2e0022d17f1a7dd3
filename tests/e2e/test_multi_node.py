"""Multi-node for real: a two-node SLURM cluster (tests/fixtures/cluster.py), every node starting warm.

TRL's "Distributing training" guide launches a multi-node job two ways: torchrun on each node by hand, and
`sbatch` of a script whose `srun` starts one torchrun per node. Both run here, on two hosts (network
namespaces) with the service on the host: a TRL SFT job of the tiny model, 2 nodes x 2 processes, warmed once
through the service by one worker that SLURM runs on a node (`docker/slurm/prewarm.sh` from the login node:
`warmup submit`, `sbatch worker.sbatch`, `warmup submit --wait`), with 2 processes, fewer than the job's 4.
Then every rank on both nodes must train under `--strict` with no fresh compile, each node over its own
verified copy, and the service's coverage must hold both nodes' reports. Across nodes: a node that cannot
reach the service ends the SLURM job at once (the other is not left at the rendezvous), or, by hand over a
copy it installed before, trains from that copy once it is verified; one with another torch is refused by name
before torchrun starts.

The warm-up is the one compile of the module (module-scoped); every launch reuses it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.cluster import Cluster, two_node_cluster, why_impossible
from tests.fixtures.services import PostgresServer, S3Server
from tests.support.jobs import served_warm, write_spec
from tests.support.live_server import serve
from warmup.api.services import Services
from warmup.client.local import read_local_manifest
from warmup.client.service import ServiceClient
from warmup.db.tokens import TokenStore
from warmup.job.spec import load_spec
from warmup.settings import Settings

REPO = Path(__file__).resolve().parents[2]
SLURM = REPO / "docker" / "slurm"
POD_TRAIN = REPO / "tests" / "support" / "pod_train.py"
NPROC_PER_NODE = 2  # 2 nodes x 2: a job of 4 processes, warmed with 2
DATA = ["--min-tokens", "10", "--split", "20", "--max-tokens", "30", "--steps", "2"]  # every batch 2x32

# The guide's sbatch launch runs `train.py --config SPEC` from the submit directory: this one runs the
# pod's SFT job (tests/support/pod_train.py) and prints, per rank, its node and its fresh compiles.
TRAIN_PY = """\
import json, os, runpy, socket, sys
from pathlib import Path

out = Path.cwd() / f"result-{{os.environ['SLURM_JOB_ID']}}.json"
sys.argv = [{pod_train!r}, "--weights", {weights!r}, "--out", str(out), *{data!r}]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as done:
    rank = int(os.environ["RANK"])
    mine = out if rank == 0 else out.with_suffix(f".rank{{rank}}.json")
    report = json.loads(mine.read_text())["report"]
    print(f"rank {{rank}} on {{socket.gethostname()}}: {{report['fresh_compiles']}} fresh compile(s)", flush=True)
    raise
"""


@dataclass
class Warm:
    cluster: Cluster
    url: str
    env: dict[str, str]  # what a node's commands run with (WARMUP_TOKEN: a read token)
    spec: Path
    job_id: str
    shared: Path  # on the shared filesystem: the spec, the submit directory, the training reports
    weights: Path


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    reason = why_impossible()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI runs these tests)", pytrace=False)
        pytest.skip(reason)
    with two_node_cluster() as started:
        yield started


@pytest.fixture(scope="module")
def warm(
    cluster: Cluster,
    postgres_server: PostgresServer,
    pg_template: str,
    s3_server: S3Server,
    tiny_model_dir: Path,
    user_weights_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Warm]:
    """The service on the nodes' network (PostgreSQL and S3 forwarded there), and the job warmed by a worker
    that SLURM runs on a node, submitted and waited for from the login node."""
    shared = tmp_path_factory.mktemp("multi-node")
    database = f"warmup_test_{uuid.uuid4().hex[:10]}"
    database_url = postgres_server.create_database(database, template=pg_template)
    bucket = f"warmup-test-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=bucket)
    host = cluster.host_address
    s3_there = f"http://{host}:{cluster.forward(int(s3_server.endpoint_url.rsplit(':', 1)[1]))}"
    database_there = database_url.replace(
        f"@{postgres_server.host}:{postgres_server.port}/",
        f"@{host}:{cluster.forward(postgres_server.port)}/",
    )
    aws = {**s3_server.env(), "AWS_EC2_METADATA_DISABLED": "true"}
    aws |= {
        "AWS_CONFIG_FILE": str(shared / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(shared / "none"),
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in aws.items():
            patch.setenv(name, value)
        settings = Settings(
            data_dir=shared / "service",
            database_url=database_url,
            store_url=f"s3://{bucket}/cache",
            presign_endpoint_url=s3_there,  # pods download the blobs from the bucket, at its address there
            host=host,
            auth="required",
        )
        services = Services.start(settings)
    tokens = TokenStore(services.engine)
    read, submit = (tokens.create(name, [name])[1] for name in ("read", "submit"))
    node_env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # warmup, torchrun
        "WARMUP_TOKEN": read,
    }
    spec_path = write_spec(
        shared / "spec.yaml",
        "sft",
        tiny_model_dir,
        {"per_device_train_batch_size": 2, "max_length": 32, "pad_to_multiple_of": 32},
        {"min_tokens": 10, "max_tokens": 30},
    )
    world = 2 * NPROC_PER_NODE
    spec_path.write_text(spec_path.read_text().replace("device: cpu", f"device: cpu\n  world_size: {world}"))
    try:
        with serve(services, host=host) as url:
            login_env = (
                node_env | aws | {"AWS_ENDPOINT_URL": s3_there, "WARMUP_SERVER": url, "WARMUP_TOKEN": submit}
            )
            login_env |= {"WARMUP_DATABASE_URL": database_there, "WARMUP_STORE_URL": f"s3://{bucket}/cache"}
            login_env |= {"TIMEOUT": "900", "WORKERS": "1"}
            started = time.monotonic()
            done = cluster.login(
                [SLURM / "prewarm.sh", spec_path, "-p", "debug"], env=login_env, cwd=shared, timeout=1000
            )
            seconds = time.monotonic() - started
            worker_logs = "\n".join(p.read_text()[-3000:] for p in shared.glob("trl-warmup-worker-*.out"))
            assert done.returncode == 0, (
                f"{done.stdout}\n{done.stderr[-4000:]}\n{worker_logs}\n{cluster.logs()}"
            )
            job_id = done.stdout.split()[0]
            with ServiceClient(url, token=read) as client:
                job = client.job(job_id)
            assert job["state"] == "ready", job
            print(
                f"warmed through SLURM (prewarm.sh: submit, sbatch worker, submit --wait) in {seconds:.1f}s"
            )
            yield Warm(
                cluster, url, {**node_env, "WARMUP_SERVER": url}, spec_path, job_id, shared, user_weights_dir
            )
    finally:
        services.close()
        postgres_server.drop_database(database)


def exec_on(
    warm: Warm, node: str, dest: Path, rank: int, out: Path, env: dict[str, str] | None = None
) -> list[str]:
    """The guide's by-hand launch on `node`: `warmup exec ... -- torchrun --nnodes 2 --node_rank N --rdzv_backend
    c10d --rdzv_endpoint node1:29500 ...`, under --strict."""
    command = ["warmup", "exec", warm.spec, "--server", warm.url, "--dest", dest, "--strict", "--"]
    command += [
        "torchrun",
        "--nnodes",
        "2",
        "--node_rank",
        str(rank),
        "--nproc_per_node",
        str(NPROC_PER_NODE),
    ]
    command += ["--rdzv_backend", "c10d", "--rdzv_endpoint", "node1:29500", "--rdzv_id", out.parent.name]
    command += [POD_TRAIN, "--weights", warm.weights, "--out", out, *DATA]
    return warm.cluster.on(node, command, cwd=warm.shared)


def rank_reports(out: Path) -> dict[int, dict]:
    reports = {}
    for path in [out, *out.parent.glob(f"{out.stem}.rank*.json")]:
        result = json.loads(path.read_text())
        reports[int(result["report"]["details"]["rank"])] = result
    return reports


def assert_every_rank_warm(reports: dict[int, dict]) -> None:
    assert sorted(reports) == list(range(2 * NPROC_PER_NODE)), sorted(reports)
    hosts = {result["report"]["details"]["host"] for result in reports.values()}
    assert hosts == {"node1", "node2"}, hosts
    for rank, result in reports.items():
        report = result["report"]
        assert report["fresh_compiles"] == 0, (rank, report["details"])
        assert report["details"]["new_files"] == 0 and report["missed"] == [], (rank, report["details"])
        assert {tuple(shape) for shape in result["shapes"]} == {(2, 32)}, (rank, result["shapes"])
        assert served_warm(result), (rank, result["counters"], result["trace_skip"])


def assert_own_verified_copy(cluster: Cluster, dest_name: str, spec_key: str) -> None:
    for node in ("node1", "node2"):
        dest = cluster.local_of(node) / dest_name
        installed = read_local_manifest(dest, spec_key)
        assert installed is not None, f"{node} has no installed cache in {dest}"
        assert installed.files and all((dest / f.path).is_file() for f in installed.files), node


# A node cut off from the service gives up after this many seconds of retries rather than the default minute
# (WARMUP_RETRY_S, warmup/retry.py: how a CI job that would rather fail fast sets it); no route fails each try at once
FAIL_FAST = {"WARMUP_RETRY_S": "5"}


def by_hand(warm: Warm, name: str, env: dict[str, str] | None = None) -> tuple[Path, list[Path]]:
    """Both nodes' by-hand launches at once, over the node-local `by-hand` copies, reporting into `name`; the
    rank-0 report's path and the nodes' logs. `env`: added to the launches' environment."""
    out = warm.shared / name / "result.json"
    out.parent.mkdir()
    logs = [warm.shared / name / f"{node}.log" for node in ("node1", "node2")]
    started = time.monotonic()
    processes = []
    for rank, (node, log) in enumerate(zip(("node1", "node2"), logs, strict=True)):
        with open(log, "wb") as sink:
            command = exec_on(warm, node, warm.cluster.local / "by-hand", rank, out)
            launch_env = warm.env | (env or {})
            processes.append(subprocess.Popen(command, env=launch_env, stdout=sink, stderr=subprocess.STDOUT))
    try:
        codes = [process.wait(timeout=900) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    seconds = time.monotonic() - started
    text = "\n".join(f"--- {log.name}\n{log.read_text()[-5000:]}" for log in logs)
    assert codes == [0, 0], text
    print(f"by hand ({name}): both nodes trained in {seconds:.1f}s")
    return out, logs


def test_by_hand_torchrun_on_each_node_trains_warm(warm: Warm) -> None:
    out, logs = by_hand(warm, "by-hand")
    for log in logs:  # each node installed its own copy, checked, while torchrun started
        assert "sha256 verified" in log.read_text(), log.read_text()[-3000:]
    assert_every_rank_warm(rank_reports(out))
    assert_own_verified_copy(warm.cluster, "by-hand", load_spec(warm.spec).key())


def test_sbatch_of_the_slurm_script_trains_warm_on_both_nodes(warm: Warm) -> None:
    submit_dir = warm.shared / "sbatch"
    submit_dir.mkdir()
    shutil.copy(warm.spec, submit_dir / "spec.yaml")
    (submit_dir / "train.py").write_text(
        TRAIN_PY.format(pod_train=str(POD_TRAIN), weights=str(warm.weights), data=DATA)
    )
    env = warm.env | {
        "NPROC_PER_NODE": str(NPROC_PER_NODE),
        "EXEC_OPTIONS": "--strict",
        "CACHE_DIR": str(warm.cluster.local / "sbatch"),
    }
    started = time.monotonic()
    job = warm.cluster.sbatch(SLURM / "train.sbatch", "--nodes=2", "--time=15", env=env, cwd=submit_dir)
    state = warm.cluster.wait(job, timeout=960)
    seconds = time.monotonic() - started
    output = (submit_dir / f"trl-warm-{job}.out").read_text()
    assert state["JobState"] == "COMPLETED", f"{state}\n{output[-8000:]}"
    # The ranks' lines: their output interleaves, so they are found anywhere, not line by line.
    ranks = re.findall(r"rank (\d+) on (node\d): (\d+) fresh compile\(s\)", output)
    told = [line for line in output.splitlines() if line.startswith(("exec:", "installed", "srun"))]
    print(
        f"sbatch train.sbatch: job {job} on {state['NodeList']} in {seconds:.1f}s: {ranks}\n"
        + "\n".join(told)
    )
    assert sorted(int(rank) for rank, _, _ in ranks) == list(range(2 * NPROC_PER_NODE)), output[-6000:]
    assert {node for _, node, _ in ranks} == {"node1", "node2"}, ranks
    assert all(fresh == "0" for _, _, fresh in ranks), ranks
    assert output.count("sha256 verified") == 2, output[-6000:]  # each node installed its own copy
    assert_every_rank_warm(rank_reports(submit_dir / f"result-{job}.json"))
    assert_own_verified_copy(warm.cluster, "sbatch", load_spec(warm.spec).key())


def test_coverage_holds_both_nodes_reports(warm: Warm) -> None:
    with ServiceClient(warm.url, token=warm.env["WARMUP_TOKEN"]) as client:
        reports = client.coverage(warm.job_id)
    by_host: dict[str, list[dict]] = {}
    for report in reports:
        by_host.setdefault(report["details"]["host"], []).append(report)
    assert set(by_host) == {"node1", "node2"}, [r["details"] for r in reports]
    for host, posted in by_host.items():
        assert all(r["fresh_compiles"] == 0 and r["details"]["local_rank"] == 0 for r in posted), (
            host,
            posted,
        )


def test_a_node_that_cannot_reach_the_service_ends_the_slurm_job_at_once(warm: Warm) -> None:
    submit_dir = warm.shared / "cut-off"
    submit_dir.mkdir()
    shutil.copy(warm.spec, submit_dir / "spec.yaml")
    (submit_dir / "train.py").write_text(
        TRAIN_PY.format(pod_train=str(POD_TRAIN), weights=str(warm.weights), data=DATA)
    )
    env = (
        warm.env
        | FAIL_FAST
        | {"NPROC_PER_NODE": str(NPROC_PER_NODE), "CACHE_DIR": str(warm.cluster.local / "cut-off")}
    )
    with warm.cluster.cut_off("node2", warm.cluster.host_address):
        started = time.monotonic()
        job = warm.cluster.sbatch(SLURM / "train.sbatch", "--nodes=2", "--time=5", env=env, cwd=submit_dir)
        state = warm.cluster.wait(job, timeout=420)
        seconds = time.monotonic() - started
    output = (submit_dir / f"trl-warm-{job}.out").read_text()
    print(
        f"node2 cut off: job {job} {state['JobState']} after {seconds:.1f}s (RunTime {state['RunTime']})\n{output}"
    )
    # FAILED, not TIMEOUT: node1 did not wait at the rendezvous until the time limit
    assert state["JobState"] == "FAILED", f"{state}\n{output}"
    assert "cannot reach" in output or "could not reach" in output, output
    assert "node2: task 1: Exited with exit code" in output, output
    assert " fresh compile(s)" not in output, output  # no rank trained


def test_a_node_with_another_torch_is_refused_by_name_before_torchrun(warm: Warm) -> None:
    memo_path = Path(os.environ["WARMUP_TOOLCHAIN_MEMO"])  # the run's memo: the nodes' exact toolchains
    memo = json.loads(memo_path.read_text())
    for machines in memo["exact"].values():
        for toolchain in machines.values():
            toolchain["torch"] = "2.12.0"
    for build in memo["builds"].values():
        build["facts"]["torch"] = "2.12.0"
    other = warm.shared / "other-torch" / "toolchain.json"
    other.parent.mkdir()
    other.write_text(json.dumps(memo))
    env = warm.env | {"WARMUP_TOOLCHAIN_MEMO": str(other)}
    out = warm.shared / "other-torch" / "result.json"
    started = time.monotonic()
    done = subprocess.run(
        exec_on(warm, "node2", warm.cluster.local / "other-torch", 1, out),
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    seconds = time.monotonic() - started
    print(
        f"node2 with torch 2.12.0: exit {done.returncode} after {seconds:.1f}s: {done.stderr.strip()[-600:]}"
    )
    assert done.returncode != 0, done.stderr[-3000:]
    assert "toolchain mismatch" in done.stderr and "torch: '2.12.0' here vs" in done.stderr, done.stderr[
        -3000:
    ]
    assert "exec: torchrun" not in done.stderr  # refused before torchrun started: it never joined
    assert not out.exists()


def test_a_node_cut_off_with_a_verified_copy_installed_trains_from_it(warm: Warm) -> None:
    """By hand again, over the copies the first by-hand launch installed, node2 without a route to the service:
    it checks its copy and trains from it; node1 pulls as usual. Every rank still compiles nothing."""
    with warm.cluster.cut_off("node2", warm.cluster.host_address):
        out, logs = by_hand(warm, "by-hand-cut-off", FAIL_FAST)
    node2 = logs[1].read_text()
    assert "cannot reach" in node2 and "using the cache an earlier pull installed" in node2, node2[-3000:]
    print([line for line in node2.splitlines() if line.startswith("warning:")])
    assert_every_rank_warm(rank_reports(out))
