"""`warmup doctor`: an environment's versions against the declared ranges and the tested stacks, and the features
off there (the stacks' record: warmup/data/stacks.json, rendered by docs/compatibility.md)."""

from __future__ import annotations

import json
from pathlib import Path

from warmup.cli import doctor, main

ROOT = Path(__file__).resolve().parents[2]


def test_this_environment_is_in_range_and_the_report_lists_its_features_and_cuda(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    torch_line = next(line for line in out.splitlines() if line.strip().startswith("torch "))
    assert " in range " in torch_line, torch_line
    assert "plan" in out and "trace skip" in out and "CUDA: unrun" in out


def test_a_version_out_of_range_is_named_and_fails(capsys, monkeypatch):
    monkeypatch.setattr(doctor, "declared_ranges", lambda: {"torch": ">=2.0,<2.1"})
    assert main(["doctor", "--json"]) == 1
    captured = capsys.readouterr()
    found = {item["name"]: item for item in json.loads(captured.out)["versions"]}
    assert found["torch"]["in_range"] is False and found["trl"]["in_range"] is None
    assert "out of the supported ranges: torch" in captured.err


def test_a_feature_whose_package_is_missing_is_off_with_the_reason(monkeypatch):
    real = doctor._installed
    monkeypatch.setattr(doctor, "_installed", lambda name: None if name == "deepspeed" else real(name))
    off = doctor.features()
    assert off["sharded jobs: DeepSpeed ZeRO"] == "deepspeed not installed (the `deepspeed` extra)"
    monkeypatch.setattr(doctor, "_installed", lambda name: None if name == "trl" else real(name))
    off = doctor.features()
    assert off["plan"] == off["trace skip"] == "trl not installed (the `trl` extra)"
    assert off["pull, exec, the manifest checks"] is None


def test_the_locked_stacks_record_is_the_lock():
    pins = dict(
        line.lower().split("==")
        for line in (ROOT / "constraints" / "locked.txt").read_text().splitlines()
        if "==" in line
    )
    locked = doctor.tested_stacks()["stacks"]["locked"]["versions"]
    assert {name: version for name, version in locked.items() if name != "python"} == {
        name: pins[name] for name in locked if name != "python"
    }


def test_the_declared_ranges_hold_the_tested_stacks():
    """Every stack CI records is inside the ranges the extras declare (pyproject.toml)."""
    import tomllib

    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    ranges = {
        (requirement := Requirement(text)).name: requirement.specifier
        for text in extras["trl"] + extras["deepspeed"]
        if Requirement(text).specifier
    }
    for name, stack in doctor.tested_stacks()["stacks"].items():
        for package, version in stack["versions"].items():
            if package in ranges:
                assert ranges[package].contains(version), (name, package, version, ranges[package])


def test_an_environment_that_is_a_tested_stack_gets_that_stacks_last_run():
    stacks = {
        "stacks": {
            "newest": {
                "versions": {
                    "torch": "2.14.1",
                    "transformers": "5.25.0",
                    "accelerate": "1.16.0",
                    "trl": "1.16.0",
                    "peft": "0.21.2",
                },
                "command": "make test-newest",
                "recorded": "2026-12-04",
                "features": {"plan": {"passed": 3, "failed": 0}, "zero compiles": {"passed": 4, "failed": 1}},
            }
        }
    }
    installed = {
        "torch": "2.14.1",
        "transformers": "5.25.0",
        "accelerate": "1.16.0",
        "trl": "1.16.0",
        "peft": "0.21.2",
    }
    found = [doctor.Finding(n, v, "", True, ["newest"] if v else []) for n, v in installed.items()]
    assert doctor.this_stacks_runs(found, stacks) == {
        "newest": "`make test-newest` of 2026-12-04: plan 3/3 passed, zero compiles 4/5 passed"
    }
    found[0] = doctor.Finding("torch", "2.15.0", "", True, [])  # another torch: not that stack
    assert doctor.this_stacks_runs(found, stacks) == {}
    found[0] = doctor.Finding("torch", "2.14.1", "", True, ["newest"])
    found[-1] = doctor.Finding("peft", None, "", None, [])  # no peft: not that stack either
    assert doctor.this_stacks_runs(found, stacks) == {}


def test_the_doctor_lists_checkpointed_hub_kernels_as_on_only_where_kernels_is_installed():
    import importlib.util

    off = doctor.features()
    line = "... under gradient checkpointing"
    if importlib.util.find_spec("kernels") is None:  # the locked stack: transformers 5.24 brings no kernels
        assert line not in off
    else:  # the newest stack (transformers 5.25, kernels 0.19, torch 2.14): on (the split traces it once)
        assert off[line] is None
