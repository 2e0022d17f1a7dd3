"""The proof of the pod side: submit -> a real worker -> `warmup pull` -> a real TRL run under `warmup exec`.

One service (SQLite and a local blob directory, served by uvicorn in a thread) and the real worker
loop. The training run is a fresh process that knows nothing of trl-warmup but `WarmupCallback()`:
`warmup exec` sets the cache environment and the compile policy. It must compile nothing, and its
coverage report, read back from the API, must say so. Then the same spec trains on longer data than
its facts promise: the callback reports the shape it compiled, the service schedules it, a worker warms
it, and the next pull has it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.jobs import run, served_warm, write_spec
from tests.support.live_server import serve
from warmup.api.services import Services
from warmup.backends.base import recompile_limits
from warmup.client.local import read_local_manifest
from warmup.client.service import ServiceClient
from warmup.job.spec import load_spec
from warmup.planner.planning import plan_spec
from warmup.settings import Settings
from warmup.worker.loop import Worker, WorkerOptions

POD_TRAIN = Path(__file__).resolve().parents[1] / "support" / "pod_train.py"


@pytest.fixture
def services(sqlite_url: str, tmp_path: Path):
    settings = Settings(
        data_dir=tmp_path / "service", database_url=sqlite_url, store_url=str(tmp_path / "blobs"), auth="off"
    )
    started = Services.start(settings)
    yield started
    started.close()


def work_until_idle(services: Services, tmp_path: Path) -> list:
    """The real worker loop against the service's database and store: claim, rehearse, upload, publish."""
    (tmp_path / "work").mkdir(exist_ok=True)
    options = WorkerOptions(
        database_url=services.settings.resolved_database_url,
        store_url=services.settings.resolved_store_url,
        work_dir=tmp_path / "work",
        exit_when_idle=True,
        task_timeout_s=600,
    )
    return Worker(options, engine=services.engine, store=services.store).run()


def exec_training(spec: Path, url: str, cache: Path, weights: Path, out: Path, **data: int) -> dict:
    command = [sys.executable, "-m", "warmup", "exec", spec, "--server", url, "--dest", cache, "--"]
    command += [sys.executable, POD_TRAIN, "--weights", weights, "--out", out]
    for name, value in data.items():
        command += [f"--{name.replace('_', '-')}", value]
    done = run(command)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    result = json.loads(out.read_text())
    result["stderr"] = done.stderr
    return result


