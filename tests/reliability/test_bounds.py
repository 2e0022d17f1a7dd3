"""Every way a request could make the service do unbounded work is refused, with the reason.

A spec that would plan a hundred thousand (or a billion) signatures is refused before they are listed;
bodies, nesting, config sizes, process counts and database integers are bounded. Each refusal is a
4xx that names the field and the bound.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.factories import cpu_toolchain
from tests.reliability.ledger import Row, record
from tests.support.tiny_model import write_tiny_model
from warmup.api.app import create_app
from warmup.api.services import Services
from warmup.errors import PlanTooLargeError
from warmup.job.spec import MAX_CONFIG_VALUES, MAX_NESTING, MAX_WORLD_SIZE, Spec
from warmup.planner.common import padded_lengths
from warmup.planner.online import Rollouts
from warmup.planner.planning import MAX_SIGNATURES, plan_spec
from warmup.settings import Settings

TOOLCHAIN = cpu_toolchain().model_dump(mode="json")
# A planning that lists no more than MAX_SIGNATURES signatures stays far below this; the refused
# specs below would need gigabytes if their lengths were listed first.
PLANNING_MEMORY_BOUND = 64 << 20

tried = {"bad_inputs": 0, "5xx": 0, "requests": 0}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Positions far beyond any bound here: the lengths these tests ask for are refused by the plan's size, not
    # by the model's max_position_embeddings (tested below on its own).
    return write_tiny_model(tmp_path_factory.mktemp("model"), max_position_embeddings=1 << 31)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory):
    services = Services.start(Settings(data_dir=tmp_path_factory.mktemp("bounds"), auth="off"))
    with TestClient(create_app(services=services), raise_server_exceptions=False) as test_client:
        yield test_client
    services.close()


def sft(model_dir: Path, **args: Any) -> dict[str, Any]:
    return {
        "trainer": "sft",
        "model": str(model_dir),
        "args": {"per_device_train_batch_size": 2, **args},
        "target": {"backend": "inductor", "device": "cpu"},
    }


def grpo(model_dir: Path, *, prompt: int, completion: int, **args: Any) -> dict[str, Any]:
    return {
        "trainer": "grpo",
        "model": str(model_dir),
        "args": {
            "per_device_train_batch_size": 4,
            "num_generations": 4,
            "max_completion_length": completion,
            "pad_to_multiple_of": 1,
            **args,
        },
        "data": {"max_prompt_tokens": prompt},
        "target": {"backend": "inductor", "device": "cpu"},
    }


def refused(client: TestClient, route: str, body: Any, *, raw: bytes | None = None) -> tuple[int, dict]:
    """POST a bad body; check it is a 4xx in the API's error shape and return (status, detail)."""
    content = raw if raw is not None else json.dumps(body).encode()
    answer = client.post(route, content=content, headers={"Content-Type": "application/json"})
    tried["bad_inputs"] += 1
    tried["requests"] += 1
    tried["5xx"] += answer.status_code >= 500
    assert 400 <= answer.status_code < 500, (route, answer.status_code, answer.text[:300])
    detail = answer.json()["detail"]
    assert detail["error"] and detail["message"], detail
    return answer.status_code, detail


def problem_text(detail: dict) -> str:
    return " | ".join(f"{p['loc']}: {p['msg']}" for p in detail.get("problems", [])) or detail["message"]


# --- plans too large are refused before they are listed ---------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(lambda m: sft(m, max_length=10**9), id="sft: a billion unpadded lengths"),
        pytest.param(lambda m: grpo(m, prompt=10**9, completion=64), id="grpo: a billion prompt lengths"),
        pytest.param(lambda m: grpo(m, prompt=2000, completion=2000), id="grpo: 2000 x 2000 rollouts"),
        pytest.param(
            lambda m: grpo(m, prompt=2000, completion=64, cache_implementation="static"),
            id="grpo: static caches over 2000 prompt lengths",
        ),
    ],
)
def test_a_huge_plan_is_refused_without_listing_it(spec, model_dir: Path) -> None:
    """The planner stops at the bound: memory stays small whatever the spec asks for."""
    parsed = Spec.model_validate(spec(model_dir))
    plan_spec(Spec.model_validate(sft(model_dir, max_length=64)))  # TRL imported: measure the planning only
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(PlanTooLargeError, match=f"more than {MAX_SIGNATURES} signatures") as error:
            plan_spec(parsed)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"refused in {time.perf_counter() - started:.3f} s, peak {peak / 2**20:.1f} MiB: {error.value}")
    assert peak < PLANNING_MEMORY_BOUND
    assert [p.loc for p in error.value.problems] == ["args.pad_to_multiple_of"]
    tried["bad_inputs"] += 1


