"""`warmup exec`'s download beside the training command (warmup/client/background.py): the training
process's wait returns once every file is installed, and stops it with the cause when the download
failed or died. The install is played by a stand-in whose `run` succeeds, fails or hangs; the real
one runs under `warmup exec` in tests/integration/test_pull_cli.py."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from warmup.client import background
from warmup.client.background import OUTCOME_VARIABLE, PID_VARIABLE, install_beside, wait_for_pull
from warmup.errors import BackgroundPullError, BlobIntegrityError


@dataclass
class StandIn:
    """What `install_beside` needs of a PendingInstall: `run()`."""

    dest: Path
    outcome: str = "ok"  # ok | fail | hang

    def run(self) -> str:
        if self.outcome == "fail":
            raise BlobIntegrityError("blob 3f2a... has the wrong sha256")
        if self.outcome == "hang":
            time.sleep(60)
        (self.dest / "entry").write_text("compiled code")
        return "installed 1 file"


@pytest.fixture
def beside(monkeypatch, tmp_path):
    """Start a stand-in install beside this process, as `warmup exec` does, and set the environment
    the training command gets."""
    monkeypatch.setattr(background, "_done", set())

    def start(outcome: str) -> dict[str, str]:
        env = install_beside(
            StandIn(tmp_path, outcome),  # type: ignore[arg-type]
            describe=lambda result: f"pulled: {result}",
            after=lambda installed: (tmp_path / f"after-{installed}").touch(),
        )
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return env

    return start


def test_the_wait_returns_once_the_files_are_installed(beside, tmp_path, capfd):
    env = beside("ok")
    wait_for_pull()
    assert (tmp_path / "entry").read_text() == "compiled code" and (tmp_path / "after-True").exists()
    assert '"ok": true' in Path(env[OUTCOME_VARIABLE]).read_text()
    assert "pulled: installed 1 file (beside the training command's start)" in capfd.readouterr().err
    wait_for_pull()  # and at once after that


def test_a_failed_download_stops_the_training_process_with_its_cause(beside, tmp_path):
    beside("fail")
    with pytest.raises(BackgroundPullError) as raised:
        wait_for_pull()
    assert "BlobIntegrityError: blob 3f2a... has the wrong sha256" in str(raised.value)
    assert "training stops before it compiles" in str(raised.value)
    assert not (tmp_path / "entry").exists() and (tmp_path / "after-False").exists()


def test_a_download_killed_without_an_outcome_is_not_waited_for_forever(beside):
    env = beside("hang")
    os.kill(int(env[PID_VARIABLE]), signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(BackgroundPullError, match=r"ended without an outcome: it was killed"):
        wait_for_pull()
    assert time.monotonic() - started < 30


def test_without_a_download_beside_it_the_wait_returns_at_once(monkeypatch):
    monkeypatch.delenv(OUTCOME_VARIABLE, raising=False)
    polls: list[float] = []
    monkeypatch.setattr(background.time, "sleep", polls.append)
    wait_for_pull()
    assert polls == []  # nothing to wait for: not even one poll of an outcome
