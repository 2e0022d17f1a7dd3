"""Experiment (not a speed target): what, in the place things are installed, a warm Inductor cache depends on.

A small model (two linear layers, GELU, a loss) is compiled for training (`torch.compile`, forward and
backward) in a fresh process, on CPU, into an empty cache directory: the reference. The directory is then
copied to another path and the same program runs again in a fresh process, each time with one thing changed:

    same           nothing but the cache directory's own path
    home           HOME and XDG_CACHE_HOME elsewhere
    tmpdir         TMPDIR elsewhere (where Inductor puts its precompiled C++ headers)
    user           another user name (USER, LOGNAME: Inductor's default directories are named after it)
    prefix         another virtual environment of the same wheels (pip-installed under another prefix)
    python         another virtual environment of the same wheels whose base Python lives under another prefix
                   (a copy of this interpreter's installation)

For each it prints Inductor's FX graph and AOTAutograd cache counters, the files that appeared in the cache
directory (by kind), the compiler runs (a logging `g++` first on PATH: kernel builds, precompiled headers,
preprocessor runs) and where the precompiled headers went. `--normalise` runs the reference as a warm-up
worker does and every variant as a training process under `warmup exec` or `warmup.activate` does: under
trl-warmup's canonical kernel layout (warmup/layout.py), and, for the training processes, without building a
precompiled header no kernel needs.

    python benchmarks/relocation_factors.py [--work DIR] [--variants same,home,tmpdir,user,prefix,python]
                                            [--normalise]

The other installs are built once in WORK (tests/support/installs.py: this environment's wheels, repacked,
installed with pip offline); `python` copies this interpreter's installation (its standard library, without
site-packages) to WORK/python.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import json, os, sys, time
if os.environ.get("RELOCATION_LAYOUT") in ("worker", "pod"):
    from warmup import layout
    layout.install()  # what a warm-up worker does
    if os.environ["RELOCATION_LAYOUT"] == "pod":
        layout.defer_precompiled_headers()  # what a training process under exec or activate does too
import torch
from torch._dynamo.utils import counters
import torch._inductor.codecache as codecache

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
compiled = torch.compile(model, dynamic=False)
x = torch.randn(16, 32)
started = time.perf_counter()
loss = compiled(x).square().mean()
loss.backward()
seconds = time.perf_counter() - started
wanted = ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass", "autograd_cache_hit",
          "autograd_cache_miss", "autograd_cache_bypass")
found = {name: counters[group][name] for group in ("inductor", "aot_autograd") for name in wanted
         if counters[group][name]}
print(json.dumps({"counters": found, "seconds": seconds, "header_dir": codecache._HEADER_DIR,
                  "torch": os.path.dirname(torch.__file__)}))
"""

