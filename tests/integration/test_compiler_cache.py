"""The test run's g++ cache (tests/support/compiler_cache.py) gives back only what g++ would build."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import compiler_cache

# the real compiler: tests/conftest.py put the run's cached `g++` first on PATH
REAL = shutil.which("g++", path="/usr/local/bin:/usr/bin:/bin")


def build(cache: Path, source: Path, output: Path) -> int:
    assert REAL is not None
    command = [sys.executable, "-S", compiler_cache.__file__, REAL, str(cache), "-shared", "-fPIC"]
    return subprocess.call([*command, str(source), "-o", str(output)], stderr=subprocess.DEVNULL)


@pytest.mark.skipif(REAL is None, reason="no g++ on this machine")
def test_an_identical_build_elsewhere_is_reused_and_any_other_is_compiled(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    first, second = tmp_path / "one", tmp_path / "two"
    for folder in (first, second):
        folder.mkdir()
        (folder / "kernel.cpp").write_text('extern "C" int kernel() { return 1; }\n')
    assert build(cache, first / "kernel.cpp", first / "kernel.so") == 0
    assert build(cache, second / "kernel.cpp", second / "kernel.so") == 0  # same source, another directory
    assert (second / "kernel.so").read_bytes() == (first / "kernel.so").read_bytes()
    assert (cache / "builds.log").read_text().split() == ["miss", "hit"]

    (second / "kernel.cpp").write_text('extern "C" int kernel() { return 2; }\n')  # other contents
    assert build(cache, second / "kernel.cpp", second / "kernel.so") == 0
    assert (second / "kernel.so").read_bytes() != (first / "kernel.so").read_bytes()

    (second / "broken.cpp").write_text("this is not C++\n")  # a failed build is neither kept nor faked
    assert build(cache, second / "broken.cpp", second / "broken.so") != 0
    assert build(cache, second / "broken.cpp", second / "broken.so") != 0
    assert not (second / "broken.so").exists()
    assert (cache / "builds.log").read_text().split() == ["miss", "hit", "miss"]