def test_a_spec_of_100k_signatures_is_refused_by_the_api_with_the_reason(client, model_dir) -> None:
    started = time.perf_counter()
    status, detail = refused(client, "/v1/plans", {"spec": sft(model_dir, max_length=100_000)})
    print(f"POST /v1/plans refused in {time.perf_counter() - started:.3f} s: {detail['message']}")
    assert status == 422
    assert detail["problems"][0]["loc"] == "args.pad_to_multiple_of"
    assert "100000 padded sequence lengths from 1 to 100000" in detail["message"]
    assert f"more than {MAX_SIGNATURES} signatures" in detail["message"]


def test_a_max_length_past_the_models_positions_is_refused_with_both_numbers(client, tmp_path) -> None:
    small = write_tiny_model(tmp_path / "model")  # max_position_embeddings 4096
    status, detail = refused(client, "/v1/plans", {"spec": sft(small, max_length=100_000)})
    assert status == 422 and detail["problems"][0]["loc"] == "args.max_length"
    assert "max_length 100000 is beyond the model's max_position_embeddings 4096" in detail["message"]


def test_the_largest_accepted_plan_still_plans(client, model_dir) -> None:
    """The bound refuses only what exceeds it: MAX_SIGNATURES lengths plan fine."""
    spec = sft(model_dir, max_length=64 * MAX_SIGNATURES, pad_to_multiple_of=64)
    spec["data"] = {"num_train_examples": 2, "min_tokens": 1}  # no short last batch: one batch size
    answer = client.post("/v1/plans", json={"spec": spec})
    assert answer.status_code == 200, answer.text[:300]
    assert len(answer.json()["signatures"]) == MAX_SIGNATURES


@settings(max_examples=200, derandomize=True, deadline=None, database=None)
@given(
    prompt=st.tuples(st.integers(1, 300), st.integers(1, 300)).map(sorted),
    completion=st.tuples(st.integers(1, 300), st.integers(1, 300)).map(sorted),
    multiple=st.one_of(st.none(), st.integers(1, 64)),
)
def test_rollout_widths_are_every_prompt_plus_completion(prompt, completion, multiple) -> None:
    """The widths are computed without the P x C pairs; they are exactly the pairs' sums."""
    prompts, completions = padded_lengths(*prompt, multiple), padded_lengths(*completion, multiple)
    rollouts = Rollouts(prompts=prompts, completions=completions, max_new_tokens=completion[1], step=multiple)
    assert rollouts.sequences == sorted({p + c for p in prompts for c in completions})


# --- bodies, nesting, counts, numbers -----------------------------------------------------------------


