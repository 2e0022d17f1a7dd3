"""`warmup selftest`'s verdicts and jobs, without compiling (the run itself: tests/e2e/test_selftest.py)."""

from __future__ import annotations

import pytest

from warmup.errors import SpecError
from warmup.job.spec import load_spec
from warmup.planner.planning import plan_spec
from warmup.selftest import (
    JOBS,
    PHASES,
    VERDICT_FAIL,
    VERDICT_NOTHING,
    VERDICT_PASS,
    job_spec,
    judge,
    run_selftest,
)

NONE = {"fxgraph_cache_miss": 0, "autograd_cache_miss": 0, "new_files": 0}


def planned(model, phase, backend="inductor", device="cpu"):
    job = next(job for job in JOBS if phase in job.phases)
    plan = plan_spec(load_spec(job_spec(job, model, backend, device)))
    return [s for s in plan.signatures if s.phase in job.phases[phase]]


def test_a_phase_passes_when_its_signatures_were_met_and_nothing_compiled(tiny_model_dir):
    signatures = planned(tiny_model_dir, "train")
    assert judge(signatures, [s.shape_label for s in signatures], NONE, "inductor")[0] == VERDICT_PASS


def test_a_fresh_compile_or_an_unmet_signature_fails_the_phase(tiny_model_dir):
    signatures = planned(tiny_model_dir, "ref")
    labels = [s.shape_label for s in signatures]
    verdict, detail = judge(signatures, labels, {**NONE, "fxgraph_cache_miss": 2}, "inductor")
    assert verdict == VERDICT_FAIL and "fxgraph_cache_miss 2" in detail
    verdict, detail = judge(signatures, [], NONE, "inductor")
    assert verdict == VERDICT_FAIL and "never met" in detail and labels[0] in detail


def test_generation_under_inductor_has_nothing_to_compile_and_is_not_called_a_pass(tiny_model_dir):
    signatures = planned(tiny_model_dir, "generation")
    assert {s.phase for s in signatures} == {"generate_prefill", "generate_decode"}
    assert all(s.compile == "eager" for s in signatures)
    labels = [s.shape_label for s in signatures]
    assert judge(signatures, labels, NONE, "inductor")[0] == VERDICT_NOTHING
    # ... unless it compiled after all, or generation was never seen
    assert judge(signatures, labels, {**NONE, "new_files": 1}, "inductor")[0] == VERDICT_FAIL
    assert judge(signatures, labels[:1], NONE, "inductor")[0] == VERDICT_FAIL


def test_on_neuron_every_phase_compiles(tiny_model_dir):
    assert PHASES == ("train", "ref", "generation")
    for phase in PHASES:
        signatures = planned(tiny_model_dir, phase, "neuron", "neuron")
        assert signatures and all(s.compile == "neuron" for s in signatures)
    for job in JOBS:
        spec = job_spec(job, tiny_model_dir, "neuron", "neuron")
        assert spec["args"]["torch_compile_backend"] == "neuron" and "use_cpu" not in spec["args"]


def test_unknown_phases_and_mismatched_backends_are_refused_before_any_work(tmp_path):
    with pytest.raises(SpecError, match="unknown phase"):
        run_selftest("inductor", "cpu", phases=("train", "decode"), work_dir=tmp_path)
    with pytest.raises(SpecError, match=r"target\.device"):
        run_selftest("neuron", "cpu", work_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_report_alone_reaches_stdout_what_libraries_print_goes_to_stderr(monkeypatch, capsys, tmp_path):
    # DeepSpeed, when installed, logs to stdout on import, which happens while the jobs run
    import warmup.selftest
    from warmup.cli import main

    def noisy_run(*args, **kwargs):
        print("[WARNING] Setting accelerator to CPU.")
        return warmup.selftest.SelftestReport("inductor", "cpu", "inductor/cpu", tmp_path, [], 1.0)

    monkeypatch.setattr(warmup.selftest, "run_selftest", noisy_run)
    main(["selftest", "--backend", "inductor", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert "Setting accelerator" in err
    assert "Setting accelerator" not in out and out.startswith("phase")
