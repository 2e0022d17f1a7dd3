"""`warmup pull` / `warmup exec` / `warmup coverage` against the real service on PostgreSQL and SeaweedFS S3.

The API runs in uvicorn in a thread; pods download blobs straight from S3 through presigned URLs, or
read the bucket without the API (`--from`). Workers are played by the queue (no compiles). The CLI
runs in subprocesses, which compute their toolchain as a pod does; the entries are made under that
same toolchain (or a changed copy of it, to be refused).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.live_server import serve
from tests.support.pods import HostileService, hostile_manifest, hostile_service, play_worker, publish
from tests.support.tiny_model import write_tiny_model
from warmup.api.services import Services
from warmup.backends.base import recompile_limits
from warmup.client.installing import install
from warmup.client.local import INDEX_NAME, read_local_manifest
from warmup.client.pulling import pull
from warmup.client.service import ServiceClient
from warmup.errors import BlobIntegrityError, ToolchainMismatchError, UnsafeArtifactError
from warmup.job.spec import load_spec
from warmup.manifest import manifest_object_key
from warmup.planner.planning import plan_spec
from warmup.settings import Settings
from warmup.toolchain.model import Toolchain
from warmup.toolchain.probes import current_toolchain

PREFIX = "warmup"


@pytest.fixture(scope="module")
def pod_toolchain() -> Toolchain:
    return current_toolchain("inductor", "cpu")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model"))


def spec_doc(model_dir: Path, max_tokens: int = 60, max_length: int = 64) -> dict:
    return {
        "trainer": "sft",
        "model": str(model_dir),
        "args": {
            "per_device_train_batch_size": 2,
            "max_length": max_length,
            "pad_to_multiple_of": 32,
            "torch_compile": True,
        },
        "data": {"num_train_examples": 8, "min_tokens": 10, "max_tokens": max_tokens},
        "target": {"backend": "inductor", "device": "cpu"},
    }


@pytest.fixture
def spec_file(model_dir, tmp_path) -> Path:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(spec_doc(model_dir)))
    return path


@pytest.fixture
def services(pg_url, s3_bucket, tmp_path):
    settings = Settings(
        data_dir=tmp_path / "service", database_url=pg_url, store_url=f"s3://{s3_bucket}/{PREFIX}", auth="off"
    )
    started = Services.start(settings)
    yield started
    started.close()


@pytest.fixture
def api_url(services):
    with serve(services) as url:
        yield url


# A port nothing listens on is retried for as long as a service takes to restart: not here.
def no_retries() -> dict[str, str]:
    return {**os.environ, "WARMUP_RETRY_S": "1"}


def warmup(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "warmup", *(str(a) for a in args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def warm(
    services: Services, spec_file: Path, toolchain: Toolchain, scratch: Path, tasks: int | None = None
) -> None:
    """Submit the spec for `toolchain` and play its worker."""
    spec = load_spec(spec_file)
    services.queue.submit_job(
        *(_keyed(spec), _keyed(toolchain)), [_keyed(s) for s in plan_spec(spec).signatures]
    )
    play_worker(services, toolchain.key(), scratch, tasks=tasks)


def _keyed(document):
    from warmup.db.records import Keyed

    return Keyed.of(document)


def cache_files(directory: Path) -> set[str]:
    """The files in a cache dir, the pull's own bookkeeping left out (after a successful CLI pull, the
    CPU ISA probes Inductor builds are there too: see warmup.pod.training_env.IsaProbes)."""
    if not directory.exists():
        return set()
    return {
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if p.is_file() and not p.relative_to(directory).as_posix().startswith(".warmup")
    }


def test_pull_says_what_to_do_until_the_cache_is_complete_then_installs_it_once(
    api_url, services, spec_file, pod_toolchain, tmp_path
):
    dest = tmp_path / "cache"
    not_warmed = warmup("pull", spec_file, "--server", api_url, "--dest", dest)
    assert not_warmed.returncode == 3, not_warmed.stderr
    assert "--wait" in not_warmed.stderr and "submit" in not_warmed.stderr

    warm(services, spec_file, pod_toolchain, tmp_path / "scratch", tasks=1)
    partly = warmup("pull", spec_file, "--server", api_url, "--dest", dest)
    assert partly.returncode == 3
    assert "train 2x" in partly.stderr and "--allow-partial" in partly.stderr and "--wait" in partly.stderr
    assert cache_files(dest) == set()

    some = warmup("pull", spec_file, "--server", api_url, "--dest", dest, "--allow-partial")
    assert some.returncode == 0, some.stderr
    assert "1 signature(s) are not warm yet" in some.stderr and "installed 3 file(s)" in some.stderr
    assert "a run that meets one of these shapes compiles it (under --strict it stops there" in some.stderr
    part = read_local_manifest(dest, load_spec(spec_file).key())
    assert part is not None and len(part.missing) == 1 and {f.path for f in part.files} <= cache_files(dest)

    play_worker(services, pod_toolchain.key(), tmp_path / "scratch")
    complete = warmup("pull", spec_file, "--server", api_url, "--dest", dest)
    assert complete.returncode == 0, complete.stderr
    assert "installed 3 file(s)" in complete.stderr and "3 already in place" in complete.stderr
    assert "MB/s" in complete.stderr and "files/s" in complete.stderr
    manifest = read_local_manifest(dest, load_spec(spec_file).key())
    assert manifest is not None and len(manifest.signatures) == 2 and manifest.missing == []
    assert all(f.url is None for f in manifest.files)  # presigned URLs expire: not kept
    assert {f.path for f in manifest.files} <= cache_files(dest)
    for file in manifest.files:
        assert hashlib.sha256((dest / file.path).read_bytes()).hexdigest() == file.sha256
        assert (dest / file.path).stat().st_mode & 0o777 == 0o644

    before = {p: (dest / p).stat().st_mtime_ns for p in cache_files(dest)}
    again = warmup("pull", spec_file, "--server", api_url, "--dest", dest)
    assert again.returncode == 0 and "up to date" in again.stderr and "nothing downloaded" in again.stderr
    assert {p: (dest / p).stat().st_mtime_ns for p in cache_files(dest)} == before


def test_print_env_and_exec_set_the_cache_and_the_compile_policy(
    api_url, services, spec_file, pod_toolchain, tmp_path
):
    warm(services, spec_file, pod_toolchain, tmp_path / "scratch")
    dest = tmp_path / "cache"
    limit, accumulated = recompile_limits(len(plan_spec(load_spec(spec_file)).signatures))

    printed = warmup("pull", spec_file, "--server", api_url, "--dest", dest, "--print-env")
    assert printed.returncode == 0, printed.stderr
    assert all(line.startswith("export ") for line in printed.stdout.splitlines())
    shell = subprocess.run(
        [
            "bash",
            "-c",
            'eval "$(cat)"; echo "$TORCHINDUCTOR_CACHE_DIR|$WARMUP_RECOMPILE_LIMIT|$WARMUP_SERVER|$OMP_NUM_THREADS"',
        ],
        input=printed.stdout,
        capture_output=True,
        text=True,
    )
    # The thread count the cache was compiled for (in Inductor's key), so that no launcher picks another.
    threads = os.environ.get("OMP_NUM_THREADS") or str(pod_toolchain.num_threads)
    assert shell.stdout.strip() == f"{dest.resolve()}|{limit}|{api_url}|{threads}"

    # A pre-existing sitecustomize on the path still runs under exec.
    other = tmp_path / "image-site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['IMAGE_SITECUSTOMIZE'] = 'ran'\n")
    child = (
        "import json, os, torch, torch._dynamo.config as c; print(json.dumps({'limits': [c.recompile_limit, "
        "c.accumulated_recompile_limit], 'threads': torch.get_num_threads(), 'env': {k: os.environ.get(k) for k in ('TORCHINDUCTOR_CACHE_DIR', "
        "'TORCH_COMPILE_CACHE_KEY_TAG', 'ACCELERATE_DYNAMO_USE_DYNAMIC', 'IMAGE_SITECUSTOMIZE', 'WARMUP_SERVER')},"
        " 'spec': json.loads(os.environ['WARMUP_SPEC'])['trainer']}))"
    )
    env = {**os.environ, "PYTHONPATH": f"{other}{os.pathsep}{os.environ['PYTHONPATH']}"}
    ran = warmup(
        "exec", spec_file, "--server", api_url, "--dest", dest, "--", sys.executable, "-c", child, env=env
    )
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout.strip().splitlines()[-1])
    assert seen["limits"] == [limit, accumulated]  # raised without warmup.activate
    assert seen["threads"] == pod_toolchain.num_threads
    assert seen["env"]["TORCHINDUCTOR_CACHE_DIR"] == str(dest.resolve())
    assert seen["env"]["TORCH_COMPILE_CACHE_KEY_TAG"].startswith("trl-warmup;isa=")
    assert seen["env"]["ACCELERATE_DYNAMO_USE_DYNAMIC"] == "False"
    assert seen["env"]["IMAGE_SITECUSTOMIZE"] == "ran" and seen["env"]["WARMUP_SERVER"] == api_url
    assert seen["spec"] == "sft" and "up to date" in ran.stderr and "exec: " in ran.stderr

    missing = warmup("exec", spec_file, "--server", api_url, "--dest", dest, "--", "no-such-command-xyz")
    assert missing.returncode == 1 and "cannot run 'no-such-command-xyz'" in missing.stderr

    # The service is away when the training container starts: the initContainer's pull is enough.
    away = warmup(
        "exec",
        spec_file,
        "--server",
        "http://127.0.0.1:9",
        "--dest",
        dest,
        "--",
        sys.executable,
        "-c",
        child,
        env=no_retries(),
    )
    assert away.returncode == 0, away.stderr
    assert "cannot reach" in away.stderr and "using the cache an earlier pull installed" in away.stderr
    assert json.loads(away.stdout.strip().splitlines()[-1])["limits"] == [limit, accumulated]
    # No service given at all (the documented no-server mode): the same install serves, said so at once.
    alone = warmup("exec", spec_file, "--dest", dest, "--", sys.executable, "-c", child, env=no_retries())
    assert alone.returncode == 0, alone.stderr
    assert "no service given: training over the cache an earlier pull installed" in alone.stderr, alone.stderr
    seen = json.loads(alone.stdout.strip().splitlines()[-1])
    assert seen["limits"] == [limit, accumulated] and seen["env"]["WARMUP_SERVER"] is None
    victim = next(p for p in dest.rglob("entry"))
    victim.write_bytes(b"changed")  # ... unless the cache is not intact any more
    broken = warmup(
        "exec", spec_file, "--server", "http://127.0.0.1:9", "--dest", dest, "--", "true", env=no_retries()
    )
    assert (
        broken.returncode == 1 and "cannot reach" in broken.stderr and "using the cache" not in broken.stderr
    )
    broken = warmup("exec", spec_file, "--dest", dest, "--", "true", env=no_retries())
    assert (
        broken.returncode == 1 and "is missing or changed in the cache, and no service given" in broken.stderr
    )


def test_a_file_altered_with_its_size_and_mtime_kept_is_never_called_verified(
    api_url, services, spec_file, pod_toolchain, tmp_path
):
    """exec's offline fallback hashes every file before it trains, and finds the install of a pull whose
    spec had data facts (as `--dataset` adds) that exec's own spec lacks; a pull replaces an altered file."""
    warm(services, spec_file, pod_toolchain, tmp_path / "scratch")
    dest = tmp_path / "cache"
    pulled = warmup("pull", spec_file, "--server", api_url, "--dest", dest)
    assert pulled.returncode == 0, pulled.stderr
    doc = json.loads(spec_file.read_text())
    del doc["data"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(doc))
    child = "import json, os; print(json.dumps(json.loads(os.environ['WARMUP_SPEC'])['data']))"
    offline = ("--server", "http://127.0.0.1:9", "--dest", dest, "--")

    away = warmup("exec", bare, *offline, sys.executable, "-c", child, env=no_retries())
    assert away.returncode == 0, away.stderr
    installed = read_local_manifest(dest, load_spec(spec_file).key())
    assert installed is not None
    assert f"({len(installed.files)} files, sha256 verified)" in away.stderr, away.stderr
    assert "other data facts" in away.stderr
    assert json.loads(away.stdout.strip().splitlines()[-1])["max_tokens"] == 60  # the pull's spec

    victim = next(p for p in dest.rglob("entry"))
    right = victim.read_bytes()
    stat = victim.stat()
    victim.write_bytes(bytes([right[0] ^ 1]) + right[1:])
    os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # as `touch -r` restores it
    assert (victim.stat().st_size, victim.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    refused = warmup("exec", spec_file, *offline, "true", env=no_retries())
    assert refused.returncode == 1 and "cannot reach" in refused.stderr
    assert "using the cache" not in refused.stderr and "verified" not in refused.stderr

    again = warmup("pull", spec_file, "--server", api_url, "--dest", dest)
    assert again.returncode == 0, again.stderr
    assert "installed 1 file(s)" in again.stderr and "up to date" not in again.stderr
    assert victim.read_bytes() == right


def test_refusals_name_the_cause_and_the_exit_codes_say_which(
    api_url, services, spec_file, pod_toolchain, tmp_path
):
    other = Toolchain.model_validate(pod_toolchain.model_dump() | {"torch": "2.14.1"})
    warm(services, spec_file, other, tmp_path / "scratch")
    mismatch = warmup("pull", spec_file, "--server", api_url, "--dest", tmp_path / "a")
    assert mismatch.returncode == 1
    assert f"torch: {pod_toolchain.torch!r} here vs '2.14.1' in the cache" in mismatch.stderr

    unreachable = warmup(
        "pull", spec_file, "--server", "http://127.0.0.1:9", "--dest", tmp_path / "b", env=no_retries()
    )
    assert unreachable.returncode == 1 and "cannot reach http://127.0.0.1:9" in unreachable.stderr

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(spec_doc(tmp_path) | {"trainer": "sfx"}))
    invalid = warmup("pull", bad, "--server", api_url, "--dest", tmp_path / "c")
    assert invalid.returncode == 2 and "did you mean 'sft'" in invalid.stderr

    nowhere = warmup("pull", spec_file, "--dest", tmp_path / "d", env={**os.environ, "WARMUP_SERVER": ""})
    assert nowhere.returncode == 1 and "--from s3://bucket/prefix" in nowhere.stderr
    assert not any((tmp_path / name).exists() for name in "abcd")


