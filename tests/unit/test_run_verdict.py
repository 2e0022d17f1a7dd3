"""The verdict line a training run ends with (`warmup exec`'s last line when a WarmupCallback watches the
run): what it met and compiled, and where its coverage report went, in every mode: no service (a directory
`warmup warm` filled), a service that cannot be reached, and one that took the report."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fixtures.factories import one_signature_sft
from tests.support.live_server import serve
from tests.support.tiny_model import write_tiny_model
from warmup.api.services import Services
from warmup.job.spec import Spec, load_spec
from warmup.pod.callback import timings
from warmup.pod.callback.observer import WarmupCallback
from warmup.settings import Settings

VERDICT = (
    r"^trl-warmup: completed: met 0 signature\(s\), 0 warm, 0 missed, 0 fresh compile\(s\); trace [\d.]+ s"
)


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Spec:
    return load_spec(one_signature_sft(write_tiny_model(tmp_path_factory.mktemp("model"))))


@pytest.fixture(autouse=True)
def no_verdict_said_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timings, "_VERDICT_SAID", [])


def ended(spec: Spec, tmp_path: Path, server: str | None) -> WarmupCallback:
    callback = WarmupCallback(spec, cache_dir=tmp_path / "cache", server=server, timeout_s=2.0)
    callback.on_train_begin(SimpleNamespace(output_dir=str(tmp_path / "out")), None, None, model=None)
    callback.on_train_end(None, None, None)
    return callback


def verdict(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and re.match(VERDICT, lines[-1]), lines
    assert timings._VERDICT_SAID  # so exec's exit line does not follow it
    return lines[-1]


def test_without_a_service_the_run_says_where_its_report_is_and_does_not_ask_for_one(spec, tmp_path, capsys):
    ended(spec, tmp_path, None)
    line = verdict(capsys)
    assert line.endswith(f"; report written to {tmp_path / 'out' / 'warmup-coverage.json'}")
    assert (tmp_path / "out" / "warmup-coverage.json").is_file()
    assert "WARMUP_SERVER" not in line and "no server" not in line


def test_a_service_that_cannot_be_reached_is_named_in_the_verdict(spec, tmp_path, capsys):
    ended(spec, tmp_path, "http://127.0.0.1:9")
    assert "; the report could not be posted to http://127.0.0.1:9: " in verdict(capsys)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[str]:
    services = Services.start(Settings(data_dir=tmp_path / "service", auth="off"))
    with serve(services) as url:
        yield url
    services.close()


def test_a_posted_report_is_named_with_its_job_short_id(spec, tmp_path, capsys, service):
    callback = ended(spec, tmp_path, service)
    assert callback.last_response is not None
    job = str(callback.last_response["job_id"])
    assert verdict(capsys).endswith(
        f"; report {callback.last_response['report_id']} posted for job {job[:8]}"
    )


def test_without_a_callback_exec_ends_with_the_fresh_compile_count_and_after_a_verdict_with_nothing(capsys):
    """exec's exit line (warmup/pod/_sitecustomize, at the first torch.compile): where the compile time went and
    Inductor's cache misses, the verdict of a run no WarmupCallback watches; after a verdict it is not printed."""
    timings.exit_line()
    line = capsys.readouterr().err.strip()
    assert re.fullmatch(
        r"trl-warmup: trace [\d.]+ s, backend [\d.]+ s, cache load [\d.]+ s(, first step [\d.]+ s)?; "
        r"\d+ fresh compile\(s\) \(Inductor cache misses\)",
        line,
    ), line
    timings.verdict_said()
    timings.exit_line()
    assert capsys.readouterr().err == ""
