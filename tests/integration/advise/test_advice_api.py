"""POST /v1/advice against real databases (SQLite and PostgreSQL): the same advice as the library, compile
seconds recorded under the toolchain replacing the seed figures, bad input named by field."""

from __future__ import annotations

import random

import pytest
from fastapi.testclient import TestClient

from tests.fixtures.factories import cpu_toolchain
from tests.support.length_data import DISTRIBUTIONS
from warmup.advise.advice import DatasetLengths, SplitLengths, advise, lengths_from_histogram
from warmup.api.app import create_app
from warmup.api.services import Services
from warmup.job.spec import load_spec
from warmup.settings import Settings

LENGTHS = DISTRIBUTIONS["bimodal"](random.Random(4), 90, 5, 200)


def spec_body(model_dir, **args) -> dict:
    return {
        "trainer": "sft",
        "model": str(model_dir),
        "args": {
            "per_device_train_batch_size": 4,
            "max_length": 256,
            "pad_to_multiple_of": 64,
            "torch_compile": True,
            "bf16": False,
            **args,
        },
        "target": {"backend": "inductor", "device": "cpu"},
    }


@pytest.fixture
def services(db_url, tmp_path):
    settings = Settings(data_dir=tmp_path, database_url=db_url, store_url=str(tmp_path / "blobs"), auth="off")
    started = Services.start(settings)
    yield started
    started.close()


@pytest.fixture
def api(services):
    with TestClient(create_app(services=services)) as client:
        yield client


def test_advice_is_the_librarys(api, tiny_model_dir):
    body = {
        "spec": spec_body(tiny_model_dir),
        "dataset": {"train": {"completion": LENGTHS}},
        "max_truncated": 0.05,
    }
    answer = api.post("/v1/advice", json=body)
    assert answer.status_code == 200, answer.text
    advice = answer.json()
    expected = advise(
        load_spec(spec_body(tiny_model_dir)),
        DatasetLengths(train=SplitLengths.of(completion=LENGTHS), source="the request's dataset"),
        max_truncated=0.05,
    )
    assert advice == expected.model_dump(mode="json")
    assert {"current", "options", "recommended"} <= advice.keys()
    fastest = min(o["projected_seconds"] for o in advice["options"])
    assert advice["recommended"]["projected_seconds"] == fastest


def test_recorded_compile_seconds_under_the_toolchain(api, services, tiny_model_dir):
    """A warm-up of the job as configured records 7.5 s per signature; advice for that toolchain uses them,
    and for the other options' signatures of the same model and phase, their median."""
    spec = spec_body(tiny_model_dir)
    dataset = {"train": {"completion": LENGTHS}}
    seeded = api.post("/v1/advice", json={"spec": spec, "dataset": dataset}).json()
    current = seeded["current"]
    # The job as `warmup plan --dataset` would submit it: the dataset's facts in the spec.
    planned = load_spec(spec_body(tiny_model_dir)).model_dump(mode="json")
    planned["data"] = {
        "num_train_examples": len(LENGTHS),
        "length_histogram": {n: LENGTHS.count(n) for n in sorted(set(LENGTHS))},
        "max_tokens": max(LENGTHS),
        "min_tokens": min(LENGTHS),
    }
    toolchain = cpu_toolchain()
    submitted = api.post("/v1/warmups", json={"spec": planned, "toolchain": toolchain.model_dump()})
    assert submitted.status_code == 201, submitted.text
    assert {s["signature"]["seq_len"] for s in submitted.json()["signatures"]} == {
        s["seq_len"] for s in current["signatures"]
    }
    while (task := services.queue.claim("w", toolchain.key(), lease_s=60)) is not None:
        services.queue.complete(task.id, "w", [], compile_seconds=7.5)

    body = {"spec": spec, "dataset": dataset, "toolchain": toolchain.model_dump()}
    recorded = api.post("/v1/advice", json=body).json()
    assert recorded["compile_costs"].startswith("recorded under this toolchain")
    for option in recorded["options"]:
        compiled = [s for s in option["signatures"] if s["compile"] != "eager"]
        assert option["compile_seconds"] == pytest.approx(7.5 * len(compiled))
    assert seeded["current"]["compile_seconds"] != recorded["current"]["compile_seconds"]


