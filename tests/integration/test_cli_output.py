"""What a person reads from the command line, in a fresh process as they run it: the version, and no library
noise. transformers reads its verbosity once, as it is first imported, so only a fresh process shows what
`warmup.cli.quiet_libraries` keeps off the screen (tests/unit/test_cli_in_process.py checks the rest in
process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import warmup
from tests.support.tiny_model import write_tiny_model

# What transformers logs when a config with torch_compile is read on a machine without an Ampere GPU.
ADVICE = "The speedups for torchdynamo mostly come with GPU Ampere or higher"


def warmup_command(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "warmup", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def test_version():
    done = warmup_command("--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"warmup {warmup.__version__}")


def test_plan_prints_no_library_advice_unless_the_user_asks_for_it(tmp_path):
    model = write_tiny_model(tmp_path / "model")
    config = tmp_path / "sft.yaml"
    fields = {
        "model_name_or_path": str(model),
        "max_length": 64,
        "pad_to_multiple_of": 32,
        "torch_compile": True,
    }
    config.write_text(json.dumps({**fields, "use_cpu": True}))
    environment = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_VERBOSITY"}
    quiet = subprocess.run(
        [sys.executable, "-m", "warmup", "plan", str(config), "--trainer", "sft"],
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
    )
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == "" and quiet.stdout.startswith("2 signature(s) for inductor on cpu")
    asked = warmup_command("plan", config, "--trainer", "sft", env={"TRANSFORMERS_VERBOSITY": "warning"})
    assert asked.returncode == 0 and ADVICE in asked.stderr  # the user's own choice is kept