def test_wait_returns_once_warm_and_stops_at_once_when_the_warm_up_failed(
    api_url, services, spec_file, pod_toolchain, tmp_path, model_dir
):
    spec = load_spec(spec_file)
    services.queue.submit_job(
        _keyed(spec), _keyed(pod_toolchain), [_keyed(s) for s in plan_spec(spec).signatures]
    )
    waited: list[str] = []
    worker = threading.Timer(1.0, play_worker, (services, pod_toolchain.key(), tmp_path / "scratch"))
    worker.start()
    result = pull(
        spec, tmp_path / "cache", server=api_url, toolchain=pod_toolchain, wait=True, poll_interval=0.2,
        on_waiting=lambda error: waited.append(str(error)),
    )  # fmt: skip
    worker.join()
    assert waited and result.downloaded == 6

    failing = tmp_path / "failing.json"
    failing.write_text(json.dumps(spec_doc(model_dir, max_tokens=120, max_length=128)))  # a new 2x128
    doomed = load_spec(failing)
    services.queue.submit_job(
        _keyed(doomed), _keyed(pod_toolchain), [_keyed(s) for s in plan_spec(doomed).signatures]
    )
    task = services.queue.claim("test-worker", pod_toolchain.key(), lease_s=60)
    services.queue.fail(task.id, "test-worker", "RuntimeError: g++ crashed", retry=False)
    given_up = warmup(
        "pull", failing, "--server", api_url, "--dest", tmp_path / "never", "--wait", "--poll", "0.2"
    )
    assert given_up.returncode == 3
    assert (
        "failed" in given_up.stderr
        and "g++ crashed" in given_up.stderr
        and "--retry-failed" in given_up.stderr
    )
    assert f"/v1/tasks/{task.id}/log" in given_up.stderr


