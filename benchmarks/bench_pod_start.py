"""A fresh training pod's time to its first training step, four ways, side by side in one run.

From process start to the end of the first training step of a real TRL job (SFT of a tiny model on
CPU, Inductor, three planned shapes), each run a fresh process with an empty cache directory:

- `cold`: no cache; the first step compiles;
- `aws s3 sync + train`: `aws s3 sync` of the warmed cache directory from a real S3 server
  (SeaweedFS, on this machine), then the training process (which activates it: `warmup.activate`);
- `warmup exec`: `warmup exec SPEC --server URL --dest DIR -- python train_job.py ...`: the pull (its
  toolchain, the manifest, the blobs from the same S3 server through presigned URLs, every sha256
  checked) beside the same training process's start (its first compile waits for the files), which
  checks the exact toolchain before it trusts the cache;
- `warmup exec --pull-first`: the same, the pull finished before the training process starts (what
  the download beside the start saves).

And the whole `warmup pull` command into an empty directory against `aws s3 sync` of the same blobs
(the bucket's `blobs/` prefix), both fresh processes, alternating.

Targets (issue 14): `warmup exec` no slower than `aws s3 sync` + training; the whole `warmup pull` at
least 2x faster than `aws s3 sync`.

The image is prepared once, as a training image's build would (`warmup toolchain --remember`, not
timed): a pod then finds its toolchain in the image's memo without importing torch. Every warm run is
checked to have compiled nothing. Each process gets a fresh TMPDIR: Inductor's default cache directory
(under it) is where a process that has not set its cache directory yet builds the CPU ISA probes, and
a pod starts with it empty (a shared one would spare later runs the g++ builds a pod pays).

    python benchmarks/bench_pod_start.py [--rounds 5] [--aws PATH] [--scratch DIR]

--scratch reuses the job and the warmed cache of an earlier run (the directory it printed).

awscli is not a dependency of the project: `pip install awscli` apart (or the `bench` extra) and
pass --aws (default: `aws` next to this interpreter, else on PATH).
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
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_pull import record_entries
from warm_runs import HIGH, LOW, SPLITS, TRAIN_JOB, Job, make_job, warm

from tests.support.live_server import serve
from tests.support.seaweed import seaweedfs
from warmup.api.services import Services
from warmup.backends.registry import get_backend
from warmup.job.spec import load_spec
from warmup.planner.planning import plan_spec
from warmup.settings import Settings
from warmup.toolchain.probes import current_toolchain

REPO = Path(__file__).resolve().parents[1]
BUCKET, PREFIX, SYNCED = "bench", "warmup", "cache-dir"
COLD, AWS_TRAIN = "cold (no cache)", "aws s3 sync + train"
EXEC, EXEC_FIRST = "warmup exec (pull beside train)", "warmup exec --pull-first"
PULL, AWS_BLOBS = "warmup pull (whole command)", "aws s3 sync (same blobs)"


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:5])} ... failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    default_aws = Path(sys.executable).with_name("aws")
    parser.add_argument("--aws", default=str(default_aws) if default_aws.exists() else shutil.which("aws"))
    parser.add_argument("--scratch", type=Path, help="the job and warmed cache of an earlier run")
    ns = parser.parse_args()
    if not ns.aws or not shutil.which(ns.aws):
        raise SystemExit("no aws CLI: pip install awscli apart and pass --aws")

    if ns.scratch is not None and (ns.scratch / "warmed" / "trl-warmup.json").is_file():
        job = Job(ns.scratch, ns.scratch / "job.yaml", ns.scratch / "weights")
    else:
        job = make_job()
    spec = load_spec(job.spec)
    cache = job.root / "warmed"
    if not (cache / "trl-warmup.json").is_file():
        print(f"warming {len(plan_spec(spec).signatures)} signatures into {cache} ...", flush=True)
        print(f"warmup warm: {warm(job, cache):.0f} s", flush=True)
    work = job.root / f"run-{int(time.time())}"
    work.mkdir()
    artifacts = get_backend("inductor", "cpu").collect(cache)
    every_file = sorted(
        p for p in cache.rglob("*") if p.is_file() and p.relative_to(cache).parts[0] != "locks"
    )
    print(f"cache: {len(artifacts)} artifacts, {sum(a.size for a in artifacts) / 1e6:.1f} MB", flush=True)

    compileall.compile_dir(REPO / "warmup", quiet=1)  # as pip leaves an installed package
    env = {**os.environ, "PYTHONPATH": str(REPO), "WARMUP_TOOLCHAIN_MEMO": str(work / "image-memo.json")}
    run([sys.executable, "-m", "warmup", "toolchain", "--remember"], env)  # the image build, once
    toolchain = current_toolchain("inductor", "cpu")

    with seaweedfs(work / "seaweed") as s3:
        env.update(s3.env())
        os.environ.update(s3.env())
        client = s3.client()
        client.create_bucket(Bucket=BUCKET)
        services = Services.start(
            Settings(data_dir=work / "service", store_url=f"s3://{BUCKET}/{PREFIX}", auth="off")
        )
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda a: services.store.put_file(cache / a.path, a.sha256), artifacts))
            list(
                pool.map(
                    lambda p: client.upload_file(
                        str(p), BUCKET, f"{SYNCED}/{p.relative_to(cache).as_posix()}"
                    ),
                    every_file,
                )
            )
        record_entries(services, spec, toolchain, artifacts)
        with serve(services) as url:
            starts, pulls, notes = race(ns, job, work, env, url, s3.endpoint_url)
        services.close()

    print(f"\ntime to the end of the first training step, median of {ns.rounds} (each a fresh process):")
    median = {name: statistics.median(values) for name, values in starts.items()}
    for name, seconds in median.items():
        print(f"  {name:<40} {seconds:6.1f} s   ({', '.join(f'{v:.1f}' for v in starts[name])})")
    print(f"ratio cold / warmup exec:                   {median[COLD] / median[EXEC]:.2f}x")
    print(
        f"ratio (aws s3 sync + train) / warmup exec:  {median[AWS_TRAIN] / median[EXEC]:.2f}x  (target >= 1)"
    )
    print(f"ratio exec --pull-first / exec:             {median[EXEC_FIRST] / median[EXEC]:.2f}x")
    pull_median = {name: statistics.median(values) for name, values in pulls.items()}
    print(f"\ninto an empty directory, {len(artifacts)} files, median of {ns.rounds}:")
    for name, seconds in pull_median.items():
        print(f"  {name:<40} {seconds:6.2f} s   ({', '.join(f'{v:.2f}' for v in pulls[name])})")
    print(
        f"ratio aws s3 sync / warmup pull:            {pull_median[AWS_BLOBS] / pull_median[PULL]:.2f}x  (target >= 2)"
    )
    print(f"\nthe pods' toolchain: {notes}")
    shutil.rmtree(work / "seaweed", ignore_errors=True)
    print(f"scratch (reusable with --scratch): {job.root}")
    return 0


def race(
    ns: argparse.Namespace, job: Any, work: Path, env: dict[str, str], url: str, endpoint: str
) -> tuple[dict[str, list[float]], dict[str, list[float]], set[str]]:
    base_env = env
    notes: set[str] = set()

    def fresh(tag: str) -> dict[str, str]:
        """The environment of one pod: its own empty TMPDIR, and no Inductor cache directory of this
        process's (Inductor sets TORCHINDUCTOR_CACHE_DIR in the environment of a process that used its
        default one, such as this one: inherited, it would hand the cold and synced runs the CPU probe
        programs built by earlier rounds, which a fresh pod builds)."""
        tmp = work / f"tmp-{tag}-{time.monotonic_ns()}"
        tmp.mkdir()
        env = {**base_env, "TMPDIR": str(tmp), "AWS_CONFIG_FILE": str(work / "no-aws-config")}
        env.pop("TORCHINDUCTOR_CACHE_DIR", None)
        return env

    def train_command(cache: Path, out: Path) -> list[str]:
        command = [sys.executable, str(TRAIN_JOB), "--spec", str(job.spec), "--weights", str(job.weights)]
        command += ["--cache-dir", str(cache), "--out", str(out), "--steps", "1"]
        return [*command, "--min-tokens", str(LOW), "--split", SPLITS, "--max-tokens", str(HIGH)]

    def first_step(out: Path, started: float, *, warm: bool) -> float:
        report = json.loads(out.read_text())
        if warm:
            fresh = report["fresh_compiles"] or {}
            compiled = sum(v for k, v in fresh.items() if k != "new_files") + len(fresh.get("new_files", []))
            assert compiled == 0, f"a warmed run compiled: {fresh}"
        return float(report["step_ends"][0]) - started

    def cold(tag: str) -> float:
        cache, out = work / f"cold-{tag}", work / f"cold-{tag}.json"
        cache.mkdir()
        env = fresh(tag)
        started = time.time()
        run(train_command(cache, out), env)
        return first_step(out, started, warm=False)

    def aws_then_train(tag: str) -> float:
        cache, out = work / f"synced-{tag}", work / f"synced-{tag}.json"
        env = fresh(tag)
        started = time.time()
        sync = [ns.aws, "s3", "sync", f"s3://{BUCKET}/{SYNCED}", str(cache), "--endpoint-url", endpoint]
        run([*sync, "--only-show-errors"], env)
        run(train_command(cache, out), env)
        return first_step(out, started, warm=True)

    def warmup_exec(tag: str, *, first: bool = False) -> float:
        cache, out = work / f"exec{'-first' if first else ''}-{tag}", work / f"exec-{first}-{tag}.json"
        env = fresh(tag)
        started = time.time()
        command = [
            sys.executable,
            "-m",
            "warmup",
            "exec",
            str(job.spec),
            "--server",
            url,
            "--dest",
            str(cache),
            *(["--pull-first"] if first else []),
        ]
        done = run([*command, "--", *train_command(cache, out)], env)
        notes.add("computed" if "this pod computed its toolchain" in done.stderr else "from the image's memo")
        return first_step(out, started, warm=True)

    def pull(tag: str) -> float:
        env = fresh(tag)
        started = time.perf_counter()
        done = run(
            [
                sys.executable,
                "-m",
                "warmup",
                "pull",
                str(job.spec),
                "--server",
                url,
                "--dest",
                str(work / f"pull-{tag}"),
            ],
            env,
        )
        notes.add("computed" if "this pod computed its toolchain" in done.stderr else "from the image's memo")
        return time.perf_counter() - started

    def aws_blobs(tag: str) -> float:
        env = fresh(tag)
        started = time.perf_counter()
        sync = [ns.aws, "s3", "sync", f"s3://{BUCKET}/{PREFIX}/blobs", str(work / f"blobs-{tag}")]
        run([*sync, "--endpoint-url", endpoint, "--only-show-errors"], env)
        return time.perf_counter() - started

    starts: dict[str, list[float]] = {COLD: [], AWS_TRAIN: [], EXEC: [], EXEC_FIRST: []}
    pulls: dict[str, list[float]] = {PULL: [], AWS_BLOBS: []}
    ways = {
        COLD: cold,
        AWS_TRAIN: aws_then_train,
        EXEC: warmup_exec,
        EXEC_FIRST: lambda tag: warmup_exec(tag, first=True),
    }
    transfers = {PULL: pull, AWS_BLOBS: aws_blobs}
    for round_ in range(ns.rounds):
        order = list(ways) if round_ % 2 == 0 else list(reversed(ways))
        for name in order:
            starts[name].append(ways[name](str(round_)))
            print(f"round {round_ + 1}: {name}: {starts[name][-1]:.1f} s", flush=True)
        for name in list(transfers) if round_ % 2 == 0 else list(reversed(transfers)):
            pulls[name].append(transfers[name](str(round_)))
    return starts, pulls, notes


if __name__ == "__main__":
    sys.exit(main())
