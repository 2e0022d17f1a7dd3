"""warmup.activate: what a training process gets, and the clear errors before anything is set."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

import warmup
from warmup.errors import NotWarmedError, ToolchainMismatchError


@pytest.fixture
def spec_file(tiny_model_dir, tmp_path):
    spec = {
        "trainer": "sft",
        "model": str(tiny_model_dir),
        "args": {
            "per_device_train_batch_size": 2,
            "max_length": 64,
            "pad_to_multiple_of": 32,
            "torch_compile": True,
        },
        "data": {"min_tokens": 10, "max_tokens": 64},
        "target": {"backend": "inductor", "device": "cpu"},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.process
def test_import_warmup_stays_light():
    code = "import sys, warmup; print('torch' in sys.modules, 'warmup.activation' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_a_missing_cache_dir_is_not_warmed(spec_file, tmp_path):
    with pytest.raises(NotWarmedError, match="warmup warm"):
        warmup.activate(spec_file, cache_dir=tmp_path / "nothing-here")


def test_a_cache_warmed_under_another_toolchain_is_refused_by_field(spec_file, tmp_path):
    from warmup.toolchain import current_toolchain

    theirs = current_toolchain("inductor", "cpu").model_copy(update={"torch": "2.14.1", "num_threads": 64})
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "trl-warmup.json").write_text(json.dumps({"toolchain": theirs.model_dump(mode="json")}))
    with pytest.raises(ToolchainMismatchError) as raised:
        warmup.activate(spec_file, cache_dir=cache)
    assert set(raised.value.differences) == {"torch", "num_threads"}


@pytest.mark.process
def test_activate_sets_environment_policy_and_limits(spec_file, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    code = f"""
import os, json, warmup, torch._dynamo.config as dc, torch.compiler.config as cc
activation = warmup.activate({str(spec_file)!r}, cache_dir={str(cache)!r})
print(json.dumps({{
    "plan_size": activation.plan_size,
    "limit": dc.recompile_limit,
    "tag": cc.cache_key_tag,
    "dir": os.environ["TORCHINDUCTOR_CACHE_DIR"],
    "dynamic": os.environ["ACCELERATE_DYNAMO_USE_DYNAMIC"],
    "fresh": activation.fresh_compiles().total,
}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts["plan_size"] == 2  # train 2x32 and 2x64
    assert facts["limit"] >= 8 and facts["tag"].startswith("trl-warmup;isa=")
    assert facts["dir"] == str(cache) and facts["dynamic"] == "False" and facts["fresh"] == 0
