"""The command line's exit codes and messages, in this process: `warmup.cli.main` against the API served
from a thread (SQLite, a local store, no worker). The fast loop's cover for what the subprocess tests in
tests/integration prove again end to end (test_submit_cli.py, test_pull_cli.py).

Exit codes: 0 done, 2 bad input, 3 a failed signature / not warmed / refused, 4 timed out.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import warmup
from tests.fixtures.factories import one_signature_sft
from tests.support.live_server import serve
from tests.support.tiny_model import write_tiny_model
from warmup.api.services import Services
from warmup.cli import build_parser, main
from warmup.settings import Settings


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Services]]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("service"), auth="off")
    services = Services.start(settings)
    with serve(services) as url:
        yield url, services
    services.close()


def spec_file(directory: Path, model: Path, **overrides: object) -> Path:
    spec = one_signature_sft(model)
    spec.update(overrides)
    path = directory / "job.json"
    path.write_text(json.dumps(spec))
    return path


def last_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_a_misspelt_field_exits_2_with_one_line_naming_it(service, model_dir, tmp_path, capsys):
    url, _ = service
    spec = spec_file(tmp_path, model_dir, args={"max_lenght": 5})
    assert main(["submit", str(spec), "--server", url]) == 2
    assert last_error_line(capsys).startswith("error: invalid spec: args.max_lenght")


def test_an_unknown_option_exits_2_with_the_commands_usage_and_the_option_meant(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["pull", "job.yaml", "--cache_dir", "/c"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: warmup pull ")
    assert err.strip().endswith(
        "warmup pull: error: unrecognized arguments: --cache_dir /c (did you mean --cache-dir?)"
    )


def test_an_unknown_trainer_exits_2_and_lists_the_trainers(model_dir, tmp_path, capsys):
    spec = spec_file(tmp_path, model_dir, trainer="orpo")
    assert main(["plan", str(spec)]) == 2
    error = capsys.readouterr().err
    assert "orpo" in error and "sft" in error and "grpo" in error


def test_a_former_trl_trainer_is_named_as_one_not_taken_for_a_misspelling(model_dir, tmp_path, capsys):
    spec = spec_file(tmp_path, model_dir, trainer="ppo")
    assert main(["plan", str(spec)]) == 2
    error = capsys.readouterr().err
    assert "PPO is a trainer of earlier TRL versions that TRL 1.x removed" in error
    assert "did you mean" not in error and "sft, dpo, kto, reward, grpo, rloo, distillation" in error
    assert main(["plan", str(spec_file(tmp_path, model_dir, trainer="dop"))]) == 2
    assert "did you mean 'dpo'?" in capsys.readouterr().err  # a misspelling still gets its fix


def test_no_worker_times_out_with_exit_4_then_the_same_job_is_found_again(
    service, model_dir, tmp_path, capsys
):
    url, _ = service
    spec = spec_file(tmp_path, model_dir)
    assert main(["submit", str(spec), "--server", url, "--wait", "--timeout", "1"]) == 4
    assert "timed out after 1s: 0/1 ready, 0 running, 1 queued, 0 failed" in capsys.readouterr().err
    assert main(["submit", str(spec), "--server", url]) == 0
    job_id = capsys.readouterr().out.strip()
    assert httpx.get(f"{url}/v1/warmups/{job_id}").json()["state"] == "queued"


def test_a_failed_signature_exits_3_and_names_it(service, model_dir, tmp_path, capsys):
    url, services = service
    spec = spec_file(tmp_path, model_dir, args={**one_signature_sft(model_dir)["args"], "max_length": 96})
    assert main(["submit", str(spec), "--server", url]) == 0
    job = httpx.get(f"{url}/v1/warmups/{capsys.readouterr().out.strip()}").json()
    task = services.queue.claim("test-worker", job["toolchain_key"], lease_s=60)
    assert task is not None
    services.queue.fail(task.id, "test-worker", "RuntimeError: the compiler crashed", retry=False)
    assert main(["submit", str(spec), "--server", url, "--wait", "--timeout", "30"]) == 3
    error = capsys.readouterr().err
    assert "failed" in error and "the compiler crashed" in error
    assert main(["pull", str(spec), "--server", url, "--dest", str(tmp_path / "cache")]) == 3
    error = last_error_line(capsys)
    assert f"of this spec failed (job {job['id'][:8]}): " in error and job["id"] not in error, error


def test_pull_of_a_job_nobody_warmed_exits_3_and_says_what_to_do(service, model_dir, tmp_path, capsys):
    url, _ = service
    spec = spec_file(tmp_path, model_dir, args={**one_signature_sft(model_dir)["args"], "max_length": 160})
    dest = tmp_path / "cache"
    assert main(["pull", str(spec), "--server", url, "--dest", str(dest)]) == 3
    assert "warmup submit" in capsys.readouterr().err
    assert not dest.exists() or not any(dest.iterdir())  # nothing installed


def test_exec_without_a_service_or_a_bucket_wants_a_directory_warm_filled(model_dir, tmp_path, capsys):
    spec = spec_file(tmp_path, model_dir)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["exec", str(spec), "--dest", str(empty), "--", "true"]) == 1
    assert "or a --dest that `warmup warm` filled" in last_error_line(capsys)
    other = tmp_path / "other"  # warmed, but for another job: nothing of it serves this one
    other.mkdir()
    (other / "trl-warmup.json").write_text(json.dumps({"spec_key": "0" * 64, "toolchain": {}, "entries": {}}))
    assert main(["exec", str(spec), "--dest", str(other), "--", "true"]) == 3
    assert "was warmed for another job" in last_error_line(capsys)


def _commands(
    parser: argparse.ArgumentParser, path: str = "warmup"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                yield from _commands(command, f"{path} {name}")


def test_every_option_of_every_command_has_help():
    commands = dict(_commands(build_parser()))
    assert {"warmup plan", "warmup exec", "warmup coverage", "warmup token create", "warmup serve"} <= set(
        commands
    )
    without = [
        f"{path} {'/'.join(action.option_strings) or action.dest}"
        for path, parser in commands.items()
        for action in parser._actions
        if not action.help  # argparse.SUPPRESS (hidden on purpose) is a help
    ]
    assert without == []


def test_version_prints_the_version_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"warmup {warmup.__version__}"


def test_the_commands_that_read_a_job_keep_transformers_advice_off_the_screen(
    model_dir, tmp_path, monkeypatch
):
    """transformers reads its verbosity as it is first imported, so this process (transformers imported long
    ago) cannot show the effect: tests/integration/test_cli_output.py does, in a fresh process. Here: the
    variable is set for the command, the user's own choice is kept, and exec would leave it out."""
    from warmup.cli import quiet

    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    monkeypatch.setattr(quiet, "_QUIETED", [])
    assert main(["plan", str(spec_file(tmp_path, model_dir))]) == 0
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "error" and quiet.quieted() == ["TRANSFORMERS_VERBOSITY"]
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")
    monkeypatch.setattr(quiet, "_QUIETED", [])
    assert main(["plan", str(spec_file(tmp_path, model_dir))]) == 0
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "info" and quiet.quieted() == []


