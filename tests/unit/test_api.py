"""The HTTP API on SQLite and a local blob directory, in this process (an API served from a thread where a
test needs a URL). tests/integration/test_api_servers.py runs the tests that take `services` on PostgreSQL
and a real S3 server (SeaweedFS) too.

Workers are played by the queue itself (claim, upload, complete), so these tests need no compiles.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from tests.fixtures.factories import cpu_toolchain
from tests.support.live_server import serve
from tests.support.tiny_model import write_tiny_model
from warmup.api.app import create_app
from warmup.api.services import Services
from warmup.client.installing import install
from warmup.client.service import ServiceClient
from warmup.client.sources import HttpBlobSource
from warmup.db.records import FileRef
from warmup.db.tokens import TokenStore
from warmup.errors import NotWarmedError, PartlyWarmedError, SpecError, ToolchainMismatchError
from warmup.settings import Settings


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model"))


def spec_body(model_dir: Path, max_tokens: int = 60, **args) -> dict:
    return {
        "trainer": "sft",
        "model": str(model_dir),
        "args": {
            "per_device_train_batch_size": 2,
            "max_length": 64,
            "pad_to_multiple_of": 32,
            "torch_compile": True,
            "bf16": False,
            **args,
        },
        "data": {"num_train_examples": 8, "min_tokens": 40, "max_tokens": max_tokens},
        "target": {"backend": "inductor", "device": "cpu"},
    }


@pytest.fixture(params=["local"])
def store_url(tmp_path) -> str:
    return str(tmp_path / "blobs")


@pytest.fixture
def services(db_url, store_url, tmp_path):
    settings = Settings(data_dir=tmp_path, database_url=db_url, store_url=store_url, auth="off")
    started = Services.start(settings)
    yield started
    started.close()


@pytest.fixture
def api(services):
    with TestClient(create_app(services=services)) as client:
        yield client


def play_worker(services: Services, toolchain_key: str, tmp_path: Path, *, tasks: int | None = None) -> int:
    """Claim tasks, upload two files each, complete them: what a worker does after compiling."""
    done = 0
    while tasks is None or done < tasks:
        task = services.queue.claim("test-worker", toolchain_key, lease_s=60)
        if task is None:
            break
        refs = []
        for name in ("fxgraph/entry", f"kernels/{task.signature_key[:8]}.so"):
            path = tmp_path / f"{task.id}-{name.replace('/', '_')}"
            path.write_bytes(f"{name} of {task.signature_key}".encode())
            sha = hashlib.sha256(path.read_bytes()).hexdigest()
            refs.append(
                (path, FileRef(path=f"{task.signature_key[:8]}/{name}", sha256=sha, size=path.stat().st_size))
            )
        services.queue.reserve_blobs([ref for _, ref in refs])
        for path, ref in refs:
            services.store.put_file(path, ref.sha256)
        services.queue.complete(task.id, "test-worker", [ref for _, ref in refs], compile_seconds=1.5)
        done += 1
    return done


def test_plan_lists_signatures_and_estimates(api, model_dir):
    answer = api.post("/v1/plans", json={"spec": spec_body(model_dir)})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert {(s["phase"], s["batch"], s["seq_len"]) for s in body["signatures"]} == {("train", 2, 64)}
    assert all(len(s["key"]) == 64 for s in body["signatures"])
    assert body["estimate_seconds"]["inductor"] > 0


def test_api_docs_load_their_assets_from_the_service(api):
    """/docs and /redoc name no other host: a service without a network shows them."""
    import re

    for page in ("/docs", "/redoc"):
        answer = api.get(page)
        assert answer.status_code == 200 and "text/html" in answer.headers["content-type"]
        assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", answer.text)
        assert assets and not [url for url in assets if "://" in url], assets
        for url in assets:
            served = api.get(url)
            assert served.status_code == 200 and len(served.content) > 1000, url
    assert "openapi.json" in api.get("/docs").text


def test_invalid_spec_is_422_with_field_and_reason(api, model_dir):
    bad = spec_body(model_dir, max_lenght=5)
    answer = api.post("/v1/plans", json={"spec": bad})
    assert answer.status_code == 422
    detail = answer.json()["detail"]
    assert detail["error"] == "invalid_spec"
    assert detail["problems"] == [
        {
            "loc": "args.max_lenght",
            "msg": "unknown field (`trl sft` refuses it: accelerate launch: unrecognized arguments: --max_lenght); "
            "not a field of any dataclass `trl sft` reads; did you mean `max_length`?",
        }
    ]
    unknown = api.post("/v1/plans", json={"spec": spec_body(model_dir) | {"trainer": "stf"}})
    assert unknown.status_code == 422
    assert unknown.json()["detail"]["problems"][0]["loc"] == "spec.trainer"
    assert "did you mean 'sft'" in unknown.json()["detail"]["problems"][0]["msg"]
    missing_model = api.post("/v1/plans", json={"spec": spec_body(Path("/nonexistent/model"))})
    assert missing_model.status_code == 422
    assert "does not exist" in missing_model.json()["detail"]["message"]


def test_a_relative_model_path_is_never_read_from_the_services_directory(
    api, model_dir, tmp_path, monkeypatch
):
    """`warmup` sends a path that exists where it runs as an absolute one; a relative one that the service's own
    directory holds (another machine's folder of the same name) is refused, naming where the service looked."""
    import shutil

    shutil.copytree(model_dir, tmp_path / "tiny-model")
    monkeypatch.chdir(tmp_path)
    relative = spec_body(model_dir) | {"model": "tiny-model"}
    for path, body in (
        ("/v1/plans", {"spec": relative}),
        ("/v1/warmups", {"spec": relative, "toolchain": cpu_toolchain().model_dump(mode="json")}),
        ("/v1/advice", {"spec": relative}),
    ):
        answer = api.post(path, json=body)
        assert answer.status_code == 422, (path, answer.text)
        (problem,) = answer.json()["detail"]["problems"]
        assert problem["loc"] == "spec.model", problem
        assert f"{tmp_path / 'tiny-model'} exists" in problem["msg"] and "absolute path" in problem["msg"]
    absolute = api.post("/v1/plans", json={"spec": spec_body(tmp_path / "tiny-model")})
    assert absolute.status_code == 200, absolute.text


def test_oversized_body_is_413(api, model_dir):
    body = {"spec": spec_body(model_dir) | {"args": {"x" * 2_000_000: 1}}}
    answer = api.post("/v1/plans", json=body)
    assert answer.status_code == 413
    assert answer.json()["detail"]["error"] == "body_too_large"


def test_submit_is_idempotent_and_manifest_follows_the_work(api, services, model_dir, tmp_path):
    spec = spec_body(model_dir)
    tc = cpu_toolchain()
    submit = {"spec": spec, "toolchain": tc.model_dump()}
    first = api.post("/v1/warmups", json=submit)
    assert first.status_code == 201, first.text
    job = first.json()
    assert job["state"] == "queued" and job["counts"] == {"queued": 1}
    second = api.post("/v1/warmups", json=submit)
    assert second.status_code == 200 and second.json()["id"] == job["id"]

    manifest_request = {"spec": spec, "toolchain": tc.model_dump()}
    not_yet = api.post("/v1/manifests", json=manifest_request)
    assert not_yet.status_code == 404 and not_yet.json()["detail"]["error"] == "not_warmed"

    assert play_worker(services, tc.key(), tmp_path) == 1
    status = api.get(f"/v1/warmups/{job['id']}").json()
    assert status["state"] == "ready"
    assert status["signatures"][0]["compile_seconds"] == 1.5
    assert status["signatures"][0]["signature"]["phase"] == "train"

    answer = api.post("/v1/manifests", json=manifest_request)
    assert answer.status_code == 200, answer.text
    manifest = answer.json()
    assert len(manifest["files"]) == 2 and manifest["missing"] == []
    if services.store.presigned_url(manifest["files"][0]["sha256"], 60) is None:
        assert all(f["url"] is None for f in manifest["files"])  # local store: pods use /v1/blobs
    blob = manifest["files"][0]
    served = api.get(f"/v1/blobs/{blob['sha256']}")
    assert served.status_code == 200 and hashlib.sha256(served.content).hexdigest() == blob["sha256"]
    assert [j["id"] for j in api.get("/v1/warmups").json()] == [job["id"]]


def test_jobs_that_were_refused_are_submitted_and_a_bad_peft_block_is_422(api, model_dir):
    """LoRA, KTO and vLLM jobs were refused with "not written yet": each is a job now. A peft key TRL's
    ModelConfig does not have is a 422 naming it."""
    tc = cpu_toolchain()
    lora_kto = {
        **spec_body(model_dir),
        "trainer": "kto",
        "peft": {"lora_r": 8, "lora_target_modules": ["q_proj"]},
    }
    vllm = {
        **spec_body(model_dir),
        "trainer": "grpo",
        "args": {
            "per_device_train_batch_size": 2,
            "num_generations": 2,
            "max_completion_length": 8,
            "use_vllm": True,
            "torch_compile": True,
            "bf16": False,
        },
        "data": {"max_prompt_tokens": 14},
    }
    for spec in (lora_kto, vllm):
        answer = api.post("/v1/warmups", json={"spec": spec, "toolchain": tc.model_dump()})
        assert answer.status_code == 201, answer.json()
        assert answer.json()["counts"]["queued"] >= 1
    bad = api.post("/v1/plans", json={"spec": {**spec_body(model_dir), "peft": {"lora_rank": 8}}})
    assert bad.status_code == 422
    assert bad.json()["detail"]["problems"][0]["loc"] == "peft.lora_rank"


def test_manifest_is_refused_until_its_signatures_are_warmed_and_a_partial_one_only_when_asked(
    api, services, model_dir, tmp_path
):
    spec, tc = spec_body(model_dir, max_tokens=100, max_length=128), cpu_toolchain()
    job = api.post("/v1/warmups", json={"spec": spec, "toolchain": tc.model_dump()}).json()
    assert job["counts"]["queued"] >= 2
    task = services.queue.claim("w", tc.key(), lease_s=60)
    path = tmp_path / "only-one"
    path.write_bytes(b"first half")
    ref = FileRef(path="a/first", sha256=hashlib.sha256(b"first half").hexdigest(), size=10)
    services.queue.reserve_blobs([ref])
    services.store.put_file(path, ref.sha256)  # uploaded, but the task is not complete
    refused = api.post("/v1/manifests", json={"spec": spec, "toolchain": tc.model_dump()})
    assert refused.status_code == 404
    services.queue.complete(task.id, "w", [ref], compile_seconds=1.0)
    partial = api.post("/v1/manifests", json={"spec": spec, "toolchain": tc.model_dump()})
    assert partial.status_code == 409 and partial.json()["detail"]["error"] == "partly_warmed"
    assert partial.json()["detail"]["missing"]  # labels like "train 2x64"
    allowed = api.post(
        "/v1/manifests", json={"spec": spec, "toolchain": tc.model_dump(), "allow_partial": True}
    )
    assert allowed.status_code == 200 and len(allowed.json()["missing"]) == job["counts"]["queued"] - 1


def test_toolchain_mismatch_names_the_fields(api, services, model_dir, tmp_path):
    spec, built = spec_body(model_dir), cpu_toolchain()
    api.post("/v1/warmups", json={"spec": spec, "toolchain": built.model_dump()})
    play_worker(services, built.key(), tmp_path)
    pod = cpu_toolchain(torch="2.14.1", cpu_isa="avx2")
    answer = api.post("/v1/manifests", json={"spec": spec, "toolchain": pod.model_dump()})
    assert answer.status_code == 409
    detail = answer.json()["detail"]
    assert detail["error"] == "toolchain_mismatch"
    assert detail["differences"] == {"torch": ["2.14.1", "2.13.0+cpu"], "cpu_isa": ["avx2", "avx512"]}


def test_entries_are_reused_across_specs(api, services, model_dir, tmp_path):
    tc = cpu_toolchain()
    api.post("/v1/warmups", json={"spec": spec_body(model_dir), "toolchain": tc.model_dump()})
    play_worker(services, tc.key(), tmp_path)
    # Same graphs, a different dataset size: nothing new to compile.
    other = spec_body(model_dir) | {"data": {"num_train_examples": 20, "min_tokens": 40, "max_tokens": 60}}
    job = api.post("/v1/warmups", json={"spec": other, "toolchain": tc.model_dump()}).json()
    assert job["state"] == "ready" and job["counts"] == {"ready": 1}


def test_concurrent_identical_submissions_make_one_job(api, model_dir):
    submit = {"spec": spec_body(model_dir), "toolchain": cpu_toolchain().model_dump()}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: api.post("/v1/warmups", json=submit), range(8)))
    assert sorted(a.status_code for a in answers) == [200] * 7 + [201]
    assert len({a.json()["id"] for a in answers}) == 1


