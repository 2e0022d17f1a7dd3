"""The Inductor backend's process set-up, in a fresh interpreter (tests/unit/test_backends.py: the rest)."""

from __future__ import annotations

import subprocess
import sys


def test_inductor_configure_process_sets_configs_read_at_torch_import(tmp_path):
    # in a subprocess: it changes torch's global configs and this process's environment
    code = f"""
import torch, torch._dynamo.config as dc, torch.compiler.config as cc, os
from warmup.backends.inductor import InductorBackend
env = InductorBackend("cpu").configure_process({str(tmp_path / "c")!r}, 30)
assert cc.cache_key_tag == env["TORCH_COMPILE_CACHE_KEY_TAG"] == os.environ["TORCH_COMPILE_CACHE_KEY_TAG"]
assert dc.recompile_limit >= 30 and dc.accumulated_recompile_limit >= 16 * 30
from torch._inductor.runtime.cache_dir_utils import cache_dir
assert cache_dir() == {str((tmp_path / "c").absolute())!r}
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
