"""How `warmup exec` and `warmup pull` parse their commands, and the client's answers from the service
(what the pod side imports, and the sitecustomize, in fresh interpreters: tests/integration/test_client_cli_processes.py)."""

from __future__ import annotations

from email.message import Message

import pytest

from warmup.cli import build_parser
from warmup.client import service as client_service


@pytest.mark.parametrize(
    ("argv", "options", "command"),
    [
        (
            [
                "exec",
                "s.yaml",
                "--server",
                "http://w",
                "--dest",
                "/c",
                "--",
                "torchrun",
                "--nproc_per_node=4",
                "t.py",
            ],
            {"server": "http://w", "dest": "/c"},
            ["torchrun", "--nproc_per_node=4", "t.py"],
        ),
        (
            ["exec", "--dest", "/c", "s.yaml", "--world-size", "2", "--wait", "--", "python", "-c", "x"],
            {"dest": "/c", "world_size": 2, "wait": True},
            ["python", "-c", "x"],
        ),
        (
            ["exec", "s.yaml", "--from", "s3://b/p", "--dest", "/c", "--", "python", "--", "--dest", "y"],
            {"source": "s3://b/p", "dest": "/c"},
            ["python", "--", "--dest", "y"],
        ),
        (["exec", "--dest", "/c", "s.yaml", "train.sh", "-x"], {"dest": "/c"}, ["train.sh", "-x"]),
        # the name `warmup warm` gives the same directory
        (["exec", "s.yaml", "--cache-dir", "/c", "--", "train.sh"], {"dest": "/c"}, ["train.sh"]),
    ],
)
def test_exec_splits_its_options_from_the_command(argv, options, command):
    ns = build_parser().parse_args(argv)
    assert ns.argv == command and ns.spec == "s.yaml"
    assert {name: getattr(ns, name) for name in options} == options


def test_pull_takes_the_cache_directory_by_the_name_warm_gives_it_too():
    assert build_parser().parse_args(["pull", "s.yaml", "--cache-dir", "/c"]).dest == "/c"
    assert build_parser().parse_args(["pull", "s.yaml", "--dest", "/c"]).dest == "/c"


def test_exec_wants_the_command_after_a_double_dash(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["exec", "s.yaml", "--dest", "/c", "torchrun"])
    assert "put the command after `--`" in capsys.readouterr().err


def test_the_client_waits_as_long_as_a_503_retry_after_says(monkeypatch):
    """During a database restart the API answers 503 with Retry-After: the client waits that long
    (not its own shorter backoff), then gets through."""

    def answer(status: int, body: bytes, **headers: str) -> client_service.Answer:
        message = Message()
        for name, value in headers.items():
            message[name.replace("_", "-")] = value
        return client_service.Answer(status, message, body)

    busy = answer(503, b'{"error": "database_unavailable"}', Retry_After="5")
    answers = iter([busy, busy, answer(200, b'{"status": "ok"}')])
    waits: list[float] = []
    monkeypatch.setattr(client_service.time, "sleep", waits.append)
    monkeypatch.setattr(client_service, "fetch_answer", lambda *_: next(answers))
    service = client_service.ServiceClient("http://warmup")
    assert service.request("GET", "/v1/jobs") == {"status": "ok"}
    assert waits == [5.0, 10.0]  # Retry-After, then doubled backoff from there


def test_submit_wait_names_the_missing_scope_when_the_service_refuses_to_show_the_job():
    """A service older than submit tokens reading their own jobs answers the progress poll with 403:
    `warmup submit --wait` says the job was submitted and which scope the token lacks."""
    from warmup.cli.submit import _poll
    from warmup.errors import AuthError

    class Refusing:
        def job(self, job_id: str) -> dict[str, object]:
            raise AuthError("this token lacks the 'read' scope (it has: submit)", status=403)

    with pytest.raises(AuthError, match=r"job j-1 was submitted.*'read' scope as well") as raised:
        _poll(Refusing(), "j-1")
    assert raised.value.status == 403


def test_submit_wait_counts_down_while_a_signature_compiles():
    """The estimate takes off how long a running signature has run, so it does not stand still; one that runs
    past the average says so rather than counting below zero."""
    from collections import Counter

    from warmup.cli.submit import _remaining

    def job(*states: str) -> dict[str, object]:
        signatures = [
            {"key": f"s{i}", "state": state, "compile_seconds": 40.0 if state == "ready" else None}
            for i, state in enumerate(states)
        ]
        return {"signatures": signatures, "counts": dict(Counter(states))}

    assert _remaining(job("queued", "running"), {}, now=0.0) == ""  # nothing done yet: no average
    since: dict[str, float] = {}
    assert _remaining(job("ready", "running", "queued"), since, now=100.0) == " | ~1m 20s left"  # 40 + 40
    assert _remaining(job("ready", "running", "queued"), since, now=130.0) == " | ~50s left"  # 10 + 40
    assert _remaining(job("ready", "running", "queued"), since, now=150.0) == " | ~40s left"  # 0 + 40
    assert _remaining(job("ready", "ready", "running"), since, now=160.0) == " | ~40s left"  # s2 is new
    assert _remaining(job("ready", "ready", "running"), since, now=210.0) == " | running past the 40s average"
    assert set(since) == {"s2"}  # what stopped running is forgotten
    two_workers = job("ready", "running", "running", "queued", "queued")
    assert _remaining(two_workers, {}, now=0.0) == " | ~1m 20s left"  # four times 40 s, over two workers