def test_submit_worker_pull_exec_train_then_a_reported_miss_is_warmed(
    services, tiny_model_dir, user_weights_dir, tmp_path
):
    # The data facts promise rows of at most 30 tokens: one bucket, train 2x32.
    spec_path = write_spec(
        tmp_path / "sft.yaml",
        "sft",
        tiny_model_dir,
        {"per_device_train_batch_size": 2, "max_length": 64, "pad_to_multiple_of": 32},
        {"num_train_examples": 8, "min_tokens": 10, "max_tokens": 30},
    )
    spec = load_spec(spec_path)
    (planned,) = plan_spec(spec).signatures
    cache = tmp_path / "pod-cache"

    with serve(services) as url, ServiceClient(url) as client:
        submitted = run([sys.executable, "-m", "warmup", "submit", spec_path, "--server", url])
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()
        assert [o.status for o in work_until_idle(services, tmp_path)] == ["done"]
        assert client.job(job_id)["state"] == "ready"

        # (a) pull into an empty directory, then a real SFT run in a fresh process under `warmup exec`
        pulled = run([sys.executable, "-m", "warmup", "pull", spec_path, "--server", url, "--dest", cache])
        assert pulled.returncode == 0, pulled.stderr
        assert "installed" in pulled.stderr and "sha256 verified" in pulled.stderr
        installed = read_local_manifest(cache, spec.key())
        assert installed is not None and installed.signatures == [planned.key()]
        assert all((cache / f.path).is_file() for f in installed.files)
        assert any(f.path.endswith(".so") for f in installed.files)  # the compiled kernels travel too

        warm = exec_training(
            spec_path, url, cache, user_weights_dir, tmp_path / "warm.json",
            min_tokens=10, split=20, max_tokens=30, steps=3, data_seed=7,
        )  # fmt: skip
        assert {tuple(s) for s in warm["shapes"]} == {(2, 32)}
        assert warm["cache_dir"] == str(cache.resolve())
        assert warm["recompile_limit"] == recompile_limits(1)[0]  # set by exec, not by the script
        report = warm["report"]
        assert report["fresh_compiles"] == 0, report["details"]
        assert report["details"]["new_files"] == 0 and report["details"]["fresh"] == {}
        assert (report["met"], report["missed"]) == ([planned.key()], [])
        assert served_warm(warm), (warm["counters"], warm["trace_skip"])
        # the run's last line is its verdict: what it met and compiled, where the compile time went, the first
        # step's time, and where the report went (exec's own exit line, which says the same, is not printed after it)
        verdict = (
            r"trl-warmup: completed: met 1 signature\(s\), 1 warm, 0 missed, 0 fresh compile\(s\); trace [\d.]+ s, "
            r"backend [\d.]+ s, cache load [\d.]+ s, first step [\d.]+ s; trace skip.*; report \d+ posted for job "
            + job_id[:8]
        )
        said = [line for line in warm["stderr"].splitlines() if line.startswith("trl-warmup: ")]
        assert said and re.fullmatch(verdict, said[-1]), warm["stderr"][-3000:]
        assert warm["response"]["job_id"] == job_id and warm["response"]["enqueued"] == []
        (stored,) = client.coverage(job_id)  # what the service keeps says so too
        assert (stored["fresh_compiles"], stored["met"], stored["missed"]) == (0, [planned.key()], [])
        assert stored["details"]["status"] == "completed"
        shown = run([sys.executable, "-m", "warmup", "coverage", job_id, "--server", url])
        assert shown.returncode == 0 and "completed" in shown.stdout and "1 report(s)" in shown.stdout

        # (b) the same spec, but the data reaches 60 tokens: the 2x64 bucket the plan did not have
        longer = exec_training(
            spec_path, url, cache, user_weights_dir, tmp_path / "longer.json",
            min_tokens=10, split=30, max_tokens=60, steps=2, data_seed=8,
        )  # fmt: skip
        assert {tuple(s) for s in longer["shapes"]} == {(2, 32), (2, 64)}
        assert (
            "train 2x64 compiled during training and the plan of this spec did not list it"
            in longer["stderr"]
        )
        report = longer["report"]
        assert report["fresh_compiles"] > 0
        (missed,) = report["missed"]
        assert (missed["phase"], missed["batch"], missed["seq_len"]) == ("train", 2, 64)
        missed_key = planned.model_copy(update={"seq_len": 64}).key()
        assert longer["response"]["enqueued"] == [missed_key]
        job = client.job(job_id)
        scheduled = {s["key"]: s for s in job["signatures"]}[missed_key]
        assert (scheduled["state"], scheduled["source"]) == ("queued", "coverage")
        assert client.coverage(job_id)[-1]["missed"] == [missed_key]

        assert [o.status for o in work_until_idle(services, tmp_path)] == ["done"]
        again = run([sys.executable, "-m", "warmup", "pull", spec_path, "--server", url, "--dest", cache])
        assert again.returncode == 0, again.stderr
        grown = read_local_manifest(cache, spec.key())
        assert grown is not None and set(grown.signatures) == {planned.key(), missed_key}
        assert all((cache / f.path).is_file() for f in grown.files)

    # Without the API: the worker published the complete manifest into the store, after its blobs.
    from_store = tmp_path / "from-store"
    offline = run(
        [
            sys.executable,
            "-m",
            "warmup",
            "pull",
            spec_path,
            "--from",
            tmp_path / "blobs",
            "--dest",
            from_store,
        ]
    )
    assert offline.returncode == 0, offline.stderr
    assert {f.path for f in grown.files} <= {
        p.relative_to(from_store).as_posix() for p in from_store.rglob("*")
    }


