"""Rehearsal: warm signatures by running the user's own TRL trainer on synthetic data.

The API a worker calls:

    from warmup.rehearsal import rehearse

    results = rehearse(spec, signatures, cache_root, timeout_s=1800, on_progress=print)
    for result in results:            # one SignatureResult per signature, in the given order
        result.key, result.status     # "ok" | "failed" | "timed_out"
        result.files                  # list[ArtifactFile]: paths relative to result.cache_dir
        result.cache_dir              # where those files are (None when there are none)
        result.compile_seconds        # Dynamo's compile time of the run that produced the entry
        result.note, result.log_tail  # why an entry is empty; the end of the log on failure

How it works:
- `units.plan_units` groups the signatures into units, one per run of TRL's own step (a DPO step
  compiles the policy and the reference together, a GRPO step generates, scores and trains);
  signatures that compile nothing on the target (`compile == "eager"`) get an empty entry, with
  the reason in `note`.
- A supervisor subprocess (`zygote`) imports torch and TRL once and runs each unit in a forked
  child with its own fresh cache directory (`cache_root/unit-NNN/cache`) and a time limit; a
  multi-process job's unit runs under `torchrun` with the job's world size (gloo on CPU).
- Each unit's entry is every artifact file of its cache directory: self-contained, and the same
  files for every signature the unit covers (the blob store keeps them once). A failed or timed-out
  unit publishes nothing: its results have no files.

`cache_root` must be empty or new and local; `warmup warm` merges the ok entries into one directory
a training process can use directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

import warmup
from warmup.artifacts import ArtifactFile
from warmup.backends import get_backend
from warmup.errors import RehearsalError
from warmup.rehearsal.units import RehearsalUnit, UnitPlan, plan_units
from warmup.rehearsal.zygote import EVENT_PREFIX, unit_paths
from warmup.signature import Signature
from warmup.spec import Spec

Status = Literal["ok", "failed", "timed_out"]
LOG_TAIL_CHARS = 4000
# Time the supervisor may take to import torch and TRL and plan, on top of the units' own limits.
SUPERVISOR_GRACE_SECONDS = 300


class SignatureResult(BaseModel):
    """The outcome of warming one signature."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    key: str
    signature: Signature
    status: Status
    files: list[ArtifactFile] = Field(default_factory=list)
    cache_dir: Path | None = Field(None, description="The directory `files` are relative to.")
    compile_seconds: float = 0.0
    run_seconds: float = 0.0
    unit: int | None = Field(
        None, description="The unit whose run produced this entry (None: nothing to run)."
    )
    shared_with: list[str] = Field(default_factory=list, description="Other signatures of the same run.")
    note: str = ""
    log_tail: str = ""

    @property
    def size(self) -> int:
        return sum(item.size for item in self.files)


@dataclass
class Progress:
    """A progress event: a unit started or finished (with the results it produced)."""

    event: Literal["planned", "started", "finished"]
    units_done: int
    units_total: int
    signatures_done: int
    signatures_total: int
    elapsed_s: float
    unit: RehearsalUnit | None = None
    results: list[SignatureResult] = field(default_factory=list)


def rehearse(
    spec: Spec,
    signatures: list[Signature],
    cache_root: str | os.PathLike[str],
    *,
    timeout_s: float = 1800.0,
    on_progress: Callable[[Progress], None] | None = None,
    jobs: int = 1,
    plan_size: int | None = None,
    isolation: Literal["fork", "subprocess"] | None = None,
) -> list[SignatureResult]:
    """Warm `signatures` of `spec` on this machine; one result per signature, in order.

    `timeout_s` bounds each unit's run; `jobs` runs that many units at once; `plan_size` sizes the
    recompile limit (default: the number of signatures given). Raises RehearsalError when the
    signatures cannot be rehearsed at all (unsupported trainer, a shape the spec cannot produce).
    """
    if not signatures:
        return []
    root = Path(cache_root).absolute()
    root.mkdir(parents=True, exist_ok=True)
    isolation = isolation or ("fork" if hasattr(os, "fork") and spec.target.world_size == 1 else "subprocess")
    job = {
        "spec": spec.model_dump(mode="json"),
        "signatures": [s.model_dump(mode="json") for s in signatures],
        "plan_size": plan_size or len(signatures),
        "work_root": str(root),
        "timeout_s": timeout_s,
        "jobs": max(1, jobs),
        "isolation": isolation,
    }
    job_path = root / "rehearsal-job.json"
    job_path.write_text(json.dumps(job))
    session = _Session(spec, signatures, root, on_progress)
    deadline = SUPERVISOR_GRACE_SECONDS + timeout_s * len(signatures) / max(1, jobs)
    with open(root / "supervisor.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "warmup.rehearsal.zygote", str(job_path)],
            stdout=subprocess.PIPE,
            stderr=log,
            env=_child_env(),
            start_new_session=True,
        )
        watchdog = threading.Timer(deadline, _kill_group, args=(process,))
        watchdog.daemon = True
        watchdog.start()
        try:
            session.follow(process)
        finally:
            watchdog.cancel()
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return session.results_in_order()


