"""Rehearsal runs whose every pass compiles only on Neuron, or whose widths no cheap e2e plan reaches,
checked on this CPU without compiling: the driver builds the job's TRL trainer, runs its step, and TRL
produces exactly the unit's shapes (the driver fails the run otherwise).

The units are the ones `plan_units` makes from a plan's signatures; `torch_compile` is off, so TRL runs
eagerly and the check is of the shapes alone (what compiles them is the backend's business).
"""

from __future__ import annotations

import json
import subprocess
import sys

from warmup.job.spec import load_spec
from warmup.rehearsal.drivers import RunJob
from warmup.rehearsal.units import plan_units
from warmup.signature import Signature


def run_units(spec: dict, signatures: list[Signature], tmp_path, **facts) -> dict:
    """Plan the units of `signatures` and rehearse them in one child process; its outcome."""
    units = plan_units(spec["trainer"], signatures, backend="neuron", **facts).units
    job = RunJob(load_spec(spec), units, tmp_path / "cache", tmp_path / "work", len(signatures))
    (tmp_path / "work").mkdir(parents=True)
    (tmp_path / "job.json").write_text(job.to_json())
    command = [sys.executable, "-m", "warmup.rehearsal.child", tmp_path / "job.json", tmp_path / "out.json"]
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=600)
    outcome = json.loads((tmp_path / "out.json").read_text())
    assert outcome["status"] == "ok", (outcome, done.stderr[-4000:])
    return outcome


def sig(trainer: str, phase: str, batch: int, seq_len: int, model: str = "cafe") -> Signature:
    return Signature(
        phase=phase,
        batch=batch,
        seq_len=seq_len,
        trainer=trainer,
        model=model,
        dtype="float32",
        compile="neuron",
    )


CPU_EAGER = {"use_cpu": True, "bf16": False, "torch_compile": False}


def test_a_distillation_step_generates_and_runs_student_and_teacher_at_the_unit_width(
    tiny_model_dir, tmp_path
):
    spec = {
        "trainer": "distillation",
        "model": str(tiny_model_dir),
        "teacher_model": str(tiny_model_dir),
        "args": {
            **CPU_EAGER,
            "per_device_train_batch_size": 2,
            "max_completion_length": 8,
            "pad_to_multiple_of": 16,
        },
        "target": {"backend": "inductor", "device": "cpu"},
    }
    signatures = [sig("distillation", "train", 2, 32), sig("distillation", "teacher", 2, 32)]
    outcome = run_units(spec, signatures, tmp_path, pad_to_multiple_of=16, max_completion_length=8)
    (unit,) = outcome["units"].values()
    # student and teacher backbones, each on the (2, 16 + 16) batch; the prompts padded to 16
    assert {tuple(shape) for shape in unit["observed"]["forwards"]} == {(2, 32)}
    assert unit["observed"]["prompts"] == [16]


def test_a_kto_step_with_kl_rows_wider_than_its_main_rows(tiny_model_dir, tmp_path):
    spec = {
        "trainer": "kto",
        "model": str(tiny_model_dir),
        "args": {**CPU_EAGER, "per_device_train_batch_size": 3, "max_length": 64, "pad_to_multiple_of": 16},
        "target": {"backend": "inductor", "device": "cpu"},
    }
    signatures = [
        sig("kto", "train", 3, 32),
        sig("kto", "old_logps", 3, 48),
        sig("kto", "ref", 3, 32),
        sig("kto", "ref", 3, 48),
    ]
    outcome = run_units(spec, signatures, tmp_path, pad_to_multiple_of=16, max_length=64)
    (unit,) = outcome["units"].values()
    assert {tuple(s) for s in unit["observed"]["batches"]} == {(3, 32)}
    assert {tuple(s) for s in unit["observed"]["kl_batches"]} == {(3, 48)}
