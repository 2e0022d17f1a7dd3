"""Fuzz the API with bad input: never a 5xx, and every 4xx names the problem.

Two fuzzers, both derandomized so that CI runs the same inputs every time:

- schemathesis generates requests for every operation of the app's own OpenAPI schema, valid ones and
  ones that break the schema, and checks each answer against the schema (no server error, documented
  status codes and bodies);
- hypothesis breaks plausible specs one field at a time (wrong types, unknown fields, huge or negative
  numbers, deep nesting, odd unicode, enormous strings) and posts them to the routes that take a spec.

The app runs on SQLite and a local blob store, with bearer-token auth on and an admin token.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import huggingface_hub.constants
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS

from tests.fixtures.factories import cpu_toolchain
from tests.reliability.ledger import Row, record
from tests.support.tiny_model import write_tiny_model
from warmup.api.app import create_app
from warmup.api.services import Services
from warmup.db.tokens import TokenStore
from warmup.job.spec import MAX_NESTING, MAX_WORLD_SIZE, TRAINER_KINDS, DataFacts, Spec, Target
from warmup.settings import Settings

# Examples per operation and generation mode, and broken specs per route: enough to reach every
# validator, small enough that the module runs in a couple of minutes on a shared machine.
SCHEMA_EXAMPLES = 25
SPEC_EXAMPLES = 150


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory):
    data = tmp_path_factory.mktemp("fuzz-service")
    settings = Settings(data_dir=data, auth="required")  # SQLite and a blob directory under data_dir
    started = Services.start(settings)
    yield started
    started.close()


@pytest.fixture(scope="module")
def admin_headers(services: Services) -> dict[str, str]:
    _, token = TokenStore(services.engine).create("fuzzer", ["admin"])
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def app(services: Services):
    return create_app(services=services)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fuzzed model name must never reach the Hugging Face Hub: it is read offline or refused."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def problem_named(status: int, body: Any) -> str | None:
    """Why a 4xx body does not name its problem, or None when it does.

    Every error answer is {"detail": {"error": code, "message": ...}}; a 422 also lists its problems,
    each with the field (`loc`) and the reason (`msg`).
    """
    detail = body.get("detail") if isinstance(body, dict) else None
    if not isinstance(detail, dict):
        return f"no detail object: {body!r:.300}"
    if not (isinstance(detail.get("error"), str) and detail["error"]):
        return f"no error code: {detail!r:.300}"
    if not (isinstance(detail.get("message"), str) and detail["message"].strip()):
        return f"no message: {detail!r:.300}"
    if status == 422:
        problems = detail.get("problems")
        if not (isinstance(problems, list) and problems):
            return f"a 422 without problems: {detail!r:.300}"
        for problem in problems:
            if not (isinstance(problem, dict) and problem.get("loc") and problem.get("msg")):
                return f"a problem without field or reason: {problem!r:.300}"
    return None


# --- schemathesis: every operation of the OpenAPI schema ------------------------------------------


def operations(app) -> list:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    found = [result.ok() for result in schema.get_all_operations()]
    assert len(found) >= 10, "the schema lost its operations"
    return found


def test_every_operation_answers_bad_and_good_input_without_server_errors(app, admin_headers) -> None:
    seen: Counter[str] = Counter()
    unnamed: list[str] = []
    with TestClient(app) as client:  # runs the lifespan once; the cases call the app in-process
        assert client.get("/healthz").status_code == 200
        for operation in operations(app):
            raw = operation.definition.raw
            takes_input = bool(raw.get("parameters") or raw.get("requestBody"))
            # An operation without parameters or body has no input to break.
            modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if takes_input else [])
            for mode in modes:
                fuzz_operation(operation, mode, admin_headers, seen, unnamed)

    print(f"schemathesis: {dict(seen)}")
    assert seen["5xx"] == 0
    assert unnamed == [], "\n".join(sorted({u[:200] for u in unnamed}))
    record(
        Row(
            scenario="fuzz: every API operation (schemathesis)",
            bad_inputs=seen[GenerationMode.NEGATIVE.value],
            responses_5xx=seen["5xx"],
            requests=seen["requests"],
        )
    )


# Every built-in check but the one that expects schema-valid input to succeed: a well-typed spec may
# still name a model that does not exist, and the answer is then a 422 that says so.
CHECKS_RUN = [check for check in CHECKS.get_all() if check.__name__ != "positive_data_acceptance"]


def fuzz_operation(
    operation, mode: GenerationMode, headers: dict[str, str], seen: Counter, unnamed: list
) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=SCHEMA_EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case) -> None:
        response = case.call(headers=dict(headers))
        seen["requests"] += 1
        seen[mode.value] += 1
        if response.status_code >= 500:
            seen["5xx"] += 1
        case.validate_response(response, checks=CHECKS_RUN, headers=dict(headers))
        if 400 <= response.status_code < 500 and response.status_code != 405:
            why = problem_named(response.status_code, _json(response.content))
            if why:
                unnamed.append(f"{case.operation.label} {response.status_code}: {why}")

    fuzz()


def _json(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return None


# --- hypothesis: plausible specs, one field broken -------------------------------------------------

SPEC_ROUTES = ("/v1/plans", "/v1/advice", "/v1/warmups", "/v1/manifests", "/v1/coverage")
TOOLCHAIN = cpu_toolchain().model_dump(mode="json")
INT_ARGS = (
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "gradient_accumulation_steps",
    "max_length",
    "pad_to_multiple_of",
)
FLOAT_ARGS = ("learning_rate", "weight_decay", "max_grad_norm")
DATA_INTS = ("num_train_examples", "max_tokens", "min_tokens")


def base_spec(model_dir: Path) -> dict[str, Any]:
    """A spec the service plans (checked by the first test below); the fuzzer breaks one field of it."""
    return {
        "trainer": "sft",
        "model": str(model_dir),
        "args": {"per_device_train_batch_size": 2, "max_length": 64, "pad_to_multiple_of": 32},
        "data": {"num_train_examples": 8, "min_tokens": 40, "max_tokens": 60},
        "target": {"backend": "inductor", "device": "cpu"},
    }


# Per-example lengths within the base spec's data facts, for the advice route.
LENGTHS = {"train": [40, 52, 60, 47, 41, 58, 55, 44]}


def body_for(route: str, spec: dict[str, Any]) -> dict[str, Any]:
    if route == "/v1/plans":
        return {"spec": spec}
    if route == "/v1/advice":
        return {"spec": spec, "dataset": LENGTHS, "toolchain": TOOLCHAIN}
    return {"spec": spec, "toolchain": TOOLCHAIN}


def not_an_int() -> st.SearchStrategy[Any]:
    """Values no integer field takes: text, fractions, non-finite floats, containers, null-less junk."""
    return st.one_of(
        st.text(max_size=20).filter(lambda s: not s.strip().lstrip("+-").isdigit()),
        st.floats().filter(lambda x: not x.is_integer() if x == x and abs(x) != float("inf") else True),
        st.lists(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    )


def nested(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):
        value = {"k": value} if level % 2 else [value]
    return value


# Each strategy gives (field path, value): a value that field cannot take.
BROKEN_FIELDS = st.one_of(
    st.tuples(
        st.just("trainer"),
        st.one_of(
            st.none(),
            st.integers(),
            st.text().filter(lambda s: s.lower() not in TRAINER_KINDS),
            st.lists(st.text()),
        ),
    ),
    st.tuples(
        st.just("model"), st.one_of(st.none(), st.integers(), st.just(""), st.lists(st.text(), max_size=2))
    ),
    # A model that is no directory here, in any script, of any length, or a ~user nobody is: refused
    # (offline: the Hub is not asked). Past 1 MiB the body itself is refused.
    st.tuples(
        st.sampled_from(["model", "teacher_model"]),
        st.one_of(
            st.text(min_size=1).map(lambda s: f"./no-such-model/{s}"),
            st.text(min_size=1, max_size=20).map(lambda s: f"~{s}x/config"),
            st.integers(256, 2_000_000).map(lambda n: "m" * n),
        ),
    ),
    st.tuples(st.just("teacher_model"), st.text(min_size=1)),
    st.tuples(
        st.sampled_from(INT_ARGS).map(lambda f: f"args.{f}"),
        st.one_of(not_an_int(), st.integers(max_value=0)),
    ),
    st.tuples(
        st.sampled_from(FLOAT_ARGS).map(lambda f: f"args.{f}"),
        st.one_of(
            st.sampled_from([float("nan"), float("inf"), float("-inf")]),
            st.text(min_size=1).filter(lambda s: not _is_number(s)),
            st.lists(st.integers(), min_size=1),
        ),
    ),
    st.tuples(
        st.just("args.model_init_kwargs"),
        st.integers(min_value=MAX_NESTING + 1, max_value=150).map(lambda d: {"x": nested(d)}),
    ),
    st.tuples(
        st.sampled_from(DATA_INTS).map(lambda f: f"data.{f}"),
        st.one_of(not_an_int(), st.integers(max_value=0)),
    ),
    st.tuples(
        st.just("data.length_histogram"),
        st.one_of(
            st.dictionaries(
                st.integers(max_value=0).map(str), st.integers(min_value=1), min_size=1, max_size=4
            ),
            st.dictionaries(
                st.integers(min_value=1).map(str), st.integers(max_value=0), min_size=1, max_size=4
            ),
            st.dictionaries(
                st.text(min_size=1).filter(lambda s: not _is_number(s)),
                st.integers(min_value=1),
                min_size=1,
                max_size=4,
            ),
        ),
    ),
    st.tuples(
        st.just("target.backend"),
        st.one_of(st.integers(), st.text().filter(lambda s: s not in ("neuron", "inductor"))),
    ),
    st.tuples(st.just("target.device"), st.text().filter(lambda s: s not in ("neuron", "cuda", "cpu"))),
    st.tuples(
        st.just("target.world_size"),
        st.one_of(st.integers(max_value=0), st.integers(min_value=MAX_WORLD_SIZE + 1), not_an_int()),
    ),
)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _known_fields(section: str) -> set[str]:
    from warmup.job.trl_args import config_class

    if section == "args":
        return {f.name for f in dataclasses.fields(config_class("sft"))}
    return set({"data": DataFacts, "target": Target}[section].model_fields)


@st.composite
def broken_specs(draw: st.DrawFn, model_dir: Path) -> tuple[tuple[str, ...], dict[str, Any]]:
    """(the path of the wrong field, a spec with that field wrong): a bad value, or a key nobody knows."""
    spec = json.loads(json.dumps(base_spec(model_dir)))
    if draw(st.integers(0, 4)) == 0:  # an unknown field, in the spec or any mapping of it
        section = draw(st.sampled_from(["", "args", "data", "target"]))
        known = set(Spec.model_fields) if not section else _known_fields(section)
        name = draw(st.text(min_size=1, max_size=40).filter(lambda s: s not in known))
        path = (*([section] if section else []), name)
        value = draw(st.one_of(st.integers(), st.text(max_size=10), st.none()))
    else:
        dotted, value = draw(BROKEN_FIELDS)
        path = tuple(dotted.split("."))
    holder = spec
    for part in path[:-1]:
        holder = holder.setdefault(part, {})
    holder[path[-1]] = value
    return path, spec


def names_field(body: Any, path: tuple[str, ...]) -> bool:
    """Whether an error answer names the wrong field: in a problem's loc, or in its message."""
    detail = body["detail"]
    dotted = ".".join(path)
    escaped = repr(dotted)[1:-1]  # as a message quotes an invisible character
    texts = [detail["message"]]
    for problem in detail.get("problems", []):
        texts.append(f"{str(problem['loc']).removeprefix('spec.')} {problem['msg']}")
    return any(dotted in text or escaped in text for text in texts)