def test_coverage_misses_become_tasks(api, services, model_dir, tmp_path):
    spec, tc = spec_body(model_dir), cpu_toolchain()
    api.post("/v1/warmups", json={"spec": spec, "toolchain": tc.model_dump()})
    play_worker(services, tc.key(), tmp_path)
    planned = api.post("/v1/plans", json={"spec": spec}).json()["signatures"][0]
    missed = {k: v for k, v in planned.items() if k != "key"} | {"seq_len": 96}
    answer = api.post(
        "/v1/coverage",
        json={
            "spec": spec,
            "toolchain": tc.model_dump(),
            "met": [planned["key"]],
            "missed": [missed],
            "fresh_compiles": 2,
        },
    )
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["enqueued"]) == 1 and answer.json()["unwarmable"] == {}
    # the reported miss warms beside the job: it never holds up a pod whose planned signatures are warm
    manifest = api.post("/v1/manifests", json={"spec": spec, "toolchain": tc.model_dump()})
    assert manifest.status_code == 200 and manifest.json()["missing"] == []
    assert manifest.json()["signatures"] == [planned["key"]] and len(manifest.json()["files"]) == 2
    play_worker(services, tc.key(), tmp_path)
    assert (
        len(api.post("/v1/manifests", json={"spec": spec, "toolchain": tc.model_dump()}).json()["files"]) == 4
    )
    reports = api.get(f"/v1/warmups/{answer.json()['job_id']}/coverage").json()
    assert reports[0]["fresh_compiles"] == 2
    foreign = missed | {"model": "0" * 16}
    refused = api.post("/v1/coverage", json={"spec": spec, "toolchain": tc.model_dump(), "missed": [foreign]})
    assert refused.status_code == 422


