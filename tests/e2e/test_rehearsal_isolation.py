"""A crash or a hang in one rehearsal run never takes the others down, and never publishes files."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.jobs import signature, write_spec
from warmup.job.spec import load_spec
from warmup.rehearsal.runner import rehearse


@pytest.fixture
def sft_spec(tiny_model_dir, tmp_path):
    path = write_spec(
        tmp_path / "sft.yaml",
        "sft",
        tiny_model_dir,
        {"per_device_train_batch_size": 2, "max_length": 64, "pad_to_multiple_of": 32},
        {"min_tokens": 20, "max_tokens": 64},
    )
    return load_spec(path)


def test_a_failing_signature_is_reported_and_the_others_still_warm(sft_spec, tiny_model_dir, tmp_path):
    impossible = signature(
        "sft", tiny_model_dir, "train", 2, 48
    )  # not a multiple of 32: TRL never pads to it
    good = signature("sft", tiny_model_dir, "train", 2, 32)
    events = []
    failed, ok = rehearse(sft_spec, [impossible, good], tmp_path / "work", on_progress=events.append)
    assert failed.status == "failed" and not failed.files and failed.cache_dir is None
    assert "never produces" in failed.note and "RehearsalError" in failed.log_tail
    assert ok.status == "ok" and ok.files and ok.compile_seconds > 0
    assert any(f.path.endswith(".so") for f in ok.files)
    assert all((ok.cache_dir / f.path).is_file() for f in ok.files)
    # both went into one run first; it failed, so each ran again alone: the good one still warmed
    assert [e.event for e in events].count("finished") == 2
    assert events[-1].units_done == events[-1].units_total == 2
    assert "warmed in one run" not in ok.note and ok.shared_with == []


def test_a_run_past_its_time_limit_is_killed_and_reported(sft_spec, tiny_model_dir, tmp_path):
    slow = signature("sft", tiny_model_dir, "train", 2, 64)
    start = time.monotonic()
    (result,) = rehearse(sft_spec, [slow], tmp_path / "work", timeout_s=3)
    assert result.status == "timed_out" and not result.files
    assert "time limit" in result.note
    assert time.monotonic() - start < 60  # killed, not waited for


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(proc.name))
        except OSError:  # gone meanwhile
            continue
    return pids


def test_killing_the_requester_stops_the_rehearsal_and_its_compiles(sft_spec, tiny_model_dir, tmp_path):
    """A worker killed with SIGKILL cannot stop its rehearsal: the rehearsal notices and stops itself."""
    work = tmp_path / "work"
    job_file = str(work / "rehearsal-job.json")
    script = (
        "import sys\n"
        "from warmup.rehearsal.runner import rehearse\n"
        "from warmup.job.spec import load_spec\n"
        "from tests.support.jobs import signature\n"
        f"spec = load_spec({str(tmp_path / 'sft.yaml')!r})\n"
        f"rehearse(spec, [signature('sft', {str(tiny_model_dir)!r}, 'train', 2, 64)], {str(work)!r})\n"
    )
    requester = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 120
        while len(_processes_mentioning(job_file)) < 2:  # the supervisor and its forked compile run
            assert requester.poll() is None, "the rehearsal ended before the test could kill it"
            assert time.monotonic() < deadline, "the compile run never started"
            time.sleep(0.2)
        requester.send_signal(signal.SIGKILL)
        requester.wait()
        deadline = time.monotonic() + 15
        while (left := _processes_mentioning(job_file)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], f"rehearsal processes outlived their requester: {left}"
    finally:
        requester.kill()
        for pid in _processes_mentioning(job_file):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