def trl_config(directory: Path, model: Path, **fields: object) -> Path:
    """A `trl sft --config` file without pad_to_multiple_of: one signature per length, a long plan."""
    config = {"model_name_or_path": str(model), "per_device_train_batch_size": 2, "max_length": 64}
    config.update(fields)
    path = directory / "sft.yaml"
    path.write_text(json.dumps(config))
    return path


def test_plan_puts_its_summary_and_warnings_before_a_capped_table(model_dir, tmp_path, capsys):
    config = trl_config(tmp_path, model_dir, torch_compile=True, use_cpu=True)
    assert main(["plan", str(config), "--trainer", "sft"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("64 signature(s) for inductor on cpu (the config says use_cpu: true); ")
    assert "estimated compile time ~" in lines[0]
    assert lines[1].startswith("data facts: none, so every length up to the config's limit is listed")
    assert out.index("warnings:") < out.index("  #  phase")  # the warnings before the rows
    assert "64 lengths from 1 to 64" in out  # the range the table shows
    table = out[out.index("  #  phase") :].splitlines()
    assert table[1].split()[:4] == ["1", "train", "2", "1"] and table[-2].split()[:4] == [
        "64",
        "train",
        "2",
        "64",
    ]
    assert len(table) == 1 + 20 + 1 + 1  # header, 20 rows, the gap, the line saying how to see the rest
    assert table[-1] == "(44 more signature(s) not shown: --all lists every one)"

    assert main(["plan", str(config), "--trainer", "sft", "--all"]) == 0
    every = capsys.readouterr().out
    assert len(every[every.index("#  phase") :].splitlines()) == 65 and "not shown" not in every


def test_plan_json_carries_the_target_the_data_facts_and_the_estimate(model_dir, tmp_path, capsys):
    spec = spec_file(tmp_path, model_dir)
    assert main(["plan", str(spec), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert len(document["signatures"]) == 1
    assert document["target"] == {
        "backend": "inductor",
        "device": "cpu",
        "world_size": 1,
        "neuron_rt_visible_cores": None,
    }
    assert document["data"] == {"min_tokens": 10, "max_tokens": 32}
    estimate = document["estimated_compile_seconds"]
    assert set(estimate) == {"neuron", "inductor"} and estimate["inductor"] > 0
    assert main(["plan", str(spec)]) == 0
    assert (
        capsys.readouterr().out.splitlines()[1]
        == "data facts (from the spec's data): max_tokens 32, min_tokens 10"
    )


def test_the_target_is_the_configs_cpu_when_it_says_use_cpu_else_neuron_named_as_the_default(
    model_dir, tmp_path, capsys
):
    cpu = trl_config(tmp_path, model_dir, use_cpu=True, pad_to_multiple_of=32)
    assert main(["plan", str(cpu), "--trainer", "sft", "--format", "json"]) == 0
    target = json.loads(capsys.readouterr().out)["target"]
    assert (target["backend"], target["device"]) == ("inductor", "cpu")
    assert main(["plan", str(cpu), "--trainer", "sft", "--target", "cuda"]) == 0  # the command line decides
    assert capsys.readouterr().out.startswith("2 signature(s) for inductor on cuda (from the command line)")

    default = trl_config(tmp_path, model_dir, pad_to_multiple_of=32)
    assert main(["plan", str(default), "--trainer", "sft"]) == 0
    assert capsys.readouterr().out.startswith(
        "2 signature(s) for neuron on neuron (the default: --target cuda or --target cpu for a job that trains on "
        "GPUs or CPUs)"
    )
    (action,) = [
        a for a in build_parser()._subparsers._group_actions[0].choices["plan"]._actions if a.dest == "target"
    ]
    assert "else neuron" in action.help and "use_cpu: true" in action.help


def test_a_neuron_target_without_the_sdk_says_it_is_the_default_and_how_to_change_it(capsys):
    assert main(["toolchain", "--backend", "neuron"]) == 1  # this machine has no torch-neuronx
    error = last_error_line(capsys)
    assert "the target backend is neuron but torch-neuronx is not installed here" in error
    assert "--target cuda or --target cpu" in error and "Neuron is the default target unless" in error


def test_coverage_takes_the_short_id_submit_shows(service, model_dir, tmp_path, capsys):
    url, _ = service
    # a batch size no other test's job has: its one signature is queued, not failed by another test
    args = {**one_signature_sft(model_dir)["args"], "per_device_train_batch_size": 3}
    assert main(["submit", str(spec_file(tmp_path, model_dir, args=args)), "--server", url]) == 0
    captured = capsys.readouterr()
    job_id = captured.out.strip()  # the full id on stdout, for scripts
    assert captured.err.startswith(f"job {job_id[:8]}: ")  # the short one where a person reads it
    assert main(["coverage", job_id[:8], "--server", url]) == 0
    assert capsys.readouterr().out.strip() == f"0 report(s) for job {job_id[:8]} (queued)"  # no empty table
    assert main(["coverage", "ffffffff", "--server", url]) == 1
    assert "no warm-up job with id ffffffff" in last_error_line(capsys)


def test_token_list_shows_short_ids_and_revoke_takes_one(tmp_path, capsys):
    data = ["--data-dir", str(tmp_path / "service")]
    assert main(["token", "create", "--scope", "read", "--name", "dashboard", *data]) == 0
    created = capsys.readouterr().err.split()[2]  # "created token ID (...)"
    assert main(["token", "list", *data]) == 0
    (row,) = capsys.readouterr().out.splitlines()
    assert row.split()[:3] == [created[:8], "dashboard", "read"]
    assert main(["token", "revoke", "xyz", *data]) == 1
    assert "is not a token id" in last_error_line(capsys)
    assert main(["token", "revoke", created[:8], *data]) == 0
    assert capsys.readouterr().err.strip() == f"revoked {created}"
    assert main(["token", "list", *data]) == 0
    assert capsys.readouterr().out.split()[-2] == "revoked"