def test_a_body_over_the_limit_is_refused_whether_or_not_it_declares_its_length(client) -> None:
    limit = client.app.state.services.settings.max_body_bytes
    big = b'{"spec": {"model": "' + b"x" * (limit + 1) + b'"}}'
    status, detail = refused(client, "/v1/plans", None, raw=big)
    assert (status, detail["error"]) == (413, "body_too_large")
    assert str(limit) in detail["message"]

    def chunks():  # no Content-Length: the limit counts what arrives
        yield b'{"spec": {"model": "'
        for _ in range(limit // 65536 + 2):
            yield b"x" * 65536
        yield b'"}}'

    answer = client.post("/v1/manifests", content=chunks(), headers={"Content-Type": "application/json"})
    tried["bad_inputs"] += 1
    tried["requests"] += 1
    assert answer.status_code == 413, answer.text[:200]
    assert answer.json()["detail"]["error"] == "body_too_large"


@pytest.mark.parametrize("route", ["/v1/plans", "/v1/warmups", "/v1/manifests", "/v1/coverage"])
def test_nesting_just_past_the_bound_and_far_past_a_parsers_limit_is_refused(
    client, model_dir, route
) -> None:
    """Deeper than the bound: the field is named. Deeper than a JSON parser goes: the body is named."""
    for depth in (MAX_NESTING + 1, 900):  # 900 levels was a 500 (RecursionError) before the bound
        spec = sft(model_dir, max_length=64)
        spec["args"]["model_init_kwargs"] = json.loads("[" * depth + "]" * depth)
        body = {"spec": spec} if route == "/v1/plans" else {"spec": spec, "toolchain": TOOLCHAIN}
        status, detail = refused(client, route, body)
        assert status == 422
        if route == "/v1/manifests" and depth > 128:
            # This route parses its body with pydantic's JSON parser, which stops at 128 levels itself.
            assert "recursion limit exceeded" in problem_text(detail)
            continue
        assert "args.model_init_kwargs" in problem_text(detail)
        assert f"nested more than {MAX_NESTING} levels" in problem_text(detail)
    deepest = b'{"spec": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    status, detail = refused(client, route, None, raw=deepest)
    assert status in (400, 422)
    assert "recursion" in detail["message"].lower()


def test_a_config_of_thousands_of_fields_is_refused_at_the_bound_and_below_it_field_by_field(
    client, model_dir
) -> None:
    """Each unknown field costs a fuzzy search for the one meant: 40,000 junk keys took 113 s."""
    flood = sft(model_dir, max_length=64)
    flood["args"].update({f"junk_{i:06d}": 1 for i in range(MAX_CONFIG_VALUES + 1)})
    status, detail = refused(client, "/v1/plans", {"spec": flood})
    assert status == 422
    assert f"more than {MAX_CONFIG_VALUES} fields and items" in problem_text(detail)

    many = sft(model_dir, max_length=64)
    many["args"].update({f"per_device_{i:05d}": 1 for i in range(MAX_CONFIG_VALUES - 16)})
    started = time.perf_counter()
    status, detail = refused(client, "/v1/plans", {"spec": many})
    print(f"{MAX_CONFIG_VALUES - 16} unknown fields refused in {time.perf_counter() - started:.2f} s")
    assert status == 422
    assert len(detail["problems"]) == MAX_CONFIG_VALUES - 16
    assert detail["problems"][0]["loc"] == "args.per_device_00000"
    assert detail["problems"][0]["msg"].startswith("unknown field (`trl sft` refuses it")


@pytest.mark.parametrize(
    ("where", "value", "named"),
    [
        ("args.learning_rate", float("nan"), "args.learning_rate is nan"),
        ("args.temperature", float("inf"), "args.temperature is inf"),
        ("target.world_size", MAX_WORLD_SIZE + 1, f"less than or equal to {MAX_WORLD_SIZE}"),
        ("target.world_size", 10**19, f"less than or equal to {MAX_WORLD_SIZE}"),
    ],
)
def test_numbers_without_a_meaning_are_refused(client, model_dir, where, value, named) -> None:
    spec = grpo(model_dir, prompt=32, completion=32)
    section, field = where.split(".")
    spec[section][field] = value
    for body in ({"spec": spec, "pool": "default"}, {"spec": spec, "toolchain": TOOLCHAIN}):
        status, detail = refused(client, "/v1/warmups", body)
        assert status == 422
        assert named in problem_text(detail), detail


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/v1/warmups?offset=9223372036854775808", "query.offset"),  # was a 500: OverflowError in SQLite
        ("/v1/warmups?limit=100000", "query.limit"),
        ("/v1/tasks/9223372036854775808/log", "path.task_id"),  # was a 500 too
        ("/v1/tasks/0/log", "path.task_id"),
    ],
)
def test_query_and_path_integers_are_bounded(client, path, named) -> None:
    answer = client.get(path)
    tried["bad_inputs"] += 1
    tried["requests"] += 1
    tried["5xx"] += answer.status_code >= 500
    assert answer.status_code == 422, answer.text[:300]
    assert answer.json()["detail"]["problems"][0]["loc"] == named


def test_coverage_reports_are_bounded(client, model_dir) -> None:
    spec = sft(model_dir, max_length=64)
    report = {"spec": spec, "toolchain": TOOLCHAIN, "met": ["0" * 64] * 4097}
    status, detail = refused(client, "/v1/coverage", report)
    assert status == 422 and detail["problems"][0]["loc"] == "met"
    report = {"spec": spec, "toolchain": TOOLCHAIN, "fresh_compiles": 2**63}
    status, detail = refused(client, "/v1/coverage", report)
    assert status == 422 and detail["problems"][0]["loc"] == "fresh_compiles"