def test_entries_of_our_own_toolchain_that_land_during_a_manifest_build_are_not_a_mismatch(
    services, spec_file, pod_toolchain, tmp_path, monkeypatch
):
    """A worker can commit the first entry of a job between the manifest's build (all missing) and the
    mismatch check, and publish its manifest between a bucket read and the listing: both are "not warm
    yet" (which --wait polls on), never a toolchain mismatch that names no difference."""
    from warmup.api.routes.manifests import _raise_mismatch_or_not_warmed
    from warmup.client.pulling import bucket_manifest
    from warmup.errors import BlobNotFoundError, NotWarmedError

    spec = load_spec(spec_file)
    signatures = plan_spec(spec).signatures
    keys = [s.key() for s in signatures]
    services.queue.submit_job(_keyed(spec), _keyed(pod_toolchain), [_keyed(s) for s in signatures])
    assert play_worker(services, pod_toolchain.key(), tmp_path / "scratch", tasks=1) == 1
    with pytest.raises(NotWarmedError):
        _raise_mismatch_or_not_warmed(services, pod_toolchain, keys)

    play_worker(services, pod_toolchain.key(), tmp_path / "scratch")
    publish(services, spec, pod_toolchain)
    store = services.store
    ours = manifest_object_key(spec.key(), pod_toolchain.key())
    real_get = store.get_object
    missed: list[str] = []

    def get_object(key: str, **kw: object) -> bytes:
        if key == ours and not missed:  # the first read of our manifest misses: it is being published
            missed.append(key)
            raise BlobNotFoundError(key)
        return real_get(key, **kw)

    monkeypatch.setattr(store, "get_object", get_object)
    with pytest.raises(NotWarmedError):
        bucket_manifest(store, spec.key(), pod_toolchain)
    assert missed == [ours]
    assert bucket_manifest(store, spec.key(), pod_toolchain).toolchain_key == pod_toolchain.key()


