"""The test run's C++ compiler: g++ behind a content-addressed cache of its outputs (what ccache does).

Most of a CPU compile's time is g++ building Inductor's kernels, and the suite's end-to-end proofs compile
the same tiny model again and again (each proof warms its own job into its own fresh cache directory, as it
must), so most kernels are byte-identical sources built many times. tests/conftest.py puts a `g++` that runs
this script first on PATH: a build whose compiler, arguments and input files' contents were seen before in
this test run gets the same output file again; any other is built by the real g++ and kept.

Nothing else changes: Inductor's configuration and cache keys name `g++` as before (the compiler is found on
PATH), every Dynamo, AOTAutograd and Inductor step still runs, every kernel file is still written into the
cache directory, and a training process that misses Inductor's cache still counts the miss and its new files.
The cache lives for one test run only (a temporary directory), so CI on a clean checkout starts it empty.
`WARMUP_TEST_CXX_CACHE=off` runs the real compiler directly.

Usage (as the wrapper does): compiler_cache.py REAL_COMPILER CACHE_DIR ARGS...
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# Compiler identity queries and anything that writes no single output file go straight to the compiler.
PASS_THROUGH = {"--version", "-v", "-dumpversion", "-dumpmachine", "-E", "-M", "-MM", "--help"}


def split_output(args: list[str]) -> tuple[str | None, list[str]]:
    """The output path (`-o PATH` or `-oPATH`), and the arguments with it replaced by its suffix only: where
    a build writes does not change what it builds."""
    for index, arg in enumerate(args):
        if arg == "-o" and index + 1 < len(args):
            output = args[index + 1]
            return output, [*args[:index], "-o", Path(output).suffix, *args[index + 2 :]]
        if arg.startswith("-o") and len(arg) > 2:
            return arg[2:], [*args[:index], "-o", Path(arg[2:]).suffix, *args[index + 1 :]]
    return None, args


def build_key(compiler: str, args: list[str]) -> str:
    """The compiler's identity and every argument (the output already replaced by its suffix), with each
    input file (a source, an object, an `-include`d header) replaced by its content's digest."""
    digest = hashlib.sha256()
    stat = os.stat(compiler)
    digest.update(f"{os.path.realpath(compiler)}:{stat.st_size}:{stat.st_mtime_ns}\0".encode())
    for arg in args:
        if not arg.startswith("-") and os.path.isfile(arg):
            digest.update(b"file:" + hashlib.sha256(Path(arg).read_bytes()).digest() + b"\0")
        else:
            digest.update(arg.encode() + b"\0")
    return digest.hexdigest()


def main(argv: list[str]) -> int:
    compiler, cache_dir, args = argv[0], Path(argv[1]), argv[2:]
    output, keyed_args = split_output(args)
    if output is None or PASS_THROUGH.intersection(args):
        return subprocess.call([compiler, *args])
    key = build_key(compiler, keyed_args)
    kept = cache_dir / key[:2] / key
    kept.parent.mkdir(parents=True, exist_ok=True)
    # One build per key at a time: the ranks of a multi-process rehearsal compile the same kernels at once.
    with open(kept.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if kept.is_file():
            _copy(kept, Path(output))
            _count(cache_dir, "hit")
            return 0
        code = subprocess.call([compiler, *args])
        if code == 0 and os.path.isfile(output):
            _copy(Path(output), kept)
            _count(cache_dir, "miss")
        return code


def _copy(source: Path, target: Path) -> None:
    """Write `target` whole or not at all (other processes may read it at any moment)."""
    handle, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(source.read_bytes())
        os.chmod(temp, source.stat().st_mode & 0o777)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _count(cache_dir: Path, outcome: str) -> None:
    """One line per build (`hit` / `miss`), for the suite's figures."""
    with open(cache_dir / "builds.log", "a") as log:
        log.write(outcome + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