def test_a_run_of_another_batch_size_never_breaks_the_job(api, services, model_dir, tmp_path):
    """Issue 35: a run trained batch 4 under a spec of batch 2 and reported `train 4x64`. The spec's trainer
    cannot produce it: it is recorded with its reason, gets no task, the job stays ready, and a pod of the
    unchanged spec installs its complete cache without --allow-partial."""
    spec, tc = spec_body(model_dir), cpu_toolchain()
    job_id = api.post("/v1/warmups", json={"spec": spec, "toolchain": tc.model_dump()}).json()["id"]
    play_worker(services, tc.key(), tmp_path)
    planned = api.post("/v1/plans", json={"spec": spec}).json()["signatures"][0]
    assert (planned["phase"], planned["batch"]) == ("train", 2)
    bigger = {k: v for k, v in planned.items() if k != "key"} | {"batch": 4}
    report = {
        "spec": spec,
        "toolchain": tc.model_dump(),
        "met": [],
        "missed": [bigger],
        "fresh_compiles": 1,
        "details": {"args": {"per_device_train_batch_size": {"spec": 2, "run": 4}}},
    }
    answer = api.post("/v1/coverage", json=report)
    assert answer.status_code == 200, answer.text
    assert answer.json()["enqueued"] == []
    (why,) = answer.json()["unwarmable"].values()
    assert "at most 2 rows, this one has 4" in why
    assert "per_device_train_batch_size 4 (the spec: 2)" in why
    assert services.queue.claim("test-worker", tc.key(), lease_s=60) is None  # nothing to retry

    job = api.get(f"/v1/warmups/{job_id}").json()
    assert job["state"] == "ready" and job["reported"] == {"unwarmable": 1}
    (shown,) = [s for s in job["signatures"] if s["source"] == "coverage"]
    assert (shown["state"], shown["error"], shown["signature"]["batch"]) == ("unwarmable", why, 4)
    manifest = api.post("/v1/manifests", json={"spec": spec, "toolchain": tc.model_dump()})
    assert manifest.status_code == 200 and manifest.json()["missing"] == []
    assert api.post("/v1/coverage", json=report).json()["unwarmable"] == answer.json()["unwarmable"]
    assert api.get(f"/v1/warmups/{job_id}").json()["reported"] == {"unwarmable": 1}  # once


