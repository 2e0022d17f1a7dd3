"""The proof of issue 27: a cache serves every install of the same wheels, wherever it is, and no other.

The test's own environment (venv A) warms; the pod trains from venv B: a second virtual environment under
another prefix, with the same wheels installed into it by pip, offline (tests/support/installs.py repacks A's
distributions once per module). Every C++ kernel Inductor builds names the folders torch and Python are
installed in on its compiler command line, which is in the kernel's key; under trl-warmup's canonical kernel
layout (warmup/layout.py) those folders are named by their content, so B loads A's kernels instead of
building them again. B trains a real TRL SFT run under `warmup exec`, which must compile nothing: no FX graph
or AOTAutograd miss, no new file in the cache, and no run of the C++ compiler (a logging `g++` first on PATH).

Then one wheel differs: transformers at another version (C), or a torch build whose headers differ while its
version and Python files are the same (D; only the content digest of its folder can tell). Both are refused
before training, and the refusal names the field. The last test does the same through the service: a worker in
A, `warmup pull` and the training in B.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.installs import closure, new_install, repack, with_changed_file
from tests.support.jobs import run, served_warm, write_spec
from tests.support.live_server import serve
from warmup.settings import Settings

POD_TRAIN = Path(__file__).resolve().parents[1] / "support" / "pod_train.py"
OTHER_TRANSFORMERS = "5.18.0"  # TRL 1.16 accepts transformers >= 4.56.2; A has 5.24.0
CHANGED_HEADER = "torch/include/torch/csrc/inductor/cpp_prefix.h"
GXX_LOGGER = '#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}"\nexec "{real}" "$@"\n'


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """This environment's pod-side distributions (trl-warmup's `trl` extra and what it needs), as wheels."""
    names = [name for name in closure(["trl-warmup[trl]"]) if name != "trl-warmup"]
    return repack(names, tmp_path_factory.mktemp("wheelhouse"))


@pytest.fixture(scope="module")
def venv_b(wheels: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same wheels installed under another prefix: B's python."""
    return new_install(tmp_path_factory.mktemp("prefix-b") / "venv", wheels)