GXX_LOGGER = """#!/bin/sh
printf '%s\\n' "$*" >> "{log}"
exec "{real}" "$@"
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "relocation-factors")
    parser.add_argument("--variants", default="same,home,tmpdir,user,prefix,python")
    parser.add_argument(
        "--normalise", action="store_true", help="run every process under the canonical layout"
    )
    ns = parser.parse_args()
    work = ns.work.absolute()
    work.mkdir(parents=True, exist_ok=True)
    variants = [v for v in ns.variants.split(",") if v]

    reference_env = base_env(work, ns.normalise)
    runs = work / ("runs-normalised" if ns.normalise else "runs")
    shutil.rmtree(runs, ignore_errors=True)
    reference_cache = runs / "reference" / "cache"
    reference = probe(sys.executable, reference_cache, reference_env, runs / "reference")
    print(f"reference ({'normalised' if ns.normalise else 'as torch does it'}): {describe(reference)}")
    print(
        f"{'variant':<13} {'FX hit/miss':>11} {'AOT hit/miss':>12} {'new files':<34} {'g++ runs':<40} seconds"
    )
    for variant in variants:
        python, env = sys.executable, dict(reference_env)
        if variant == "home":
            env["HOME"] = str(work / "other-home")
            env["XDG_CACHE_HOME"] = str(work / "other-home" / ".cache")
        elif variant == "tmpdir":
            (work / "other-tmp").mkdir(exist_ok=True)
            env["TMPDIR"] = str(work / "other-tmp")
        elif variant == "user":
            env["USER"] = env["LOGNAME"] = "someone-else"
        elif variant == "prefix":
            python = str(other_install(work, "venv-prefix"))
        elif variant == "python":
            python = str(other_install(work, "venv-python", base=relocated_python(work)))
        elif variant != "same":
            parser.error(f"unknown variant {variant!r}")
        if ns.normalise:
            env["RELOCATION_LAYOUT"] = "pod"
        cache = runs / variant / "cache"
        shutil.copytree(reference_cache, cache, symlinks=True)
        result = probe(python, cache, env, runs / variant)
        print(row(variant, result))
    print(f"\nkernel command line (reference): {reference['command_line']}")


def base_env(work: Path, normalise: bool) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TORCHINDUCTOR_", "TORCH_COMPILE"))
    }
    env["PYTHONPATH"] = str(ROOT)
    env["OMP_NUM_THREADS"] = "1"  # in Inductor's key: the same everywhere
    env["RELOCATION_LAYOUT"] = "worker" if normalise else "none"
    env["TMPDIR"] = str(work / "tmp")
    (work / "tmp").mkdir(exist_ok=True)
    return env


def probe(python: str, cache: Path, env: dict[str, str], folder: Path) -> dict[str, Any]:
    """Run the probe in a fresh process of `python` over `cache`; what it counted, what appeared, what g++ did."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "gxx.log"
    log.write_text("")
    wrapper = folder / "bin" / "g++"
    wrapper.parent.mkdir(exist_ok=True)
    real = shutil.which("g++", path=os.environ.get("PATH"))
    wrapper.write_text(GXX_LOGGER.format(log=log, real=real))
    wrapper.chmod(0o755)
    env = {**env, "TORCHINDUCTOR_CACHE_DIR": str(cache), "PATH": f"{wrapper.parent}:{env['PATH']}"}
    before = files(cache)
    done = subprocess.run([python, "-c", PROBE], env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"probe failed under {python}:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    header_dir = Path(result["header_dir"])
    result["new_files"] = sorted(files(cache) - before)
    result["headers"] = (
        sorted(str(p.relative_to(header_dir)) for p in header_dir.rglob("*.gch"))
        if header_dir.is_dir()
        else []
    )
    result["gxx"] = [line for line in log.read_text().splitlines() if line.strip()]
    kernel_builds = [line for line in result["gxx"] if ".main.cpp" in line or "-x c++-header" in line]
    result["command_line"] = kernel_builds[0] if kernel_builds else ""
    return result


def files(cache: Path) -> set[str]:
    if not cache.is_dir():
        return set()
    return {
        p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file() and "locks" not in p.parts
    }


def kinds(paths: list[str]) -> str:
    counted: dict[str, int] = {}
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        kind = (
            ".main.so"
            if name.endswith(".main.so")
            else "." + name.split(".", 1)[-1]
            if "." in name
            else "entry"
        )
        counted[kind] = counted.get(kind, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counted.items())) or "none"


def gxx_kinds(lines: list[str]) -> str:
    counted = {"kernel": 0, "header": 0, "preprocess": 0, "other": 0}
    for line in lines:
        if "-x c++-header" in line:
            counted["header"] += 1
        elif " -E " in f" {line} ":
            counted["preprocess"] += 1
        elif ".cpp" in line:
            counted["kernel"] += 1
        else:
            counted["other"] += 1
    return ", ".join(f"{n} {k}" for k, n in counted.items() if n) or "none"


def describe(result: dict[str, Any]) -> str:
    return (
        f"{json.dumps(result['counters'])}; new files: {kinds(result['new_files'])}; "
        f"g++: {gxx_kinds(result['gxx'])}; headers in {result['header_dir']}; {result['seconds']:.1f}s"
    )


def row(variant: str, result: dict[str, Any]) -> str:
    c = result["counters"]
    fx = f"{c.get('fxgraph_cache_hit', 0)}/{c.get('fxgraph_cache_miss', 0)}"
    aot = f"{c.get('autograd_cache_hit', 0)}/{c.get('autograd_cache_miss', 0)}"
    return f"{variant:<13} {fx:>11} {aot:>12} {kinds(result['new_files']):<34} {gxx_kinds(result['gxx']):<40} {result['seconds']:.1f}"


def other_install(work: Path, name: str, *, base: Path | None = None) -> Path:
    """A virtual environment of this one's torch and its requirements at WORK/name (built once), from `base`'s
    Python if given."""
    prefix = work / name
    python = prefix / "bin" / "python"
    if python.exists():
        return python
    sys.path.insert(0, str(ROOT))
    from tests.support.installs import closure, new_install, repack

    return new_install(prefix, repack(closure(["torch"]), work / "wheels"), base_python=base)


def relocated_python(work: Path) -> Path:
    """This interpreter's installation copied to WORK/python (without its site-packages): the same Python
    under another prefix. Its include folder and `sys.base_prefix` follow the copy."""
    target = work / "python"
    python = target / "bin" / Path(sys.executable).name
    if python.exists():
        return python
    source = Path(sys.base_prefix)
    site = Path(sysconfig.get_paths(vars={"base": sys.base_prefix})["purelib"])
    shutil.copytree(
        source,
        target,
        symlinks=True,
        ignore=lambda folder, names: [n for n in names if Path(folder, n) == site],
    )
    (target / site.relative_to(source)).mkdir()
    return target / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"


if __name__ == "__main__":
    main()