def test_pull_from_the_bucket_without_the_api(services, spec_file, pod_toolchain, s3_bucket, tmp_path):
    spec = load_spec(spec_file)
    bucket = f"s3://{s3_bucket}/{PREFIX}"
    absent = warmup("pull", spec_file, "--from", bucket, "--dest", tmp_path / "a")
    assert absent.returncode == 3 and "--wait" in absent.stderr

    other = Toolchain.model_validate(pod_toolchain.model_dump() | {"torch": "2.14.1"})
    warm(services, spec_file, other, tmp_path / "scratch")
    publish(services, spec, other)
    with pytest.raises(ToolchainMismatchError, match=r"torch: '.*' here vs '2.14.1' in the cache"):
        pull(spec, tmp_path / "b", source=bucket, toolchain=pod_toolchain)

    warm(services, spec_file, pod_toolchain, tmp_path / "scratch")
    publish(services, spec, pod_toolchain)
    cli = warmup(
        "pull", spec_file, "--from", bucket, "--dest", tmp_path / "cli"
    )  # no --server: no API at all
    assert cli.returncode == 0, cli.stderr
    assert "installed 6 file(s)" in cli.stderr
    result = pull(spec, tmp_path / "lib", source=bucket, toolchain=pod_toolchain, parallel=4)
    assert result.downloaded == 6 and result.source == bucket
    assert (
        cache_files(tmp_path / "lib")
        == {f.path for f in result.manifest.files}
        <= cache_files(tmp_path / "cli")
    )
    assert pull(spec, tmp_path / "lib", source=bucket, toolchain=pod_toolchain).downloaded == 0


