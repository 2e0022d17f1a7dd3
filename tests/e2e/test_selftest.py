"""`warmup selftest --backend inductor --device cpu` passes on this machine, as a user runs it.

The command warms a tiny DPO job (phases train and ref) and a tiny GRPO job (phase generation), then
trains each in a fresh process over its cache; its verdict table is what is checked here.
"""

from __future__ import annotations

import re
import sys

from tests.support.jobs import run


def test_selftest_passes_with_zero_fresh_compiles_on_inductor_cpu(tmp_path):
    work = tmp_path / "work"
    command = [sys.executable, "-m", "warmup", "selftest", "--backend", "inductor", "--device", "cpu"]
    done = run([*command, "--work-dir", work], timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr[-6000:]
    lines = done.stdout.splitlines()
    header = re.split(r"\s{2,}", lines[0])
    assert header == [
        "phase",
        "job",
        "signatures",
        "met",
        "fresh compiles",
        "warm",
        "train",
        "trace",
        "verdict",
    ]
    rows = {
        cells[0]: dict(zip(header, cells, strict=True))
        for cells in (re.split(r"\s{2,}", line) for line in lines[1:4])
    }
    assert rows["train"]["job"] == rows["ref"]["job"] == "dpo" and rows["generation"]["job"] == "grpo"
    for phase in ("train", "ref"):
        assert rows[phase]["verdict"] == "pass" and rows[phase]["fresh compiles"] == "0"
        assert rows[phase]["met"] == "1/1"
    assert rows["train"]["signatures"] == "train 4x32" and rows["ref"]["signatures"] == "ref 4x32"
    # Dynamo's trace time in each warmed training process (what the caches cannot spare)
    assert all(re.fullmatch(r"\d+\.\d s", rows[phase]["trace"]) for phase in ("train", "ref", "generation"))
    # generation runs eager under Inductor: said so, never called a pass, and nothing compiled
    assert rows["generation"]["verdict"] == "nothing to compile"
    assert rows["generation"]["fresh compiles"] == "0" and rows["generation"]["met"] == "2/2"
    assert "generate_prefill 2x16 cache 24" in rows["generation"]["signatures"]
    assert re.search(r"selftest passed in .*: inductor/cpu ", done.stdout)
    assert "ref: pass" in done.stderr and "generation: nothing to compile" in done.stderr
    assert not work.exists()  # a passing run leaves nothing behind