@pytest.fixture(scope="module")
def spec_path(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_spec(  # rows of 10..30 tokens: one signature, train 2x32
        tmp_path_factory.mktemp("spec") / "sft.yaml",
        "sft",
        tiny_model_dir,
        {"per_device_train_batch_size": 2, "max_length": 64, "pad_to_multiple_of": 32},
        {"num_train_examples": 8, "min_tokens": 10, "max_tokens": 30},
    )


@pytest.fixture(scope="module")
def warmed(spec_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The spec warmed by `warmup warm` in this environment (A)."""
    cache = tmp_path_factory.mktemp("warmed-in-a") / "cache"
    warm = run([sys.executable, "-m", "warmup", "warm", spec_path, "--cache-dir", cache])
    assert warm.returncode == 0, warm.stderr[-5000:]
    return cache


def pod_command(python: Path, spec: Path, dest: Path, weights: Path, out: Path, *source: str) -> list:
    command = [python, "-m", "warmup", "exec", spec, *source, "--dest", dest, "--strict", "--"]
    command += [python, POD_TRAIN, "--weights", weights, "--out", out]
    return [*command, "--min-tokens", 10, "--split", 20, "--max-tokens", 30, "--steps", 3]


def logging_compiler(folder: Path) -> tuple[dict[str, str], Path]:
    """An environment whose `g++` logs each command line to a file before it runs the real one."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "gxx.log"
    wrapper = folder / "g++"
    wrapper.write_text(GXX_LOGGER.format(log=log, real=shutil.which("g++")))
    wrapper.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}, log


def compiles(log: Path) -> list[str]:
    """The compiler runs of a log that built something: kernels, precompiled headers, preprocessor runs
    (not the version queries, nor Inductor's ISA probes, which exec builds before the command starts)."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [line for line in lines if (" -o " in line or " -E " in line) and "warmup-isa-probes-" not in line]


def trained_with_nothing_compiled(result: dict, gxx_log: Path) -> None:
    report = result["report"]
    assert report["fresh_compiles"] == 0, report["details"]
    assert report["details"]["new_files"] == 0 and report["details"]["fresh"] == {}, report["details"]
    assert report["missed"] == [] and len(report["met"]) == 1
    assert {tuple(shape) for shape in result["shapes"]} == {(2, 32)}
    assert served_warm(result), (result["counters"], result.get("trace_skip"))
    assert compiles(gxx_log) == []


def test_a_cache_warmed_in_one_install_trains_another_install_of_the_same_wheels_with_nothing_compiled(
    spec_path, warmed, venv_b, user_weights_dir, tmp_path
):
    shipped = tmp_path / "elsewhere" / "cache"  # where the image or volume puts it: another path too
    shutil.copytree(warmed, shipped)
    assert Path(sys.prefix).resolve() != venv_b.parent.parent.resolve()

    env, gxx_log = logging_compiler(tmp_path / "gxx")
    out = tmp_path / "b.json"
    command = pod_command(venv_b, spec_path, shipped, user_weights_dir, out)
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert "warmed by `warmup warm`" in done.stderr
    result = json.loads(out.read_text())
    assert result["cache_dir"] == str(shipped.resolve())
    trained_with_nothing_compiled(result, gxx_log)


def test_the_same_cache_is_refused_by_an_install_whose_transformers_or_torch_differs(
    spec_path, warmed, wheels, user_weights_dir, tmp_path_factory, tmp_path
):
    """One wheel changed: transformers at another version (C), torch with one header changed (D: the same
    version and Python files, so only the digest of its folder's content differs). `warmup exec` refuses
    both before training, naming the field."""
    shipped = tmp_path / "cache"
    shutil.copytree(warmed, shipped)
    downloads = tmp_path_factory.mktemp("downloads")
    fetched = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         f"transformers=={OTHER_TRANSFORMERS}", "--dest", str(downloads)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if fetched.returncode != 0:
        pytest.skip(f"pip cannot fetch transformers {OTHER_TRANSFORMERS} here: {fetched.stderr[-500:]}")
    other_transformers = [w for w in wheels if not w.name.startswith("transformers-")]
    other_transformers += list(downloads.glob("transformers-*.whl"))
    torch_wheel = next(w for w in wheels if w.name.startswith("torch-"))
    changed_torch = with_changed_file(
        torch_wheel, CHANGED_HEADER, b"\n// another build\n", tmp_path_factory.mktemp("other-torch")
    )
    other_torch = [changed_torch if w == torch_wheel else w for w in wheels]

    for name, wheel_set, field in [
        ("transformers", other_transformers, f"transformers: '{OTHER_TRANSFORMERS}' here vs"),
        ("torch", other_torch, "kernel_paths: ["),
    ]:
        python = new_install(tmp_path_factory.mktemp(f"prefix-{name}") / "venv", wheel_set)
        out = tmp_path / f"{name}.json"
        done = run(pod_command(python, spec_path, shipped, user_weights_dir, out))
        assert done.returncode == 1 and not out.exists(), f"{name}: {done.stderr[-4000:]}"
        assert "toolchain of" in done.stderr and "mismatch" in done.stderr, done.stderr[-4000:]
        assert field in done.stderr, done.stderr[-4000:]
        if name == "torch":  # the only difference: the digest that names torch's folder
            (line,) = [line for line in done.stderr.splitlines() if "mismatch" in line]
            assert "kernel_paths" in line and "torch_key" not in line and "'torch'" not in line, line


def test_through_the_service_a_worker_in_one_install_serves_a_pod_in_another(
    sqlite_url, spec_path, venv_b, user_weights_dir, tmp_path
):
    from tests.e2e.test_pull_pod import work_until_idle
    from warmup.api.services import Services

    settings = Settings(
        data_dir=tmp_path / "service", database_url=sqlite_url, store_url=str(tmp_path / "blobs"), auth="off"
    )
    services = Services.start(settings)
    try:
        with serve(services) as url:
            submitted = run([sys.executable, "-m", "warmup", "submit", spec_path, "--server", url])
            assert submitted.returncode == 0, submitted.stderr
            assert [o.status for o in work_until_idle(services, tmp_path)] == ["done"]  # the worker: venv A

            cache = tmp_path / "pod-cache"
            pulled = run([venv_b, "-m", "warmup", "pull", spec_path, "--server", url, "--dest", cache])
            assert pulled.returncode == 0 and "installed" in pulled.stderr, pulled.stderr[-4000:]
            env, gxx_log = logging_compiler(tmp_path / "gxx")
            out = tmp_path / "b.json"
            command = pod_command(venv_b, spec_path, cache, user_weights_dir, out, "--server", url)
            done = subprocess.run(
                [str(c) for c in command], capture_output=True, text=True, env=env, timeout=900
            )
    finally:
        services.close()
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    result = json.loads(out.read_text())
    trained_with_nothing_compiled(result, gxx_log)
    assert result["response"]["enqueued"] == []  # the service heard of no miss