def test_presigned_urls_name_the_endpoint_pods_reach(
    pg_url, s3_bucket, s3_env, spec_file, pod_toolchain, tmp_path
):
    """The service reaches S3 at one address, pods at another (here: localhost for 127.0.0.1)."""
    own = s3_env.endpoint_url
    for_pods = own.replace("127.0.0.1", "localhost")
    assert for_pods != own
    settings = Settings(
        data_dir=tmp_path / "service",
        database_url=pg_url,
        store_url=f"s3://{s3_bucket}/{PREFIX}",
        presign_endpoint_url=for_pods,
        auth="off",
    )
    services = Services.start(settings)
    try:
        warm(services, spec_file, pod_toolchain, tmp_path / "scratch")
        with serve(services) as url:
            manifest = ServiceClient(url, token=None).manifest(
                load_spec(spec_file).model_dump(mode="json"), pod_toolchain.model_dump(mode="json")
            )
            assert manifest.files and all(
                (f.url or "").startswith(f"{for_pods}/{s3_bucket}/") for f in manifest.files
            )
            result = pull(spec_file, tmp_path / "cache", server=url, toolchain=pod_toolchain)
        assert result.downloaded == len(manifest.files) and services.store.endpoint == own
    finally:
        services.close()


def test_a_blob_corrupted_in_the_store_is_refused_and_nothing_is_installed(
    api_url, services, spec_file, pod_toolchain, s3_env, s3_bucket, tmp_path
):
    spec = load_spec(spec_file)
    warm(services, spec_file, pod_toolchain, tmp_path / "scratch")
    publish(services, spec, pod_toolchain)
    manifest = ServiceClient(api_url).manifest(
        spec.model_dump(mode="json"), pod_toolchain.model_dump(mode="json")
    )
    victim = manifest.files[-1]
    key = f"{PREFIX}/blobs/{victim.sha256[:2]}/{victim.sha256}"
    s3_env.client().put_object(Bucket=s3_bucket, Key=key, Body=b"x" * victim.size)  # same size, other bytes

    through_api = warmup("pull", spec_file, "--server", api_url, "--dest", tmp_path / "api")
    assert through_api.returncode == 1 and "sha256 mismatch" in through_api.stderr
    assert "nothing was installed" in through_api.stderr
    with pytest.raises(BlobIntegrityError, match="sha256 mismatch"):
        pull(spec, tmp_path / "bucket", source=f"s3://{s3_bucket}/{PREFIX}", toolchain=pod_toolchain)
    for dest in (tmp_path / "api", tmp_path / "bucket"):
        assert cache_files(dest) == set()  # not even the good files
        assert not (dest / INDEX_NAME).exists() and not list(dest.rglob("*.tmp*"))