def test_unknown_pool_and_wrong_backend_are_422(api, model_dir):
    answer = api.post("/v1/warmups", json={"spec": spec_body(model_dir), "pool": "trn2-pool"})
    assert answer.status_code == 422 and "trn2-pool" in answer.json()["detail"]["message"]
    neuron = cpu_toolchain(
        backend="neuron", device="neuron", device_kind="trn2", cpu_isa=None, num_threads=None
    )
    answer = api.post("/v1/warmups", json={"spec": spec_body(model_dir), "toolchain": neuron.model_dump()})
    assert answer.status_code == 422
    both = api.post("/v1/warmups", json={"spec": spec_body(model_dir)})
    assert both.status_code == 422
    assert api.get(f"/v1/warmups/{uuid.uuid4()}").status_code == 404


def test_a_job_is_found_by_a_prefix_of_its_id_that_only_it_has(api, model_dir, monkeypatch):
    """The status page and the command line show a job's first 8 hex digits: each API route that takes a job
    id takes them too, and a prefix two jobs share is refused, naming both."""
    ids = iter(
        [uuid.UUID("abcd1234-0000-4000-8000-000000000001"), uuid.UUID("abcd5678-0000-4000-8000-000000000002")]
    )
    monkeypatch.setattr("warmup.db.queue.uuid", SimpleNamespace(uuid4=lambda: next(ids), UUID=uuid.UUID))
    tc = cpu_toolchain().model_dump()
    first = api.post("/v1/warmups", json={"spec": spec_body(model_dir), "toolchain": tc}).json()
    second = api.post(
        "/v1/warmups", json={"spec": spec_body(model_dir, max_tokens=50), "toolchain": tc}
    ).json()
    assert (first["id"], second["id"]) == (
        "abcd1234-0000-4000-8000-000000000001",
        "abcd5678-0000-4000-8000-000000000002",
    )

    assert api.get("/v1/warmups/abcd1234").json()["id"] == first["id"]  # the 8 digits shown
    assert api.get("/v1/warmups/ABCD5678-0000").json()["id"] == second["id"]  # any case, dashes or not
    assert api.get(f"/v1/warmups/{first['id']}").json()["id"] == first["id"]
    assert api.get("/v1/warmups/abcd5678/coverage").json() == []

    ambiguous = api.get("/v1/warmups/abcd")
    assert ambiguous.status_code == 400
    message = ambiguous.json()["detail"]["message"]
    assert "ambiguous" in message and first["id"] in message and second["id"] in message
    assert api.get("/v1/warmups/abcd/coverage").status_code == 400
    unknown = api.get("/v1/warmups/ffff0000")
    assert (
        unknown.status_code == 404
        and "no warm-up job with id ffff0000" in unknown.json()["detail"]["message"]
    )
    assert api.get("/v1/warmups/abc").status_code == 422  # under 4 digits: not taken for an id


