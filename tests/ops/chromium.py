"""Headless Chromium (Debian's `chromium` package) for page tests: installed on first use when
missing, started with the flags that keep it off the (closed) network."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",  # the tests run as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Without these Chromium phones home at start-up, and the closed network refuses it.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def ensure_chromium() -> str:
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.fail("chromium is not installed: apt-get install -y chromium (needs root)", pytrace=False)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
        if result.returncode != 0:
            pytest.fail(
                f"could not install chromium ({' '.join(command)} exited {result.returncode}):\n"
                f"{result.stderr[-2000:]}",
                pytrace=False,
            )
    found = shutil.which("chromium")
    if not found:
        pytest.fail("apt-get installed chromium but there is no `chromium` on PATH", pytrace=False)
    return found


class Chromium:
    def __init__(self, binary: str, profile: Path) -> None:
        self.binary, self.profile = binary, profile

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [self.binary, *FLAGS, f"--user-data-dir={self.profile}", *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=180)
        if result.returncode != 0:
            raise AssertionError(f"chromium exited {result.returncode}:\n{result.stderr[-3000:]}")
        return result

    def dump_dom(self, url: str) -> str:
        """The DOM after the page loaded, serialized."""
        return self._run("--dump-dom", url).stdout

    def screenshot(self, url: str, path: Path, width: int, height: int) -> Path:
        self._run(f"--screenshot={path}", f"--window-size={width},{height}", url)
        assert path.is_file(), f"chromium wrote no screenshot at {path}"
        return path
