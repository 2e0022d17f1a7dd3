"""Reading a spec in a fresh interpreter: what a pod imports for it (tests/unit/test_spec.py: in process)."""

from __future__ import annotations


def test_a_trl_config_is_read_without_importing_trl(tmp_path):
    """What `warmup pull trl.yaml` does on a pod stays free of TRL, torch and transformers."""
    import subprocess
    import sys

    config = tmp_path / "grpo.yaml"
    config.write_text("model_name_or_path: m\naccelerate_config: zero2\nreward_funcs: [x]\ndataset_name: d\n")
    probe = (
        "import sys\nfrom warmup.job.spec import load_spec\n"
        f"spec = load_spec({str(config)!r}, trainer='grpo')\n"
        "print(spec.target.world_size, sorted(m for m in ('trl', 'torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["8", "[]"]  # zero2's 8 processes, read from the shipped preset counts
