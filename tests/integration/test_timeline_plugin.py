"""The opt-in timeline plugin (tests/support/timeline.py) records each test's CPU, children included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_each_test_gets_a_line_with_its_childrens_cpu_and_the_run_ends_with_the_summary(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "import subprocess, sys, time\n"
        "def test_burns_cpu_in_a_child():\n"
        "    subprocess.run([sys.executable, '-c', 'sum(i * i for i in range(3_000_000))'], check=True)\n"
        "def test_sleeps():\n"
        "    time.sleep(0.3)\n"
    )
    timeline = tmp_path / "timeline.jsonl"
    command = [sys.executable, "-m", "pytest", "-p", "tests.support.timeline", f"--timeline={timeline}"]
    command += ["-p", "no:cacheprovider", "-q", "test_sample.py"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["test"]: row for row in map(json.loads, timeline.read_text().splitlines())}
    burns, sleeps = rows["test_sample.py::test_burns_cpu_in_a_child"], rows["test_sample.py::test_sleeps"]
    assert burns["cpu"] > 0.1 and burns["worker"] == "main"  # the child's CPU counts
    assert sleeps["end"] - sleeps["start"] >= 0.3 and sleeps["cpu"] < sleeps["end"] - sleeps["start"]
    assert "timeline (" in done.stdout and "test_sample.py" in done.stdout
    assert "worker main: in a test" in done.stdout