def test_a_run_of_another_batch_size_never_breaks_the_shared_job(
    services, tiny_model_dir, user_weights_dir, tmp_path
):
    """Issue 35. (a) `trainer.add_callback(WarmupCallback())` on a built trainer trains a warmed job with 0
    misses. (b) A run of the same spec with batch 4 (the job warmed batch 2) under --strict stops before
    compiling, names the batch size, and reports `train 4x32`: the service records it with its reason and no
    task (the spec's trainer cannot produce it). (c) The job stays ready: a pull of the unchanged spec exits 0
    without --allow-partial, and `warmup coverage` and the status page show the run's signature and why."""
    spec_path = write_spec(
        tmp_path / "sft.yaml",
        "sft",
        tiny_model_dir,
        {"per_device_train_batch_size": 2, "max_length": 64, "pad_to_multiple_of": 32},
        {"num_train_examples": 8, "min_tokens": 10, "max_tokens": 30},
    )
    spec = load_spec(spec_path)
    (planned,) = plan_spec(spec).signatures
    other = planned.model_copy(update={"batch": 4})
    cache = tmp_path / "pod-cache"
    with serve(services) as url, ServiceClient(url) as client:
        submitted = run([sys.executable, "-m", "warmup", "submit", spec_path, "--server", url])
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()
        assert [o.status for o in work_until_idle(services, tmp_path)] == ["done"]
        pulled = run([sys.executable, "-m", "warmup", "pull", spec_path, "--server", url, "--dest", cache])
        assert pulled.returncode == 0, pulled.stderr

        # (a) added to the built trainer, as transformers documents: trains, and nothing compiles
        warm = exec_training(
            spec_path, url, cache, user_weights_dir, tmp_path / "warm.json",
            min_tokens=10, split=20, max_tokens=30, steps=2, attach="add_callback",
        )  # fmt: skip
        assert {tuple(s) for s in warm["shapes"]} == {(2, 32)}
        report = warm["report"]
        assert (report["fresh_compiles"], report["met"], report["missed"]) == (0, [planned.key()], [])
        assert report["details"]["status"] == "completed" and "AcceleratorState" not in warm["stderr"]

        # (b) the same spec trained with batch 4, strict: stopped before the compile, the real difference named
        command = [sys.executable, "-m", "warmup", "exec", spec_path, "--server", url, "--dest", cache]
        command += ["--strict", "--", sys.executable, POD_TRAIN, "--weights", user_weights_dir]
        command += ["--out", tmp_path / "other.json", "--min-tokens", 10, "--split", 20, "--max-tokens", 30]
        command += ["--steps", 1, "--batch", 4]
        refused = run(command)
        assert refused.returncode != 0, refused.stderr[-3000:]
        assert "strict: train 4x32 was not warmed" in refused.stderr, refused.stderr[-3000:]
        named = "the run's arguments differ from the spec's: per_device_train_batch_size 4 (the spec: 2)"
        assert named in refused.stderr and "data facts" not in refused.stderr
        assert "cannot warm it from this spec" in refused.stderr
        stored = client.coverage(job_id)[-1]
        assert stored["details"]["status"] == "refused" and stored["missed"] == [other.key()]
        assert stored["fresh_compiles"] == 0

        # (c) evidence, not a command: no task, the job stays ready, a pod of the unchanged spec starts
        job = client.job(job_id)
        assert job["state"] == "ready" and job["reported"] == {"unwarmable": 1}
        (shown,) = [s for s in job["signatures"] if s["key"] == other.key()]
        assert shown["state"] == "unwarmable" and "at most 2 rows, this one has 4" in shown["error"]
        assert work_until_idle(services, tmp_path) == []  # nothing queued, nothing retried
        again = run(
            [
                sys.executable,
                "-m",
                "warmup",
                "pull",
                spec_path,
                "--server",
                url,
                "--dest",
                tmp_path / "next-pod",
            ]
        )
        assert again.returncode == 0, again.stderr
        shown_cli = run([sys.executable, "-m", "warmup", "coverage", job_id, "--server", url])
        assert shown_cli.returncode == 0, shown_cli.stderr
        assert (
            "train 4x32  unwarmable: the spec's trainer makes train batches of at most 2 rows"
            in shown_cli.stdout
        )
        assert f"report(s) for job {job_id[:8]} (ready)" in shown_cli.stdout
        page = httpx.get(f"{url}/").text
        assert "train 4x32" in page and "unwarmable" in page and "at most 2 rows, this one has 4" in page


def test_the_config_a_team_passes_to_trl_sft_trains_under_exec_with_nothing_compiled(
    services, user_weights_dir, tmp_path
):
    """The whole user path, with TRL's own CLI: the YAML `trl sft --config` trains with, planned with facts read
    from the dataset on disk, warmed by a real worker, and `warmup exec --strict -- trl sft --config FILE`.

    `trl sft` starts its script under `accelerate launch`, which gives the training process OMP_NUM_THREADS=1
    (the thread count is in Inductor's key) and exports its dynamo settings: before exec pinned the thread
    count, this run compiled every graph again (the strict callback stops it at the first step)."""
    from tests.support.tiny_model import words

    data = tmp_path / "data"
    data.mkdir()
    rows = [{"text": words(n, offset=n)} for n in (20, 35, 50, 65, 80, 95)]  # all pad to 128: one shape
    (data / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = tmp_path / "sft.yaml"
    config.write_text(
        f"model_name_or_path: {user_weights_dir}\n"
        f"dataset_name: {data}\n"
        "max_length: 128\n"
        "pad_to_multiple_of: 128\n"
        "per_device_train_batch_size: 2\n"
        "max_steps: 2\n"
        "torch_compile: true\n"
        "use_cpu: true  # TRL refuses its default bf16 on a CPU without it\n"
        f"output_dir: {tmp_path / 'out'}\n"
        "report_to: none\n"
        "save_strategy: 'no'\n"
    )
    job = ["--trainer", "sft", "--target", "cpu", "--dataset", data]
    trl = Path(sys.executable).with_name("trl")
    with serve(services) as url:
        submitted = run([sys.executable, "-m", "warmup", "submit", config, *job, "--server", url])
        assert submitted.returncode == 0, submitted.stderr
        assert [o.status for o in work_until_idle(services, tmp_path)] == ["done"]
        command = [sys.executable, "-m", "warmup", "exec", config, *job, "--server", url]
        command += ["--dest", tmp_path / "cache", "--strict", "--", trl, "sft", "--config", config]
        trained = run(command)
    assert trained.returncode == 0, f"{trained.stdout[-3000:]}\n{trained.stderr[-6000:]}"
    assert "Training completed" in trained.stdout + trained.stderr
    report = json.loads((tmp_path / "out" / "warmup-coverage.json").read_text())
    assert report["fresh_compiles"] == 0 and report["details"]["new_files"] == 0, report["details"]
    assert report["details"]["fresh"] == {}, report["details"]
    assert report["missed"] == [] and len(report["met"]) == 1
    said = [line for line in trained.stderr.splitlines() if line.startswith("trl-warmup: ")]
    assert said[-1].startswith(
        "trl-warmup: completed: met 1 signature(s), 1 warm, 0 missed, 0 fresh compile(s); "
    )
    assert " posted for job " in said[-1], trained.stderr[-3000:]
