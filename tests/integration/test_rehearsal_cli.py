"""`warmup warm` refuses what it cannot do before compiling anything, with a one-line error."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from tests.fixtures.factories import one_signature_sft


def _warm(spec: dict, cache, tmp_path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    command = [sys.executable, "-m", "warmup", "warm", str(path), "--cache-dir", str(cache)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_cache_dir_is_required():
    done = subprocess.run(
        [sys.executable, "-m", "warmup", "warm", "job.yaml"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "--cache-dir" in done.stderr


def test_a_directory_of_another_toolchain_is_refused_before_compiling(tiny_model_dir, tmp_path):
    from warmup.toolchain.probes import current_toolchain

    cache = tmp_path / "cache"
    cache.mkdir()
    theirs = current_toolchain("inductor", "cpu").model_copy(update={"trl": "0.9.0"})
    (cache / "trl-warmup.json").write_text(
        json.dumps({"toolchain": theirs.model_dump(mode="json"), "entries": {}})
    )
    done = _warm(one_signature_sft(tiny_model_dir), cache, tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: toolchain of")
    assert "trl: '1.16.0' here vs '0.9.0' in the cache" in done.stderr
    assert sorted(p.name for p in cache.iterdir()) == ["trl-warmup.json"]  # nothing compiled or written


def test_a_job_that_compiles_nothing_is_warmed_without_compiling(tiny_model_dir, tmp_path):
    """Distillation under Inductor runs every pass outside the compiled wrapper: `warmup warm` records why each
    entry is empty instead of refusing the trainer (its rehearsal is written for compiled passes only)."""
    spec = {
        **one_signature_sft(tiny_model_dir),
        "trainer": "distillation",
        "teacher_model": str(tiny_model_dir),
        "data": {"max_prompt_tokens": 12},
    }
    spec["args"] = {
        "per_device_train_batch_size": 2,
        "max_completion_length": 8,
        "torch_compile": True,
        "bf16": False,
    }
    cache = tmp_path / "cache"
    done = _warm(spec, cache, tmp_path)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((cache / "trl-warmup.json").read_text())
    assert manifest["entries"] and all(
        entry["status"] == "ok" and not entry["files"] and "runs eager" in entry["note"]
        for entry in manifest["entries"].values()
    )