def test_the_base_spec_plans(app, model_dir, admin_headers) -> None:
    """The fuzzer's starting point is valid: whatever it breaks, the refusal is about that field."""
    with TestClient(app) as client:
        answer = client.post("/v1/plans", json={"spec": base_spec(model_dir)}, headers=admin_headers)
        advice = client.post(
            "/v1/advice", json=body_for("/v1/advice", base_spec(model_dir)), headers=admin_headers
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["signatures"]
    assert advice.status_code == 200, advice.text


def test_broken_specs_are_refused_naming_the_field(app, model_dir, admin_headers) -> None:
    seen: Counter[str] = Counter()
    limit = app.state.services.settings.max_body_bytes

    with TestClient(app) as client:

        @given(route=st.sampled_from(SPEC_ROUTES), broken=broken_specs(model_dir))
        @settings(
            max_examples=SPEC_EXAMPLES,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(route: str, broken: tuple[tuple[str, ...], dict[str, Any]]) -> None:
            path, spec = broken
            content = json.dumps(body_for(route, spec)).encode()  # NaN and Infinity as Python writes them
            answer = client.post(
                route, content=content, headers={**admin_headers, "Content-Type": "application/json"}
            )
            seen["tried"] += 1
            seen[f"{answer.status_code // 100}xx"] += 1
            assert answer.status_code < 500, (path, answer.text[:500])
            if len(content) > limit:
                assert answer.status_code == 413, (path, answer.status_code)
                return
            assert answer.status_code in (400, 404, 409, 422), (path, answer.status_code, answer.text[:300])
            assert problem_named(answer.status_code, answer.json()) is None, answer.text[:300]
            assert names_field(answer.json(), path), (path, answer.text[:500])

        fuzz()

    print(f"broken specs: {dict(seen)}")
    assert seen["tried"] == SPEC_EXAMPLES and seen["5xx"] == 0
    record(
        Row(
            scenario="fuzz: broken specs on the spec routes (hypothesis)",
            bad_inputs=seen["tried"],
            responses_5xx=seen["5xx"],
            requests=seen["tried"],
        )
    )
