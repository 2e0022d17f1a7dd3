"""warmup.activate in a fresh interpreter: `import warmup` stays light, and what a training process gets
(tests/unit/test_rehearsal_activate.py: the errors raised before anything is set)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.fixtures import factories


@pytest.fixture
def spec_file(tiny_model_dir, tmp_path):
    return factories.write_activation_spec(tmp_path / "job.yaml", tiny_model_dir)


def test_import_warmup_stays_light():
    code = "import sys, warmup; print('torch' in sys.modules, 'warmup.pod.activation' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


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