@pytest.mark.parametrize("path", ["../escaped.bin", "/tmp/warmup-escaped.bin", "a/../../escaped.bin"])
def test_a_hostile_manifest_writes_nothing(
    path, services, spec_file, pod_toolchain, s3_env, s3_bucket, tmp_path
):
    spec = load_spec(spec_file)
    blob = b"#!/bin/sh\necho owned\n"
    hostile = hostile_manifest(spec, pod_toolchain, path, blob)
    with hostile_service(HostileService(hostile)) as server:  # a compromised service
        with pytest.raises(UnsafeArtifactError, match="refusing manifest"):
            pull(spec, tmp_path / "api" / "cache", server=server.url, toolchain=pod_toolchain)
        assert server.blob_requests == 0
    key = f"{PREFIX}/{manifest_object_key(spec.key(), pod_toolchain.key())}"
    s3_env.client().put_object(
        Bucket=s3_bucket, Key=key, Body=json.dumps(hostile).encode()
    )  # a tampered bucket
    with pytest.raises(UnsafeArtifactError, match="refusing manifest"):
        pull(
            spec, tmp_path / "bucket" / "cache", source=f"s3://{s3_bucket}/{PREFIX}", toolchain=pod_toolchain
        )
    assert not (tmp_path / "api").exists() and not (tmp_path / "bucket").exists()
    assert not Path("/tmp/warmup-escaped.bin").exists() and not (tmp_path / "escaped.bin").exists()
    # ... and install itself refuses it even when handed a manifest that skipped validation
    from warmup.manifest import Manifest, ManifestFile

    unchecked = Manifest.model_construct(
        **hostile | {"files": [ManifestFile.model_construct(**hostile["files"][0])]}
    )
    with pytest.raises(UnsafeArtifactError):
        install(unchecked, tmp_path / "direct", source=None)  # type: ignore[arg-type]
    assert not (tmp_path / "direct").exists()


