"""Pull of a real warmed cache from a real S3 server (SeaweedFS): `warmup pull` against `aws s3 sync`.

Targets: into an empty directory, at least 3x faster than `aws s3 sync` of the same objects on the same
machine, with every sha256 checked; a second pull into the populated directory under 1 s, nothing
downloaded. Prints MB/s and files/s for each, and the ratios, measured side by side in one run.

    python benchmarks/bench_pull.py [--cache DIR] [--aws PATH] [--parallel 16] [--rounds 3]

The cache is a real one: `warmup warm` of a 5-signature SFT job on a tiny model (a few minutes on two
cores; pass --cache to reuse one, e.g. the directory a previous run printed). Its files are uploaded as
blobs into a bucket of a SeaweedFS server started here, and the job's manifest is published next to
them as a worker does. Each contender runs as a fresh process into a fresh directory, alternating:

- `pull`: the library pull from the bucket (`warmup.client.pull(spec, dest, source="s3://...")`) with
  the pod's toolchain given, so the process imports no torch: the transfer, sha256 checks included;
- `warmup pull --from`: the whole command, which first computes the toolchain (imports torch, ~3 s);
- `aws s3 sync` of the same blobs (no sha256 check), with its default 10 concurrent requests and with
  as many as `pull` uses.

awscli is not a dependency of the project: install it apart, e.g.
`python3 -m venv /tmp/awscli-venv && /tmp/awscli-venv/bin/pip install awscli`, and pass --aws
/tmp/awscli-venv/bin/aws (default: `aws` on PATH).
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.tiny_model import build_tiny_model
from tests.support.seaweed import seaweedfs
from warmup.backends import get_backend
from warmup.db.manifests import publish_manifest
from warmup.manifest import Manifest, ManifestFile
from warmup.planner import plan_spec
from warmup.spec import load_spec
from warmup.store import S3BlobStore
from warmup.toolchain import current_toolchain

BUCKET, PREFIX = "bench", "warmup"
PULL_CHILD = """
import json, sys
from warmup.client import pull
spec, dest, source, toolchain, parallel = sys.argv[1:]
r = pull(spec, dest, source=source, toolchain=json.load(open(toolchain)), parallel=int(parallel))
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
    spec_path = job_spec(build_tiny_model(work / "model"), work / "job.json")
    spec = load_spec(spec_path)
    cache = ns.cache or work / "warmed"
    if ns.cache is None:
        print(f"warming {len(plan_spec(spec).signatures)} signatures into {cache} ...", flush=True)
        timed([sys.executable, "-m", "warmup", "warm", str(spec_path), "--cache-dir", str(cache)])
    backend = get_backend("inductor", "cpu")
    artifacts = backend.collect(cache)
    total = sum(a.size for a in artifacts)
    print(f"cache: {cache}: {len(artifacts)} files, {total / 1e6:.1f} MB")

    toolchain = current_toolchain("inductor", "cpu")
    toolchain_file = work / "toolchain.json"
    toolchain_file.write_text(json.dumps(toolchain.model_dump(mode="json")))
    with seaweedfs(work / "seaweed") as s3:
        os.environ.update(s3.env())
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        s3.client().create_bucket(Bucket=BUCKET)
        store = S3BlobStore(BUCKET, PREFIX, endpoint_url=s3.endpoint_url)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda a: store.put_file(cache / a.path, a.sha256), artifacts))
        manifest = Manifest(
            spec_key=spec.key(),
            toolchain_key=toolchain.key(),
            toolchain=toolchain.model_dump(mode="json"),
            backend="inductor",
            device="cpu",
            plan_size=len(plan_spec(spec).signatures),
            signatures=[s.key() for s in plan_spec(spec).signatures],
            files=[ManifestFile(path=a.path, sha256=a.sha256, size=a.size) for a in artifacts],
        )
        publish_manifest(store, manifest)
        source = f"s3://{BUCKET}/{PREFIX}"
        blobs = len({a.sha256 for a in artifacts})
        tuned = work / "aws-config"
        tuned.write_text(f"[default]\ns3 =\n  max_concurrent_requests = {ns.parallel}\n")

        def ours(dest: Path) -> float:
            seconds, out = timed(
                [
                    sys.executable,
                    "-c",
                    PULL_CHILD,
                    str(spec_path),
                    str(dest),
                    source,
                    str(toolchain_file),
                    str(ns.parallel),
                ],
                env,
            )
            result = json.loads(out.strip().splitlines()[-1])
            assert result["downloaded"] + result["skipped"] == len(artifacts), result
            return seconds

        def cli(dest: Path) -> float:
            command = [
                sys.executable,
                "-m",
                "warmup",
                "pull",
                str(spec_path),
                "--from",
                source,
                "--dest",
                str(dest),
            ]
            return timed([*command, "--parallel", str(ns.parallel)], env)[0]

        def aws(dest: Path, config: Path | None = None) -> float:
            aws_env = {**env, "AWS_CONFIG_FILE": str(config or work / "no-aws-config")}
            command = [ns.aws, "s3", "sync", f"s3://{BUCKET}/{PREFIX}/blobs", str(dest)]
            seconds = timed([*command, "--endpoint-url", s3.endpoint_url, "--only-show-errors"], aws_env)[0]
            assert sum(1 for p in dest.rglob("*") if p.is_file()) == blobs
            return seconds

        contenders = {
            "pull (library, transfer)": ours,
            "warmup pull --from (whole command)": cli,
            "aws s3 sync (10 requests)": aws,
            f"aws s3 sync ({ns.parallel} requests)": lambda d: aws(d, tuned),
        }
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for round_ in range(ns.rounds):
            order = list(contenders) if round_ % 2 == 0 else list(reversed(contenders))
            for name in order:
                dest = work / f"dest-{len(times[name])}-{name.split()[0]}-{abs(hash(name)) % 1000}"
                times[name].append(contenders[name](dest))
        populated = work / "populated"
        ours(populated)
        again = [ours(populated) for _ in range(ns.rounds)]
        again_inside = json.loads(
            timed(
                [
                    sys.executable,
                    "-c",
                    PULL_CHILD,
                    str(spec_path),
                    str(populated),
                    source,
                    str(toolchain_file),
                    "16",
                ],
                env,
            )[1]
            .strip()
            .splitlines()[-1]
        )
        again_cli = [cli(populated) for _ in range(ns.rounds)]

    print(
        f"\n{len(artifacts)} files, {total / 1e6:.1f} MB; median of {ns.rounds} rounds, each a fresh process into an empty directory"
    )
    median = {name: statistics.median(values) for name, values in times.items()}
    for name, seconds in median.items():
        print(
            f"  {name:<38} {seconds:6.2f} s  {total / 1e6 / seconds:7.1f} MB/s  {len(artifacts) / seconds:7.0f} files/s"
        )
    best_aws = min(v for k, v in median.items() if k.startswith("aws"))
    print(
        f"\nratio aws s3 sync (best) / pull (transfer):        {best_aws / median['pull (library, transfer)']:.1f}x  (target >= 3x)"
    )
    print(
        f"ratio aws s3 sync (best) / warmup pull (command):  {best_aws / median['warmup pull --from (whole command)']:.1f}x"
    )
    print(
        f"\nsecond pull into the populated directory: {again_inside['downloaded']} downloaded, "
        f"{again_inside['skipped']} already in place; install {again_inside['seconds']:.3f} s, "
        f"process {statistics.median(again):.2f} s (target < 1 s); whole command {statistics.median(again_cli):.2f} s"
    )
    shutil.rmtree(work / "seaweed", ignore_errors=True)
    print(f"\nscratch (with the warmed cache, reusable with --cache): {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