def test_health(api, services):
    assert api.get("/healthz").json() == {"status": "ok"}
    assert api.get("/readyz").json() == {"status": "ready"}
    services.starting = "computing the worker's toolchain"  # as `warmup serve` sets it once it listens
    starting = api.get("/readyz")
    assert starting.status_code == 503 and starting.headers["retry-after"]
    assert starting.json() == {
        "status": "starting",
        "problems": ["starting: computing the worker's toolchain"],
    }
    assert api.get("/healthz").json() == {"status": "ok"}
    services.starting = None
    assert api.get("/readyz").json() == {"status": "ready"}


def test_client_library_against_a_live_server(services, model_dir, tmp_path):
    """warmup.client maps every API answer back to the same exception."""
    spec, tc = spec_body(model_dir), cpu_toolchain()
    with serve(services) as url, ServiceClient(url) as client:
        _client_round_trip(client, services, spec, tc, model_dir, tmp_path)


def _client_round_trip(client, services, spec, tc, model_dir, tmp_path):
    with pytest.raises(SpecError):
        client.plan(spec | {"trainer": "nope"})
    with pytest.raises(NotWarmedError):
        client.manifest(spec, tc.model_dump())
    client.submit(spec, toolchain=tc.model_dump())
    play_worker(services, tc.key(), tmp_path, tasks=0)
    with pytest.raises(NotWarmedError):
        client.manifest(spec, tc.model_dump())
    play_worker(services, tc.key(), tmp_path)
    manifest = client.manifest(spec, tc.model_dump())
    result = install(manifest, tmp_path / "pod-cache", HttpBlobSource(client.server))
    assert result.downloaded == 2
    with pytest.raises(ToolchainMismatchError, match="torch"):
        client.manifest(spec, cpu_toolchain(torch="2.14.1").model_dump())
    bigger = spec_body(model_dir, max_tokens=100, max_length=128)
    client.submit(bigger, toolchain=tc.model_dump())
    play_worker(services, tc.key(), tmp_path, tasks=1)
    with pytest.raises(PartlyWarmedError):
        client.manifest(bigger, tc.model_dump())