@pytest.mark.parametrize(
    ("model", "named"),
    [
        ("m" * 300, "is not a readable directory"),  # a name longer than a filesystem holds: was a 500
        ("~no-such-user-" + "x" * 40, "is not a readable directory"),  # an unknown ~user: was a 500
        ("./" + "a/" * 3000, "at most 4096 characters"),
    ],
)
def test_model_names_no_filesystem_holds_are_refused(client, model_dir, model, named) -> None:
    for field in ("model", "teacher_model"):
        spec = sft(model_dir) | {field: model}
        if field == "teacher_model":
            spec["trainer"] = "distillation"
        status, detail = refused(client, "/v1/plans", {"spec": spec})
        assert status == 422 and named in problem_text(detail), detail
        assert any(p["loc"].endswith(field) for p in detail["problems"]), detail


def test_values_the_database_cannot_store_are_refused(db_url: str, tmp_path: Path, model_dir: Path) -> None:
    """On PostgreSQL each of these was a 500 (NUL in JSON or text, NaN in JSON); now a 422 on both."""
    services = Services.start(Settings(data_dir=tmp_path, database_url=db_url, auth="off"))
    spec = sft(model_dir, max_length=64, pad_to_multiple_of=32, torch_compile=True)
    try:
        with TestClient(create_app(services=services), raise_server_exceptions=False) as client:
            planned = client.post("/v1/plans", json={"spec": spec}).json()["signatures"][0]
            missed = {k: v for k, v in planned.items() if k != "key"} | {"seq_len": 4096}
            report = {"spec": spec, "toolchain": TOOLCHAIN}
            cases = [
                (
                    "/v1/warmups",
                    {"spec": _set(spec, "args", output_dir="a\x00b"), "toolchain": TOOLCHAIN},
                    "spec.args.output_dir",
                ),
                (
                    "/v1/warmups",
                    {"spec": _set(spec, "target", neuron_rt_visible_cores="0\x00"), "toolchain": TOOLCHAIN},
                    "spec.target.neuron_rt_visible_cores",
                ),
                (
                    "/v1/warmups",
                    {"spec": spec, "toolchain": TOOLCHAIN | {"env": {"CC": "\x00"}}},
                    "toolchain.env.CC",
                ),
                ("/v1/warmups", {"spec": spec, "pool": "gpu\x00"}, "pool"),
                (
                    "/v1/manifests",
                    {"spec": spec, "toolchain": TOOLCHAIN | {"python": "3\x00"}},
                    "toolchain.python",
                ),
                ("/v1/coverage", report | {"met": ["\x00"]}, "met.0"),
                ("/v1/coverage", report | {"details": {"hits": float("nan")}}, "details.hits is nan"),
                ("/v1/coverage", report | {"details": {"why\x00": 1}}, "NUL character in a field name"),
                (
                    "/v1/coverage",
                    report | {"missed": [missed | {"settings": {"t": float("inf")}}]},
                    "missed.0.settings.t is inf",
                ),
                ("/v1/coverage", report | {"missed": [missed | {"dtype": "\x00"}]}, "missed.0.dtype"),
            ]
            for route, body, named in cases:
                status, detail = refused(client, route, body)
                assert status == 422 and named in detail["message"], (route, named, detail)
    finally:
        services.close()


def _set(spec: dict[str, Any], section: str, **values: Any) -> dict[str, Any]:
    return {**spec, section: {**spec.get(section, {}), **values}}


@pytest.fixture(scope="module", autouse=True)
def _record_what_the_module_tried() -> Iterator[None]:
    """After the module's tests: one ledger row for all they tried (whichever of them ran)."""
    yield
    assert tried["5xx"] == 0
    if not tried["bad_inputs"]:
        return  # none of the counting tests ran (-k)
    record(
        Row(
            scenario="bounds: huge plans, bodies, nesting, counts, integers",
            bad_inputs=tried["bad_inputs"],
            responses_5xx=tried["5xx"],
            requests=tried["requests"],
        )
    )
