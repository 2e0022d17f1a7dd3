"""Headless Chromium (Debian's `chromium` package, from tools/install-test-deps.sh) for page tests, started
with the flags that keep it off the (closed) network."""

from __future__ import annotations

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
    if not found:
        pytest.fail("chromium is not installed: run tools/install-test-deps.sh (needs root)", pytrace=False)
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