# --- auth -----------------------------------------------------------------------------------------


def test_auth_scopes(sqlite_url, tmp_path, model_dir):
    settings = Settings(
        data_dir=tmp_path, database_url=sqlite_url, store_url=str(tmp_path / "b"), auth="required"
    )
    services = Services.start(settings)
    tokens = TokenStore(services.engine)
    _, reader = tokens.create("pod", ["read"])
    _, submitter = tokens.create("ci", ["submit"])
    revoked_info, revoked = tokens.create("old", ["admin"])
    tokens.revoke(revoked_info.id)
    with TestClient(create_app(services=services)) as api:
        plan = {"spec": spec_body(model_dir)}
        assert api.post("/v1/plans", json=plan).status_code == 401
        assert api.post("/v1/plans", json=plan, headers={"Authorization": "Bearer nope"}).status_code == 401
        assert (
            api.post("/v1/plans", json=plan, headers={"Authorization": f"Bearer {revoked}"}).status_code
            == 401
        )
        assert (
            api.post("/v1/plans", json=plan, headers={"Authorization": f"Bearer {reader}"}).status_code == 200
        )
        submit = {"spec": spec_body(model_dir), "toolchain": cpu_toolchain().model_dump()}
        forbidden = api.post("/v1/warmups", json=submit, headers={"Authorization": f"Bearer {reader}"})
        assert forbidden.status_code == 403 and "submit" in forbidden.json()["detail"]["message"]
        ok = api.post("/v1/warmups", json=submit, headers={"Authorization": f"Bearer {submitter}"})
        assert ok.status_code == 201
        # The submit token follows the job it submitted (`warmup submit --wait` polls it) ...
        job_id = ok.json()["id"]
        as_submitter = {"Authorization": f"Bearer {submitter}"}
        polled = api.get(f"/v1/warmups/{job_id}", headers=as_submitter)
        assert polled.status_code == 200 and polled.json()["id"] == job_id
        # ... but listing jobs, coverage reports and manifests stay a read token's.
        for path in ("/v1/warmups", f"/v1/warmups/{job_id}/coverage"):
            refused = api.get(path, headers=as_submitter)
            assert refused.status_code == 403 and "'read'" in refused.json()["detail"]["message"]
        assert api.get("/healthz").status_code == 200  # probes need no token
    services.close()


def test_settings_refuse_auth_off_on_a_public_address():
    with pytest.raises(ValueError, match="auth 'off'"):
        Settings(host="0.0.0.0", auth="off")
    assert Settings(host="0.0.0.0").auth_required
    assert not Settings(host="127.0.0.1").auth_required


def test_settings_refuse_a_presign_endpoint_without_an_s3_store():
    with pytest.raises(ValueError, match="presign_endpoint_url is for an S3 store"):
        Settings(presign_endpoint_url="https://s3.example.com")
    with pytest.raises(ValueError, match="not an http"):
        Settings(store_url="s3://bucket/cache", presign_endpoint_url="s3.example.com")
    assert Settings(store_url="s3://bucket/cache", presign_endpoint_url="https://s3.example.com")