def test_step_time_from_the_jobs_training_runs(api, tiny_model_dir):
    """Training runs of the job report their steady-state step time (WarmupCallback's timed_steps); advice for
    the same configuration under that toolchain is calibrated with their mean, whatever data facts the job
    was submitted with. A run of another configuration does not count."""
    spec = spec_body(tiny_model_dir)
    dataset = {"train": {"completion": LENGTHS}}
    toolchain = cpu_toolchain().model_dump()
    with_facts = load_spec(spec).model_dump(mode="json")
    with_facts["data"] = {"num_train_examples": len(LENGTHS), "max_tokens": max(LENGTHS)}
    other = load_spec(spec_body(tiny_model_dir, max_length=128)).model_dump(mode="json")
    for document, timed in ((with_facts, (8, 4.0)), (with_facts, (12, 8.0)), (other, (10, 100.0))):
        report = {
            "spec": document,
            "toolchain": toolchain,
            "details": {"timed_steps": {"count": timed[0], "seconds": timed[1]}},
        }
        assert api.post("/v1/coverage", json=report).status_code == 200

    advice = api.post("/v1/advice", json={"spec": spec, "dataset": dataset, "toolchain": toolchain}).json()
    assert advice["step_costs"] == (
        "calibrated: 0.6 s per optimizer step of the job as configured "
        "(measured: the mean of 20 step(s) reported by this job's training runs)"
    )
    library = advise(
        load_spec(spec),
        DatasetLengths(train=SplitLengths.of(completion=LENGTHS), source="the request's dataset"),
        step_seconds=0.6,
    )
    assert advice["current"]["projected_seconds"] == pytest.approx(library.current.projected_seconds)
    seeded = api.post("/v1/advice", json={"spec": spec, "dataset": dataset}).json()  # no toolchain: seed
    assert seeded["step_costs"].startswith("seed:")


def test_bad_input_names_the_field(api, tiny_model_dir):
    dpo = spec_body(tiny_model_dir) | {"trainer": "dpo"}
    answer = api.post("/v1/advice", json={"spec": dpo, "dataset": {"train": {"completion": LENGTHS}}})
    assert answer.status_code == 422
    assert answer.json()["detail"]["problems"][0]["loc"] == "dataset"
    ragged = {"train": {"prompt": [1, 2], "completion": [3]}}
    answer = api.post("/v1/advice", json={"spec": spec_body(tiny_model_dir), "dataset": ragged})
    assert answer.status_code == 422 and "dataset.train" in answer.text
    no_data = api.post("/v1/advice", json={"spec": spec_body(tiny_model_dir)})
    assert no_data.status_code == 422 and no_data.json()["detail"]["problems"][0]["loc"] == "dataset"
    unknown_pool = api.post(
        "/v1/advice", json={"spec": spec_body(tiny_model_dir), "dataset": {"train": LENGTHS}, "pool": "trn2"}
    )
    assert unknown_pool.status_code == 422 and "no worker of pool 'trn2'" in unknown_pool.text


def test_status_page_plots_the_advice_of_jobs_with_a_length_histogram(api, services, tiny_model_dir):
    histogram = {n: LENGTHS.count(n) for n in sorted(set(LENGTHS))}
    with_lengths = load_spec(spec_body(tiny_model_dir)).model_dump(mode="json")
    with_lengths["data"] = {"num_train_examples": len(LENGTHS), "length_histogram": histogram}
    without = spec_body(tiny_model_dir, max_length=128)
    for spec in (with_lengths, without):
        answer = api.post("/v1/warmups", json={"spec": spec, "toolchain": cpu_toolchain().model_dump()})
        assert answer.status_code == 201, answer.text

    page = api.get("/").text
    assert page.count("padding advice") == 1  # the job whose spec has no histogram gets none
    chart = page[page.index('<svg class="chart advice"') :]
    chart = chart[: chart.index("</svg>")]
    advice = advise(load_spec(with_lengths), lengths_from_histogram("sft", histogram))
    assert chart.count("<g>") == len(advice.options)
    assert "pad 64, max 256 (current)" in chart
    assert "from the length histogram: an estimate" in page