def test_the_cli_refuses_a_hostile_manifest_from_the_service_and_from_the_bucket(
    services, spec_file, pod_toolchain, s3_env, s3_bucket, tmp_path
):
    spec = load_spec(spec_file)
    blob = b"payload"
    hostile = hostile_manifest(spec, pod_toolchain, "../../escaped.bin", blob)
    with hostile_service(HostileService(hostile)) as server:
        answered = warmup("pull", spec_file, "--server", server.url, "--dest", tmp_path / "a" / "cache")
    key = f"{PREFIX}/{manifest_object_key(spec.key(), pod_toolchain.key())}"
    s3_env.client().put_object(Bucket=s3_bucket, Key=key, Body=json.dumps(hostile).encode())
    read = warmup(
        "pull", spec_file, "--from", f"s3://{s3_bucket}/{PREFIX}", "--dest", tmp_path / "b" / "cache"
    )
    for done in (answered, read):
        assert done.returncode == 1 and "refusing manifest" in done.stderr and ".." in done.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # nothing written


def test_a_bucket_manifest_for_another_spec_is_refused(
    services, spec_file, pod_toolchain, s3_env, s3_bucket, tmp_path
):
    spec = load_spec(spec_file)
    body = hostile_manifest(spec, pod_toolchain, "fine/path.bin", b"data") | {"spec_key": "f" * 64}
    key = f"{PREFIX}/{manifest_object_key(spec.key(), pod_toolchain.key())}"
    s3_env.client().put_object(Bucket=s3_bucket, Key=key, Body=json.dumps(body).encode())
    with pytest.raises(UnsafeArtifactError, match="names another spec"):
        pull(spec, tmp_path / "cache", source=f"s3://{s3_bucket}/{PREFIX}", toolchain=pod_toolchain)
    assert not (tmp_path / "cache").exists()


def test_coverage_shows_a_jobs_reports(api_url, services, spec_file, pod_toolchain, tmp_path):
    spec = load_spec(spec_file)
    warm(services, spec_file, pod_toolchain, tmp_path / "scratch")
    planned = plan_spec(spec).signatures[0]
    missed = planned.model_copy(update={"seq_len": 96})
    with ServiceClient(api_url) as client:
        answer = client.post_coverage(
            {
                "spec": spec.model_dump(mode="json"),
                "toolchain": pod_toolchain.model_dump(mode="json"),
                "met": [planned.key(), missed.key()],
                "missed": [missed.model_dump(mode="json")],
                "fresh_compiles": 3,
                "details": {"status": "failed"},
            }
        )
    shown = warmup("coverage", answer["job_id"], "--server", api_url)
    assert shown.returncode == 0, shown.stderr
    rows = [line.split() for line in shown.stdout.splitlines() if len(line.split()) == 8]
    assert rows[1][0] == str(answer["report_id"])  # under the header
    assert rows[1][-5:] == ["failed", "2", "1", "1", "3"]
    assert f"report {answer['report_id']} missed: train 2x96" in shown.stdout
    as_json = json.loads(warmup("coverage", answer["job_id"], "--server", api_url, "--format", "json").stdout)
    assert as_json[0]["missed"] == [missed.key()]
    unknown = warmup("coverage", "00000000-0000-0000-0000-000000000000", "--server", api_url)
    assert unknown.returncode == 1 and "no warm-up job" in unknown.stderr