# --- a store that checks itself ---------------------------------------------------------------------


def overwrite_blob(store, sha256: str, data: bytes) -> None:
    """Replace a stored copy's bytes behind the store's back, as a failing disk or a stray write would."""
    from tests.unit.test_store import overwrite

    overwrite(store, sha256, data)


def test_store_check_finds_damage_and_submitting_again_rewarms_it(api, services, model_dir, tmp_path):
    import time

    from warmup.api.services import REVOCATION_CHECK_S
    from warmup.db.integrity import check_store

    spec, tc = spec_body(model_dir, max_tokens=100, max_length=128), cpu_toolchain()
    submit = {"spec": spec, "toolchain": tc.model_dump()}
    job = api.post("/v1/warmups", json=submit).json()
    assert play_worker(services, tc.key(), tmp_path) >= 2
    manifest = api.post("/v1/manifests", json=submit).json()
    flipped, deleted = manifest["files"][0], manifest["files"][-1]
    assert flipped["sha256"] != deleted["sha256"]
    data = bytearray(api.get(f"/v1/blobs/{flipped['sha256']}").content)
    data[0] ^= 0xFF  # one byte flipped, the size kept
    overwrite_blob(services.store, flipped["sha256"], bytes(data))
    services.store.delete(deleted["sha256"])
    assert api.get("/readyz").json() == {"status": "ready"}  # nothing knows yet

    report = check_store(services.engine, services.store)
    problems = {d.sha256: d.problem for d in report.damaged}
    assert problems.keys() == {flipped["sha256"], deleted["sha256"]}
    assert problems[deleted["sha256"]] == "missing from the store"
    assert problems[flipped["sha256"]].startswith("its bytes have sha256 ")
    assert report.entries_removed == 2 and report.blobs_checked == len(manifest["files"])
    assert not services.store.has(flipped["sha256"])  # the bad copy is gone: storing writes a good one

    time.sleep(REVOCATION_CHECK_S)  # the API forgets the manifest it keeps in memory within this
    partly = api.post("/v1/manifests", json=submit)
    assert partly.status_code == 409 and len(partly.json()["detail"]["missing"]) == 2
    readiness = api.get("/readyz")
    assert readiness.status_code == 200 and readiness.json()["status"] == "degraded"
    assert "2 blobs found damaged" in readiness.json()["problems"][0]
    assert "warmup_damaged_blobs 2.0" in api.get("/metrics").text
    assert "found 2 blob(s) damaged" in api.get("/").text
    status = api.get(f"/v1/warmups/{job['id']}").json()
    assert status["state"] == "incomplete"
    damaged = [s for s in status["signatures"] if s["state"] != "ready"]
    assert len(damaged) == 2 and all("warmup store check" in s["error"] for s in damaged)

    again = api.post("/v1/warmups", json=submit).json()
    assert again["id"] == job["id"] and again["state"] == "queued"
    assert play_worker(services, tc.key(), tmp_path) == 2
    assert api.get(f"/v1/warmups/{job['id']}").json()["state"] == "ready"
    assert api.get("/readyz").json() == {"status": "ready"}
    assert "warmup_damaged_blobs 0.0" in api.get("/metrics").text
    for file in (flipped, deleted):
        served = api.get(f"/v1/blobs/{file['sha256']}")
        assert served.status_code == 200 and hashlib.sha256(served.content).hexdigest() == file["sha256"]
    clean = check_store(services.engine, services.store)
    assert clean.damaged == [] and clean.blobs_checked == len(manifest["files"])


