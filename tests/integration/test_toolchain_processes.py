"""The toolchain in fresh processes: the same in two of them, the ISA probe against Inductor's own, the
pod side's imports, and the image's memo found without importing torch (tests/unit/test_toolchain.py: in
process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from warmup.toolchain.probes import current_toolchain, side_by_side

TOOLCHAIN_SCRIPT = (
    "from warmup.toolchain.probes import current_toolchain; print(current_toolchain('inductor', 'cpu').key())"
)


# Inductor's own walk over the candidate ISAs (one g++ probe after another), and ours (side by side).
ISA_SCRIPTS = {
    "inductor alone": "from torch._inductor.cpu_vec_isa import pick_vec_isa; print(pick_vec_isa())",
    "side by side": "from warmup.toolchain.probes import cpu_vec_isa; print(cpu_vec_isa())",
}


def test_current_toolchain_is_the_same_in_two_fresh_processes():
    keys = {
        subprocess.run(
            [sys.executable, "-c", TOOLCHAIN_SCRIPT], capture_output=True, text=True, check=True
        ).stdout
        for _ in range(2)
    }
    assert len(keys) == 1
    key = keys.pop().strip()
    assert key == current_toolchain("inductor", "cpu").key()


def test_probing_the_isas_side_by_side_picks_what_inductor_picks_alone(tmp_path):
    """Each in a fresh process and a fresh Inductor cache, so that every probe is built with g++."""
    runs = {
        name: subprocess.Popen(
            [sys.executable, "-c", script],
            env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / name.replace(" ", "-"))},
            stdout=subprocess.PIPE,
            text=True,
        )
        for name, script in ISA_SCRIPTS.items()
    }
    picked = {name: run.communicate(timeout=300)[0].strip() for name, run in runs.items()}
    assert all(run.returncode == 0 for run in runs.values())
    assert picked["side by side"] == picked["inductor alone"] != ""


def test_side_by_side_returns_in_order_raises_and_works_at_interpreter_exit():
    assert side_by_side([lambda: 1, lambda: 2, lambda: 3]) == [1, 2, 3]
    with pytest.raises(ZeroDivisionError):
        side_by_side([lambda: 1, lambda: 1 / 0])
    # The callback's last report computes a toolchain from an atexit hook, where executors refuse work.
    at_exit = "import atexit; from warmup.toolchain.probes import side_by_side; atexit.register(lambda: print(side_by_side([lambda: 1, lambda: 2])))"
    done = subprocess.run([sys.executable, "-c", at_exit], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "[1, 2]", "")


def test_pod_side_modules_import_without_server_packages_or_torch():
    code = (
        "import sys, warmup, warmup.job.spec, warmup.toolchain.memo, warmup.artifacts, warmup.backends; "
        "print(sorted(m for m in ('torch', 'fastapi', 'sqlalchemy', 'trl') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_fresh_pod_finds_its_toolchain_in_the_images_memo_without_importing_torch(tmp_path, monkeypatch):
    """`warmup toolchain --remember` once per image; then a fresh process on this machine finds the exact
    toolchain, and one on a machine the memo has not seen (here: the machine part of the memo
    dropped) predicts the machine facts from the kernel: the same toolchain, torch never imported."""
    from warmup.toolchain.memo import remember_in_image, resolve_toolchain

    memo = tmp_path / "image" / "toolchain.json"
    monkeypatch.setenv("WARMUP_TOOLCHAIN_MEMO", str(memo))
    monkeypatch.delenv("TORCHINDUCTOR_MAX_AUTOTUNE", raising=False)
    exact = current_toolchain("inductor", "cpu")
    assert resolve_toolchain("inductor", "cpu") == (exact, "computed")  # and remembered in the image's memo
    assert resolve_toolchain("inductor", "cpu") == (exact, "exact")
    assert remember_in_image(exact) == memo  # what `warmup toolchain --remember` does
    code = (
        "import sys, json; from warmup.toolchain.memo import resolve_toolchain; "
        "toolchain, source = resolve_toolchain('inductor', 'cpu'); "
        "print(json.dumps([source, toolchain.key(), 'torch' in sys.modules]))"
    )

    def fresh_pod() -> list[object]:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        return json.loads(done.stdout)

    assert fresh_pod() == ["exact", exact.key(), False]
    data = json.loads(memo.read_text())
    data["exact"] = {}  # a machine the image's memo has not seen
    memo.write_text(json.dumps(data))
    assert fresh_pod() == ["predicted", exact.key(), False]
    # Another install (here: a compile-relevant variable) is not the image's: computed, then remembered.
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE", "1")
    assert resolve_toolchain("inductor", "cpu")[1] == "computed"
    assert resolve_toolchain("inductor", "cpu")[1] == "exact"


def test_a_compiler_that_cannot_say_gives_no_target(monkeypatch):
    """The compiler is asked as a process (moved from the unit tier, which starts none)."""
    from warmup.machine import native_target

    monkeypatch.setenv("CXX", "/nonexistent/g++")
    assert native_target() is None