def _kill_group(process: subprocess.Popen) -> None:
    """The supervisor overran every unit's time limit together: stop it and everything it started."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _child_env() -> dict[str, str]:
    """This environment, with the directory holding the `warmup` package first on PYTHONPATH."""
    env = dict(os.environ)
    package_root = str(Path(warmup.__file__).resolve().parent.parent)
    parts = [
        package_root,
        *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != package_root],
    ]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


class _Session:
    """Follows the supervisor's events and turns unit outcomes into signature results."""

    def __init__(
        self,
        spec: Spec,
        signatures: list[Signature],
        root: Path,
        on_progress: Callable[[Progress], None] | None,
    ) -> None:
        self.spec = spec
        self.signatures = signatures
        self.root = root
        self.on_progress = on_progress
        self.backend = get_backend(spec.target.backend, spec.target.device)
        self.plan: UnitPlan | None = None
        self.results: dict[str, SignatureResult] = {}
        self.units_done = 0
        self.start = time.monotonic()

    def follow(self, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        error: str | None = None
        for raw in process.stdout:
            line = raw.decode(errors="replace")
            if not line.startswith(EVENT_PREFIX):
                continue
            event = json.loads(line[len(EVENT_PREFIX) :])
            if event["event"] == "error":
                error = event["message"]
            elif event["event"] == "planned":
                self._planned(UnitPlan.model_validate({k: v for k, v in event.items() if k != "event"}))
            elif event["event"] == "started":
                self._progress("started", self._unit(event["unit"]))
            elif event["event"] == "finished":
                self._finished(self._unit(event["unit"]), event)
        process.wait()
        if error is not None:
            raise RehearsalError(error)
        if self.plan is None:
            raise RehearsalError(
                "the rehearsal supervisor stopped before planning; its log:\n"
                + _tail(self.root / "supervisor.log"),
                log=_tail(self.root / "supervisor.log"),
            )
        for unit in self.plan.units:  # units the supervisor never finished (it died or ran out of time)
            if unit.keys[0] not in self.results:
                self._record(
                    unit, "failed", note="the rehearsal supervisor stopped before this unit finished"
                )

    def _unit(self, index: int) -> RehearsalUnit:
        assert self.plan is not None
        return self.plan.units[index]

    def _planned(self, plan: UnitPlan) -> None:
        self.plan = plan
        by_key = {s.key(): s for s in self.signatures}
        for key, reason in plan.nothing_to_compile.items():
            self.results[key] = SignatureResult(key=key, signature=by_key[key], status="ok", note=reason)
        self._progress("planned", None)

    def _finished(self, unit: RehearsalUnit, event: dict[str, Any]) -> None:
        paths = unit_paths(self.root, unit.index)
        if event["status"] == "timed_out":
            self._record(
                unit, "timed_out", note=f"no result within the time limit ({event['seconds']:.0f} s)"
            )
            return
        outcome = _read_json(paths["result"])
        if outcome is None:
            self._record(unit, "failed", note=f"the run crashed (exit code {event['exit_code']})")
        elif outcome.get("status") != "ok" or event["exit_code"] != 0:
            self._record(unit, "failed", note=str(outcome.get("error") or f"exit code {event['exit_code']}"))
        else:
            files = self.backend.collect(paths["cache"])
            note = "" if files else "the run compiled nothing: the entry is empty"
            self._record(
                unit,
                "ok",
                files=files,
                compile_seconds=float(outcome.get("compile_seconds", 0.0)),
                run_seconds=float(event["seconds"]),
                note=note,
            )

    def _record(self, unit: RehearsalUnit, status: Status, **fields: Any) -> None:
        paths = unit_paths(self.root, unit.index)
        if status != "ok":
            fields["log_tail"] = _tail(paths["log"])
        files = fields.get("files") or []
        keys = unit.keys
        results = []
        for signature, key in zip(unit.signatures, keys, strict=True):
            result = SignatureResult(
                key=key,
                signature=signature,
                status=status,
                unit=unit.index,
                shared_with=[k for k in keys if k != key],
                cache_dir=paths["cache"] if files else None,
                **fields,
            )
            self.results[key] = result
            results.append(result)
        self.units_done += 1
        self._progress("finished", unit, results)

    def _progress(
        self, event: str, unit: RehearsalUnit | None, results: list[SignatureResult] | None = None
    ) -> None:
        if self.on_progress is None or self.plan is None:
            return
        self.on_progress(
            Progress(
                event=event,  # type: ignore[arg-type]
                units_done=self.units_done,
                units_total=len(self.plan.units),
                signatures_done=len(self.results),
                signatures_total=len(self.signatures),
                elapsed_s=time.monotonic() - self.start,
                unit=unit,
                results=results or [],
            )
        )

    def results_in_order(self) -> list[SignatureResult]:
        return [self.results[s.key()] for s in self.signatures if s.key() in self.results]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-chars:].decode(errors="replace")


__all__ = ["Progress", "RehearsalUnit", "SignatureResult", "plan_units", "rehearse"]