def test_store_check_dry_run_and_quick(api, services, model_dir, tmp_path):
    from warmup.db.integrity import check_store

    submit = {"spec": spec_body(model_dir), "toolchain": cpu_toolchain().model_dump()}
    job = api.post("/v1/warmups", json=submit).json()
    play_worker(services, cpu_toolchain().key(), tmp_path)
    file = api.post("/v1/manifests", json=submit).json()["files"][0]
    content = api.get(f"/v1/blobs/{file['sha256']}").content
    overwrite_blob(services.store, file["sha256"], bytes([content[0] ^ 1]) + content[1:])

    assert check_store(services.engine, services.store, read_back=False).damaged == []  # sizes agree
    looked = check_store(services.engine, services.store, repair=False)
    assert [d.sha256 for d in looked.damaged] == [file["sha256"]] and looked.entries_removed == 0
    assert api.get(f"/v1/warmups/{job['id']}").json()["state"] == "ready"  # --dry-run changed nothing

    overwrite_blob(services.store, file["sha256"], content[:-1])  # cut short: --quick sees it
    quick = check_store(services.engine, services.store, read_back=False)
    assert [d.problem for d in quick.damaged] == [f"{len(content) - 1} bytes stored, {len(content)} recorded"]
    assert api.get(f"/v1/warmups/{job['id']}").json()["state"] == "incomplete"


def test_a_revoked_token_is_refused_within_the_bound(db_url, tmp_path, model_dir):
    import time

    from warmup.api.services import REVOCATION_CHECK_S

    settings = Settings(
        data_dir=tmp_path, database_url=db_url, store_url=str(tmp_path / "b"), auth="required"
    )
    services = Services.start(settings)
    tokens = TokenStore(services.engine)
    info, token = tokens.create("pod", ["read"])
    _, ci = tokens.create("ci", ["read", "submit"])
    with TestClient(create_app(services=services)) as api:
        header = {"Authorization": f"Bearer {token}"}
        assert api.get("/v1/warmups", headers=header).status_code == 200  # verified, and cached
        tokens.revoke(info.id)  # as `warmup token revoke` does, from another process
        time.sleep(REVOCATION_CHECK_S)
        refused = api.get("/v1/warmups", headers=header)
        assert refused.status_code == 401 and "revoked" in refused.json()["detail"]["message"]

        # The status page alone takes ?token= (a browser sends no header), and only a read-only token.
        _, reader = tokens.create("browser", ["read"])
        assert api.get(f"/?token={reader}").status_code == 200
        wide = api.get(f"/?token={ci}")
        assert wide.status_code == 403 and "only scope is 'read'" in wide.json()["detail"]["message"]
        assert api.get("/", headers={"Authorization": f"Bearer {ci}"}).status_code == 200
        assert api.get(f"/v1/warmups?token={reader}").status_code == 401  # the API: the header only
    services.close()


def test_what_was_read_before_a_revocation_is_not_cached_after_it():
    """A token verified just before a revocation, whose answer arrives after the cache was emptied for it,
    must not go into the cache (it would live there for the cache's whole TTL)."""
    from warmup.api.services import ChangeWatch

    revoked, cache = [0], {}
    watch = ChangeWatch(lambda: revoked[0], cache.clear, every_s=0.0)
    watch.check()
    before = watch.generation  # a request starts verifying its token ...
    revoked[0] += 1  # ... the token is revoked, and another request sees it first
    watch.check()
    watch.keep(before, lambda: cache.update(token="read"))
    assert cache == {}
    watch.keep(watch.generation, lambda: cache.update(token="read"))  # nothing changed since: kept
    assert cache == {"token": "read"}


def test_the_background_pass_finds_a_deleted_blob(db_url, store_url, tmp_path, model_dir):
    import time

    settings = Settings(
        data_dir=tmp_path,
        database_url=db_url,
        store_url=store_url,
        auth="off",
        store_check_interval_s=0.2,
    )
    services = Services.start(settings)
    try:
        with TestClient(create_app(services=services)) as api:
            submit = {"spec": spec_body(model_dir), "toolchain": cpu_toolchain().model_dump()}
            job = api.post("/v1/warmups", json=submit).json()
            play_worker(services, cpu_toolchain().key(), tmp_path)
            file = api.post("/v1/manifests", json=submit).json()["files"][0]
            services.store.delete(file["sha256"])
            deadline = time.monotonic() + 60  # a pass runs every 0.2 s; the bound only ends a broken test
            while api.get("/readyz").json()["status"] != "degraded":
                assert time.monotonic() < deadline, "no pass found the deleted blob"
                time.sleep(0.1)
            assert api.get(f"/v1/warmups/{job['id']}").json()["state"] == "incomplete"
    finally:
        services.close()