# The training command's part, under `warmup exec`: it says it is ready to compile once torch is
# imported (the blob server holds the files back until then), then compiles; a compile-start callback
# of its own, registered after the one warmup/pod/_sitecustomize installs, sees whether the file is there.
COMPILING_CHILD = """
import json, pathlib, sys, torch, torch._dynamo.callback as cb
dest, ready = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
seen = []
cb.callback_handler.register_start_callback(lambda args: seen.append((dest / "fine/entry.bin").exists()))
ready.touch()
torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
print(json.dumps({"installed_at_first_compile": seen[0]}))
"""


@pytest.mark.parametrize("blob_is_true", [True, False])
def test_exec_downloads_beside_the_command_and_its_first_compile_waits_for_the_files(
    blob_is_true, spec_file, pod_toolchain, tmp_path
):
    spec = load_spec(spec_file)
    blob = b"compiled code"
    manifest = hostile_manifest(spec, pod_toolchain, "fine/entry.bin", blob)
    ready, dest = tmp_path / "ready-to-compile", tmp_path / "cache"
    sha = manifest["files"][0]["sha256"]
    state = HostileService(manifest, blobs={sha: blob}, hold_until=ready)
    if not blob_is_true:
        state.lies[sha] = b"other code!!!"
    with hostile_service(state) as server:
        ran = warmup(
            "exec", spec_file, "--server", server.url, "--dest", dest, "--",
            sys.executable, "-c", COMPILING_CHILD, dest, ready,
        )  # fmt: skip
    if blob_is_true:
        assert ran.returncode == 0, ran.stderr
        assert json.loads(ran.stdout.strip().splitlines()[-1]) == {"installed_at_first_compile": True}
        assert "(beside the training command's start)" in ran.stderr
        assert (dest / "fine" / "entry.bin").read_bytes() == blob
    else:  # the training process stops at its first compile, with the download's cause
        assert ran.returncode != 0 and "installed_at_first_compile" not in ran.stdout
        assert "BackgroundPullError" in ran.stderr and "sha256" in ran.stderr, ran.stderr
        assert cache_files(dest) == set()


def test_the_images_isa_probes_reach_the_pod_and_its_first_compile_builds_none(
    api_url, services, spec_file, pod_toolchain, tmp_path
):
    """`warmup toolchain --remember` keeps Inductor's CPU ISA probe programs beside the image's memo; a
    pull whose toolchain is that exact one copies them into DEST, so picking the ISA there builds nothing."""
    warm(services, spec_file, pod_toolchain, tmp_path / "scratch")
    memo = tmp_path / "image" / "toolchain.json"
    env = {**os.environ, "WARMUP_TOOLCHAIN_MEMO": str(memo)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    remembered = warmup("toolchain", "--remember", env=env)
    assert remembered.returncode == 0, remembered.stderr
    probes = {p.relative_to(memo.parent / "toolchain.json.isa-probes") for p in memo.parent.rglob("*.so")}
    assert probes, "no probe program was kept beside the memo"

    dest = tmp_path / "cache"
    pulled = warmup("pull", spec_file, "--server", api_url, "--dest", dest, env=env)
    assert pulled.returncode == 0, pulled.stderr
    assert "computed its toolchain" not in pulled.stderr  # found in the image's memo
    assert probes <= {p.relative_to(dest) for p in dest.rglob("*.so")}
    before = {p.relative_to(dest) for p in dest.rglob("*") if p.is_file()}
    pick = "from torch._inductor.cpu_vec_isa import pick_vec_isa; print(pick_vec_isa())"
    picked = subprocess.run(
        [sys.executable, "-c", pick],
        capture_output=True,
        text=True,
        env={**env, "TORCHINDUCTOR_CACHE_DIR": str(dest)},
    )
    assert picked.returncode == 0 and picked.stdout.strip() == pod_toolchain.cpu_isa, picked.stderr
    built = {p.relative_to(dest) for p in dest.rglob("*") if p.is_file()} - before
    assert not [p for p in built if p.suffix in (".so", ".cpp")], built  # lock files only
