"""The pod's base install (`pip install trl-warmup`: pull, exec, the manifest checks) on the other Pythons training
images run: a fresh venv of Python 3.12 and of 3.13 with the wheel and its three dependencies from the package
index, no ML stack. A Python that is not on this machine is skipped, naming where it was looked for; CI runs where
pyenv has both (docs/compatibility.md)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.installs import build_wheel

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)

# Run by the pod's interpreter: the pod side's modules, a trl config read with the shipped field lists (no TRL
# there), a manifest checked (a hostile path refused), and nothing of the ML stack or the server imported.
POD = """
import json, sys
import warmup.job.spec, warmup.toolchain.memo, warmup.client.pulling, warmup.manifest, warmup.cli.pod
from warmup.errors import UnsafeArtifactError
from warmup.manifest import parse_manifest
from warmup.job.spec import from_trl_cli_config, installed_trl_versions, shipped_trl_cli_fields, trl_cli_fields

assert installed_trl_versions() is None and trl_cli_fields() == shipped_trl_cli_fields()
spec = from_trl_cli_config(
    {"model_name_or_path": "m", "dataset_name": "d", "use_peft": True, "lora_r": 8, "max_length": 64},
    trainer="sft",
)
assert spec["peft"] == {"lora_r": 8} and "dataset_name" not in spec["args"], spec
manifest = {"spec_key": "s", "toolchain_key": "t", "toolchain": {}, "backend": "inductor", "device": "cpu",
            "plan_size": 1, "signatures": ["a"], "files": [{"path": "fx/a", "sha256": "0" * 64, "size": 1}]}
assert parse_manifest(manifest).files[0].path == "fx/a"
manifest["files"][0]["path"] = "../outside"
try:
    parse_manifest(manifest)
except UnsafeArtifactError as error:
    assert "refusing manifest" in str(error)
else:
    raise AssertionError("a path out of the cache dir was accepted")
print(json.dumps(sorted(sys.modules)))
"""


def interpreter(version: str) -> str | None:
    """Python `version` (3.12): pyenv's newest 3.12.x, else python3.12 on PATH when it runs (a pyenv shim of a
    version not selected does not)."""
    root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    found = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"))
    if found:
        return found[-1]
    on_path = shutil.which(f"python{version}")
    if on_path and subprocess.run([on_path, "-c", ""], capture_output=True, timeout=60).returncode == 0:
        return on_path
    return None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"), ROOT)


@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_the_base_install_pulls_and_checks_on_python(version: str, wheel: Path, tmp_path: Path) -> None:
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no Python {version} here (looked for python{version} on PATH and in pyenv's versions)")
    venv = tmp_path / "pod"
    # The pod's own environment: nothing of this checkout on its path (PYTHONPATH would show pip this
    # checkout's metadata as installed, and the pod this checkout's modules).
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=240)
    done = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
        timeout=480,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    helped = subprocess.run(
        [str(venv / "bin" / "warmup"), "pull", "--help"], capture_output=True, text=True, timeout=120, env=env
    )
    assert helped.returncode == 0 and "--dest" in helped.stdout, helped.stderr[-3000:]

    ran = subprocess.run(
        [str(venv / "bin" / "python"), "-c", POD],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    top = {name.split(".")[0] for name in __import__("json").loads(ran.stdout.splitlines()[-1])}
    assert {"torch", "transformers", "trl", "fastapi", "sqlalchemy"} & top == set()
    version_line = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
    )
    assert version_line.stdout.strip() == str(tuple(map(int, version.split("."))))
