"""`warmup exec`'s download beside the training command's start.

The manifest alone sets the training command's environment; the files are first read when a graph
compiles. So `warmup exec` fetches the manifest, then forks: the child installs the files (all or
none: warmup/client/installing.py) and writes the outcome to a file, while the parent execs the
training command at once, which imports torch and TRL and loads its model and data meanwhile. The
training process waits for the outcome (`wait_for_pull`) before anything reads the cache: at Dynamo's
first compile (a hook warmup/pod/_sitecustomize installs), and before `WarmupCallback` or
`warmup.activate` checks the toolchain the cache was pulled for. A failed download stops the training
process there with the pull's error (BackgroundPullError), as it stopped `warmup exec` before the
command started when the pull came first: no run compiles what it was told was warm.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from warmup.errors import BackgroundPullError

if TYPE_CHECKING:
    from warmup.client.installing import PullResult
    from warmup.client.pulling import PendingInstall

OUTCOME_VARIABLE = "WARMUP_PULL_OUTCOME"  # the file the download writes its outcome to
PID_VARIABLE = "WARMUP_PULL_PID"  # the downloading process, to tell a crash from a slow download
POLL_S = 0.02
log = logging.getLogger("warmup")


def can_overlap() -> bool:
    """Forking is how the download goes on beside the command (POSIX only)."""
    return hasattr(os, "fork")


def install_beside(
    pending: PendingInstall,
    *,
    describe: Callable[[PullResult], str],
    after: Callable[[bool], None] = lambda installed: None,
) -> dict[str, str]:
    """Start installing `pending` in a child process; return the environment that tells the training
    command where its outcome will be. The child runs `after(installed)` once the install has ended,
    prints `describe(result)` (or the error) to stderr, and exits."""
    outcome = Path(tempfile.mkdtemp(prefix="warmup-pull-")) / "outcome.json"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: install, say how it went, and leave without running the parent's exit code
        status = 0
        try:
            _install_and_record(pending, outcome, describe, after)
        except BaseException:  # the outcome file says why; nothing may escape the fork
            status = 1
        finally:
            sys.stderr.flush()
            os._exit(status)
    return {OUTCOME_VARIABLE: str(outcome), PID_VARIABLE: str(pid)}


def _install_and_record(
    pending: PendingInstall,
    outcome: Path,
    describe: Callable[[PullResult], str],
    after: Callable[[bool], None],
) -> None:
    installed = False
    try:
        result = pending.run()
        installed = True
        after(True)
        record = {"ok": True, "summary": describe(result)}
    except BaseException as error:
        if not installed:
            after(False)
        record = {"ok": False, "error": f"{type(error).__name__}: {error}"}
    written = outcome.with_suffix(".tmp")
    written.write_text(json.dumps(record))
    written.replace(outcome)  # the training process sees the whole outcome or none
    if record["ok"]:
        print(f"{record['summary']} (beside the training command's start)", file=sys.stderr)
    else:
        print(f"error: the cache download failed: {record['error']}", file=sys.stderr)


_done: set[str] = set()


def wait_for_pull() -> None:
    """In the training process of `warmup exec`: return once the cache download started beside it has
    installed every file; raise BackgroundPullError when it failed or died. Returns at once when no
    download runs beside this process, and after the first success."""
    path = os.environ.get(OUTCOME_VARIABLE)
    if not path or path in _done:
        return
    outcome = Path(path)
    pid = int(os.environ.get(PID_VARIABLE) or 0)
    started = time.monotonic()
    said = False
    while not outcome.exists():
        if pid and not _alive(pid) and not outcome.exists():
            raise BackgroundPullError(
                f"the cache download of `warmup exec` (process {pid}) ended without an outcome: it was "
                "killed; run `warmup pull` to see why, or train without the cache"
            )
        if not said and time.monotonic() - started > 1.0:
            log.warning("trl-warmup: waiting for the cache download to finish before compiling")
            said = True
        time.sleep(POLL_S)
    record = json.loads(outcome.read_text())
    if not record.get("ok"):
        raise BackgroundPullError(
            f"the cache download of `warmup exec` failed: {record.get('error')}; training stops before it "
            "compiles what was not installed (pull again, or train without the cache)"
        )
    _done.add(path)


def _alive(pid: int) -> bool:
    """Whether the downloading process still runs. The training command is its parent (exec kept the
    process), so it reaps it; a process the command started in turn (a torchrun rank) asks the kernel."""
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        return reaped == 0
    except ChildProcessError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return state not in ("Z", "X")
