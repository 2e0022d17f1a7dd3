"""Pull of a real warmed cache from a real S3 server (SeaweedFS): `warmup pull` against `aws s3 sync`.

Targets: into an empty directory, at least 3x faster than `aws s3 sync` of the same objects on the same
machine, with every sha256 checked; a second pull into the populated directory under 1 s, nothing
downloaded. Prints MB/s and files/s for each, and the ratios, measured side by side in one run.

    python benchmarks/bench_pull.py [--cache DIR] [--aws PATH] [--parallel 16] [--rounds 3]

The cache is a real one: `warmup warm` of a 5-signature SFT job on a tiny model (a few minutes on two
cores; pass --cache to reuse one, e.g. the directory a previous run printed). Its files are uploaded as
blobs into a bucket of a SeaweedFS server started here, and the job's manifest is published next to
them as a worker does. Each contender runs as a fresh process into a fresh directory, alternating,
each from compiled bytecode as pip leaves an installed package (this checkout's is compiled first):

- `pull via the API`: the library pull (`warmup.client.pull(spec, dest, server=URL)`) from the service
  (SQLite, the bucket as its store, served in this process), whose manifest hands out presigned URLs:
  the pod downloads straight from S3. The pod's toolchain is given, so the process imports no torch:
  this is the transfer, with every size and sha256 checked;
- `pull --from the bucket`: the same without the API (`source="s3://..."`): the pod signs the GETs;
- `warmup pull --server`: the whole command, as a pod of a prepared image runs it: its toolchain
  from the image's memo (`warmup toolchain --remember`, run once here as an image build would, not
  timed), so it imports no torch;
- `aws s3 sync` of the same blobs (no sha256 check), with its default 10 concurrent requests and with
  as many as `pull` uses.

awscli is not a dependency of the project: install it apart, e.g.
`python3 -m venv /tmp/awscli-venv && /tmp/awscli-venv/bin/pip install awscli`, and pass --aws
/tmp/awscli-venv/bin/aws (default: `aws` on PATH).
"""

from __future__ import annotations

import argparse
import compileall
import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.live_server import serve
from tests.support.pods import publish
from tests.support.seaweed import seaweedfs
from tests.support.tiny_model import write_tiny_model
from warmup.api.services import Services
from warmup.artifacts import ArtifactFile
from warmup.backends.registry import get_backend
from warmup.db.records import FileRef, Keyed
from warmup.job.spec import Spec, load_spec
from warmup.planner.planning import plan_spec
from warmup.settings import Settings
from warmup.toolchain.model import Toolchain
from warmup.toolchain.probes import current_toolchain

REPO = Path(__file__).resolve().parents[1]
BUCKET, PREFIX = "bench", "warmup"
PULL_CHILD = """
import json, sys
from warmup.client.pulling import pull
spec, dest, where, toolchain, parallel = sys.argv[1:]
how = {"source": where} if where.startswith("s3://") else {"server": where}
r = pull(spec, dest, toolchain=json.load(open(toolchain)), parallel=int(parallel), **how)
print(json.dumps({"downloaded": r.downloaded, "skipped": r.skipped, "bytes": r.bytes_downloaded, "seconds": r.seconds}))
"""


def job_spec(model: Path, path: Path) -> Path:
    """SFT on a tiny model, rows of 10..160 tokens padded to multiples of 32: five signatures."""
    spec = {
        "trainer": "sft",
        "model": str(model),
        "args": {
            "per_device_train_batch_size": 2,
            "max_length": 160,
            "pad_to_multiple_of": 32,
            "torch_compile": True,
            "bf16": False,
            "use_cpu": True,
        },
        "data": {"num_train_examples": 64, "min_tokens": 10, "max_tokens": 160},
        "target": {"backend": "inductor", "device": "cpu"},
    }
    path.write_text(json.dumps(spec))
    return path


def timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} ... failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return seconds, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, help="a warmed cache directory (default: warm one)")
    parser.add_argument("--aws", default=shutil.which("aws") or "aws", help="the aws CLI")
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    ns = parser.parse_args()
    if not shutil.which(ns.aws):
        raise SystemExit(f"no aws CLI at {ns.aws!r}: install awscli apart (see the docstring) and pass --aws")

    work = Path(tempfile.mkdtemp(prefix="bench-pull-"))
    spec_path = job_spec(write_tiny_model(work / "model"), work / "job.json")
    spec = load_spec(spec_path)
    cache = ns.cache or work / "warmed"
    if ns.cache is None:
        print(f"warming {len(plan_spec(spec).signatures)} signatures into {cache} ...", flush=True)
        timed([sys.executable, "-m", "warmup", "warm", str(spec_path), "--cache-dir", str(cache)])
    artifacts = get_backend("inductor", "cpu").collect(cache)
    total = sum(a.size for a in artifacts)
    print(f"cache: {cache}: {len(artifacts)} files, {total / 1e6:.1f} MB", flush=True)

    # A pod runs an installed trl-warmup, whose bytecode pip compiled at install time, as it did
    # awscli's. This checkout's sources would instead be compiled again by every fresh process (this
    # machine sets PYTHONDONTWRITEBYTECODE): a cost no installed client pays, so compile them once here.
    compileall.compile_dir(REPO / "warmup", quiet=1)
    toolchain = current_toolchain("inductor", "cpu")
    toolchain_file = work / "toolchain.json"
    toolchain_file.write_text(json.dumps(toolchain.model_dump(mode="json")))
    with seaweedfs(work / "seaweed") as s3:
        os.environ.update(s3.env())
        env = {**os.environ, "PYTHONPATH": str(REPO), "WARMUP_TOOLCHAIN_MEMO": str(work / "image-memo.json")}
        timed([sys.executable, "-m", "warmup", "toolchain", "--remember"], env)  # the image build, once
        s3.client().create_bucket(Bucket=BUCKET)
        source = f"s3://{BUCKET}/{PREFIX}"
        settings = Settings(data_dir=work / "service", store_url=source, auth="off")
        services = Services.start(settings)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda a: services.store.put_file(cache / a.path, a.sha256), artifacts))
        record_entries(services, spec, toolchain, artifacts)
        with serve(services) as url:
            times, again, again_cli, again_inside = race(
                ns, work, spec_path, toolchain_file, env, url, s3, len(artifacts)
            )
        services.close()

    print(
        f"\n{len(artifacts)} files, {total / 1e6:.1f} MB; median of {ns.rounds} rounds, each a fresh process"
    )
    print("into an empty directory; every blob's size and sha256 checked by pull, none by aws")
    median = {name: statistics.median(values) for name, values in times.items()}
    for name, seconds in median.items():
        rate = f"{total / 1e6 / seconds:7.1f} MB/s  {len(artifacts) / seconds:7.0f} files/s"
        print(f"  {name:<40} {seconds:6.2f} s  {rate}")
    best_aws = min(v for k, v in median.items() if k.startswith("aws"))
    for name in (API, BUCKET_PULL, COMMAND):
        target = "  (target >= 3x)" if name == API else ""
        print(f"ratio aws s3 sync (best) / {name + ':':<42} {best_aws / median[name]:.2f}x{target}")
    print(
        f"\nsecond pull into the populated directory: {again_inside['downloaded']} downloaded, "
        f"{again_inside['skipped']} already in place; install {again_inside['seconds']:.3f} s, "
        f"process {statistics.median(again):.2f} s (target < 1 s); whole command {statistics.median(again_cli):.2f} s"
    )
    shutil.rmtree(work / "seaweed", ignore_errors=True)
    print(f"\nscratch (with the warmed cache, reusable with --cache): {work}")
    return 0


API, BUCKET_PULL, COMMAND = (
    "pull via the API",
    "pull --from the bucket",
    "warmup pull --server (whole command)",
)


def record_entries(
    services: Services, spec: Spec, toolchain: Toolchain, artifacts: list[ArtifactFile]
) -> None:
    """A job for the spec whose every signature has the warmed cache's files as its entry (as `warmup
    warm` records them: the signatures of one run share its files), as workers would leave it, with
    its manifest published into the bucket."""
    signatures = [Keyed.of(s) for s in plan_spec(spec).signatures]
    services.queue.submit_job(Keyed.of(spec), Keyed.of(toolchain), signatures)
    refs = [FileRef(path=a.path, sha256=a.sha256, size=a.size) for a in artifacts]
    services.queue.reserve_blobs(refs)
    while (task := services.queue.claim("bench", toolchain.key(), 60)) is not None:
        services.queue.complete(task.id, "bench", refs, compile_seconds=30.0)
    publish(services, spec, toolchain)  # the job is complete: its manifest goes into the bucket


def race(
    ns: argparse.Namespace,
    work: Path,
    spec_path: Path,
    toolchain_file: Path,
    env: dict[str, str],
    url: str,
    s3: Any,
    files: int,
) -> tuple[dict[str, list[float]], list[float], list[float], dict[str, Any]]:
    """Each contender in turn, alternating the order, into fresh directories; then second pulls."""
    tuned = work / "aws-config"
    tuned.write_text(f"[default]\ns3 =\n  max_concurrent_requests = {ns.parallel}\n")
    source = f"s3://{BUCKET}/{PREFIX}"

    def library(where: str, dest: Path) -> tuple[float, dict[str, Any]]:
        command = [sys.executable, "-c", PULL_CHILD, str(spec_path), str(dest), where, str(toolchain_file)]
        seconds, out = timed([*command, str(ns.parallel)], env)
        result = json.loads(out.strip().splitlines()[-1])
        assert result["downloaded"] + result["skipped"] == files, result
        return seconds, result

    def cli(dest: Path) -> float:
        command = [
            sys.executable,
            "-m",
            "warmup",
            "pull",
            str(spec_path),
            "--server",
            url,
            "--dest",
            str(dest),
        ]
        return timed([*command, "--parallel", str(ns.parallel)], env)[0]

    def aws(dest: Path, config: Path | None = None) -> float:
        aws_env = {**env, "AWS_CONFIG_FILE": str(config or work / "no-aws-config")}
        command = [ns.aws, "s3", "sync", f"{source}/blobs", str(dest), "--endpoint-url", s3.endpoint_url]
        seconds = timed([*command, "--only-show-errors"], aws_env)[0]
        assert sum(1 for p in dest.rglob("*") if p.is_file()) == files
        return seconds

    contenders = {
        API: lambda d: library(url, d)[0],
        BUCKET_PULL: lambda d: library(source, d)[0],
        COMMAND: cli,
        "aws s3 sync (10 requests)": aws,
        f"aws s3 sync ({ns.parallel} requests)": lambda d: aws(d, tuned),
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for round_ in range(ns.rounds):
        order = list(contenders) if round_ % 2 == 0 else list(reversed(contenders))
        for index, name in enumerate(order):
            times[name].append(contenders[name](work / f"dest-{round_}-{index}"))
    populated = work / "populated"
    library(url, populated)
    again = [library(url, populated)[0] for _ in range(ns.rounds)]
    again_inside = library(url, populated)[1]
    again_cli = [cli(populated) for _ in range(ns.rounds)]
    return times, again, again_cli, again_inside


if __name__ == "__main__":
    sys.exit(main())
