"""Rehearsal: warm signatures by running the user's own TRL trainer on synthetic data.

The API a worker calls:

    from warmup.rehearsal.runner import rehearse

    results = rehearse(spec, signatures, cache_root, timeout_s=1800, on_progress=print)
    for result in results:            # one SignatureResult per signature, in the given order
        result.key, result.status     # "ok" | "failed" | "timed_out"
        result.files                  # list[ArtifactFile]: paths relative to result.cache_dir
        result.cache_dir              # where those files are (None when there are none)
        result.compile_seconds        # Dynamo's compile time of the run that produced the entry
        result.note, result.log_tail  # why an entry is empty; the end of the log on failure

How it works:
- `units.plan_units` groups the signatures into units, one per step of TRL's own (a DPO step
  compiles the policy and the reference together, a GRPO step generates, scores and trains);
  signatures that compile nothing on the target (the planner's `compile == "eager"`, and under
  Inductor generation, evaluation and GRPO/RLOO old log-probs) get an empty entry, with the reason
  in `note`.
- A supervisor subprocess (`zygote`) imports torch and TRL once and starts each run in a forked
  child with its own fresh cache directory (`cache_root/run-NNN/cache`). Several training units go
  into one run, one optimizer step each, as a cold training run would compile them; an evaluation
  runs alone. A run that stops making progress for `timeout_s` is killed. A multi-process job's
  run goes under `torchrun` with the fewest processes whose ranks compile what the job's ranks
  compile (2 for a job of any size, more only for GRPO/RLOO's generation groups; see warmup/planner/topology.py),
  each with the job's per-rank config and thread count (gloo on CPU). A job whose launcher shards the
  model (FSDP, DeepSpeed ZeRO) runs under that launcher instead, `accelerate launch` with the job's
  config file and keys (warmup/planner/sharding.py says with how many processes; docs/multi-node.md why).
- Each signature's entry is every artifact file of its run's cache directory: self-contained, and
  the same files for every signature of the run (the blob store keeps them once); rehearse one
  signature per call for the smallest entries. If a run of several units fails, its files are
  dropped and its units run again one by one, so one bad signature never costs the others. A
  failed or timed-out signature publishes nothing: its result has no files.

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
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

import warmup
from warmup import errors
from warmup.artifacts import ArtifactFile
from warmup.backends.registry import get_backend
from warmup.errors import FieldProblem, RehearsalError, WarmupError
from warmup.job.spec import Spec
from warmup.rehearsal.units import RehearsalUnit, UnitPlan, eager_reason, plan_units
from warmup.rehearsal.zygote import EVENT_PREFIX, run_paths
from warmup.signature import Signature
from warmup.toolchain.model import Toolchain
from warmup.trace_skip.losses import loss_line

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
    permanent: bool = Field(False, description="Failed in a way another attempt repeats: not retried.")
    trace_lost: str = Field(
        "",
        description="Why the trace skip keeps none or only some of the run's calls, in one line (warmup/trace_skip/).",
    )

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
    grouping: bool = True,
    cancel: threading.Event | None = None,
) -> list[SignatureResult]:
    """Warm `signatures` of `spec` on this machine; one result per signature, in order.

    `timeout_s` bounds how long a run may go without finishing a unit; `jobs` runs that many
    processes at once; `plan_size` sizes the recompile limit (default: the number of signatures
    given); `grouping` runs the training steps of several signatures in one process (as a cold
    training run compiles them) instead of one process each. Raises RehearsalError when the
    signatures cannot be rehearsed at all (unsupported trainer, a shape the spec cannot produce).
    Setting `cancel` stops the runs (a worker shutting down): unfinished signatures come back failed,
    as they do when a run or the supervisor crashes (the note names the signal).
    """
    return rehearse_signatures(
        spec,
        signatures,
        cache_root,
        timeout_s=timeout_s,
        on_progress=on_progress,
        jobs=jobs,
        plan_size=plan_size,
        isolation=isolation,
        grouping=grouping,
        cancel=cancel,
    ).results


def rehearse_signatures(
    spec: Spec,
    signatures: list[Signature],
    cache_root: str | os.PathLike[str],
    *,
    timeout_s: float = 1800.0,
    on_progress: Callable[[Progress], None] | None = None,
    jobs: int = 1,
    plan_size: int | None = None,
    isolation: Literal["fork", "subprocess"] | None = None,
    grouping: bool = True,
    cancel: threading.Event | None = None,
) -> Rehearsal:
    """`rehearse`, with what the supervisor said besides the results (how many processes ran)."""
    reasons = [eager_reason(spec.trainer, spec.target.backend, s) for s in signatures]
    if all(reasons):  # nothing compiles (or nothing given): no process to start
        results = [
            SignatureResult(key=s.key(), signature=s, status="ok", note=str(reason))
            for s, reason in zip(signatures, reasons, strict=True)
        ]
        return Rehearsal(signatures, [], None, [], results)
    return _rehearse(
        spec,
        signatures,
        cache_root,
        on_progress,
        timeout_s=timeout_s,
        jobs=jobs,
        isolation=isolation,
        grouping=grouping,
        plan_size=plan_size,
        cancel=cancel,
    )


@dataclass
class Rehearsal:
    """What `rehearse_spec` did: the plan the supervisor made, its toolchain, and the results."""

    signatures: list[Signature]
    warnings: list[str]
    toolchain: Toolchain | None
    skipped: list[str]
    results: list[SignatureResult]
    processes: int = 1  # how many processes each run had (see planner/topology.py; a job of N > 1 runs fewer)


def rehearse_spec(
    spec: Spec,
    cache_root: str | os.PathLike[str],
    *,
    skip: Collection[str] = (),
    on_planned: Callable[[Rehearsal], None] | None = None,
    timeout_s: float = 1800.0,
    on_progress: Callable[[Progress], None] | None = None,
    jobs: int = 1,
    grouping: bool = True,
) -> Rehearsal:
    """Plan `spec` and warm every signature whose key is not in `skip`.

    Planning and the toolchain are computed in the supervisor, which imports TRL and torch anyway,
    so the caller never does. `on_planned` sees the plan and toolchain before anything compiles; an
    exception it raises stops the rehearsal and is raised here.
    """
    return _rehearse(
        spec,
        None,
        cache_root,
        on_progress,
        timeout_s=timeout_s,
        jobs=jobs,
        isolation=None,
        grouping=grouping,
        skip=skip,
        on_planned=on_planned,
    )


def _rehearse(
    spec: Spec,
    signatures: list[Signature] | None,
    cache_root: str | os.PathLike[str],
    on_progress: Callable[[Progress], None] | None,
    *,
    timeout_s: float,
    jobs: int,
    isolation: str | None,
    grouping: bool,
    plan_size: int | None = None,
    skip: Collection[str] = (),
    on_planned: Callable[[Rehearsal], None] | None = None,
    cancel: threading.Event | None = None,
) -> Rehearsal:
    root = Path(cache_root).absolute()
    root.mkdir(parents=True, exist_ok=True)
    isolation = isolation or ("fork" if hasattr(os, "fork") and spec.target.world_size == 1 else "subprocess")
    job = {
        "spec": spec.model_dump(mode="json"),
        "signatures": None if signatures is None else [s.model_dump(mode="json") for s in signatures],
        "skip": sorted(skip),
        "toolchain": signatures is None,
        "plan_size": plan_size,
        "work_root": str(root),
        "timeout_s": timeout_s,
        "jobs": max(1, jobs),
        "isolation": isolation,
        "grouping": grouping,
    }
    job_path = root / "rehearsal-job.json"
    job_path.write_text(json.dumps(job))
    session = _Session(spec, signatures or [], root, on_progress, on_planned)
    with open(root / "supervisor.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "warmup.rehearsal.zygote", str(job_path)],
            stdout=subprocess.PIPE,
            stderr=log,
            env=_child_env(),
            start_new_session=True,
        )
        watchdog = _Watchdog(
            process, SUPERVISOR_GRACE_SECONDS + timeout_s * max(1, len(signatures or [])), cancel
        )
        session.watchdog = watchdog
        try:
            session.follow(process)
        finally:
            watchdog.stop()
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            if process.stdout is not None:  # follow() may have stopped reading early
                process.stdout.close()
    return Rehearsal(
        signatures=session.signatures,
        warnings=session.warnings,
        toolchain=session.toolchain,
        skipped=session.skipped,
        results=session.results_in_order(),
        processes=session.processes,
    )


class _Watchdog:
    """Kills the supervisor's process group once its deadline passes (the deadline can move)."""

    def __init__(
        self, process: subprocess.Popen[bytes], seconds: float, cancel: threading.Event | None = None
    ) -> None:
        self.process = process
        self.deadline = time.monotonic() + seconds
        self.cancel = cancel
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def extend_to(self, seconds_from_now: float) -> None:
        self.deadline = time.monotonic() + seconds_from_now

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            if time.monotonic() > self.deadline or (self.cancel is not None and self.cancel.is_set()):
                _kill_group(self.process)
                return

    def stop(self) -> None:
        self._stop.set()


def _kill_group(process: subprocess.Popen[bytes]) -> None:
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
        on_planned: Callable[[Rehearsal], None] | None = None,
    ) -> None:
        self.spec = spec
        self.signatures = signatures
        self.on_planned = on_planned
        self.warnings: list[str] = []
        self.toolchain: Toolchain | None = None
        self.skipped: list[str] = []
        self.processes = 1
        self.watchdog: _Watchdog | None = None
        self.aborted: BaseException | None = None
        self.root = root
        self.on_progress = on_progress
        self.backend = get_backend(spec.target.backend, spec.target.device)
        self.plan: UnitPlan | None = None
        self.results: dict[str, SignatureResult] = {}
        self.units_done = 0
        self.start = time.monotonic()
        self._collected: dict[Path, list[ArtifactFile]] = {}

    def follow(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        error: dict[str, Any] | None = None
        for raw in process.stdout:
            line = raw.decode(errors="replace")
            if not line.startswith(EVENT_PREFIX):
                continue
            event = json.loads(line[len(EVENT_PREFIX) :])
            if event["event"] == "error":
                error = event
            elif event["event"] == "planned":
                try:
                    self._planned(event)
                except BaseException as raised:  # on_planned refused the plan: stop everything
                    self.aborted = raised
                    _kill_group(process)
                    break
            elif event["event"] == "started":
                self._progress("started", self._unit(event["unit"]))
            elif event["event"] == "finished":
                self._finished(self._unit(event["unit"]), event)
        process.wait()
        if self.aborted is not None:
            raise self.aborted
        if error is not None:
            raise _supervisor_error(error)
        if self.plan is None:
            log = _tail(self.root / "supervisor.log")
            reason = f"the rehearsal supervisor {_exit_description(process.returncode)} before planning"
            if not self.signatures:  # rehearse_spec: nothing to report a result for
                raise RehearsalError(f"{reason}; its log:\n{log}", log=log)
            # A crash (a signal, the OOM killer) is a failed attempt that may go better next time, not
            # a refusal of these signatures: a worker retries failed results, but not RehearsalError.
            for signature in self.signatures:
                key = signature.key()
                self.results[key] = SignatureResult(
                    key=key, signature=signature, status="failed", note=reason, log_tail=log
                )
            return
        supervisor = {"log": self.root / "supervisor.log", "cache": self.root}
        for unit in self.plan.units:  # units the supervisor never finished (it died or ran out of time)
            if unit.keys[0] not in self.results:
                note = "the rehearsal supervisor stopped before this signature finished"
                self._record(unit, "failed", supervisor, unit.keys, note=note)

    def _unit(self, index: int) -> RehearsalUnit:
        assert self.plan is not None
        return self.plan.units[index]

    def _planned(self, event: dict[str, Any]) -> None:
        plan = UnitPlan.model_validate(
            {"units": event["units"], "nothing_to_compile": event["nothing_to_compile"]}
        )
        self.plan = plan
        if event.get("signatures") is not None:
            self.signatures = [Signature.model_validate(item) for item in event["signatures"]]
        self.warnings = list(event.get("warnings") or [])
        self.skipped = list(event.get("skipped") or [])
        self.processes = int(event.get("processes") or 1)
        if event.get("toolchain"):
            self.toolchain = Toolchain.model_validate(event["toolchain"])
        if self.watchdog is not None:
            timeout = json.loads((self.root / "rehearsal-job.json").read_text())["timeout_s"]
            self.watchdog.extend_to(SUPERVISOR_GRACE_SECONDS + timeout * max(1, len(plan.units)))
        if self.on_planned is not None:
            self.on_planned(
                Rehearsal(self.signatures, self.warnings, self.toolchain, self.skipped, [], self.processes)
            )
        by_key = {s.key(): s for s in self.signatures}
        for key, reason in plan.nothing_to_compile.items():
            self.results[key] = SignatureResult(key=key, signature=by_key[key], status="ok", note=reason)
        self._progress("planned", None)

    def _finished(self, unit: RehearsalUnit, event: dict[str, Any]) -> None:
        paths = run_paths(self.root, event["run"])
        shared = [k for index in event["run_units"] for k in self._unit(index).keys]
        if event["status"] == "timed_out":
            note = f"no progress within the time limit; killed after {event['seconds']:.0f} s"
            self._record(unit, "timed_out", paths, shared, note=note)
            return
        outcome = _read_json(paths["result"])
        if outcome is None:
            self._record(
                unit,
                "failed",
                paths,
                shared,
                note=f"the run {_exit_description(event['exit_code'])} without writing its result",
            )
        elif outcome.get("status") != "ok" or event["exit_code"] != 0:
            note = str(outcome.get("error") or f"the run {_exit_description(event['exit_code'])}")
            self._record(unit, "failed", paths, shared, note=note, permanent=bool(outcome.get("permanent")))
        else:
            files = self._collect(paths["cache"])
            account = outcome["units"][str(unit.index)]
            note = "" if files else "the run compiled nothing: the entry is empty"
            if len(event["run_units"]) > 1:
                note = f"warmed in one run with {len(shared) - 1} other signature(s): the entry is its files"
            lost = loss_line(outcome.get("trace", []), outcome.get("trace_lost"))
            note = "; ".join(filter(None, [note, lost]))
            self._record(
                unit,
                "ok",
                paths,
                shared,
                files=files,
                compile_seconds=float(account["compile_seconds"]),
                run_seconds=float(account["seconds"]),
                note=note,
                trace_lost=lost,
            )

    def _collect(self, cache_dir: Path) -> list[ArtifactFile]:
        if cache_dir not in self._collected:
            self._collected[cache_dir] = self.backend.collect(cache_dir)
        return self._collected[cache_dir]

    def _record(
        self, unit: RehearsalUnit, status: Status, paths: dict[str, Path], shared: list[str], **fields: Any
    ) -> None:
        if status != "ok":
            fields["log_tail"] = _tail(paths["log"])
        files = fields.get("files") or []
        results = []
        for signature, key in zip(unit.signatures, unit.keys, strict=True):
            result = SignatureResult(
                key=key,
                signature=signature,
                status=status,
                unit=unit.index,
                shared_with=[k for k in shared if k != key],
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
                signatures_total=len(self.signatures) - len(self.skipped),
                elapsed_s=time.monotonic() - self.start,
                unit=unit,
                results=results or [],
            )
        )

    def results_in_order(self) -> list[SignatureResult]:
        return [self.results[s.key()] for s in self.signatures if s.key() in self.results]


def _supervisor_error(event: dict[str, Any]) -> WarmupError:
    """The error the supervisor met while planning, as the same exception class where possible."""
    if event.get("type") in (
        "SpecError",
        "UnknownTrainerError",
        "PlanTooLargeError",
        "UnsupportedLaunchError",
    ):
        planning_error: type[WarmupError] = getattr(errors, event["type"])
        return planning_error(
            [FieldProblem(loc, msg) for loc, msg in event.get("problems") or []] or event["message"]
        )
    cls = getattr(errors, str(event.get("type")), RehearsalError)
    if isinstance(cls, type) and issubclass(cls, WarmupError) and cls is not errors.ToolchainMismatchError:
        with contextlib.suppress(TypeError):
            return cls(event["message"])
    return RehearsalError(event["message"])


def _exit_description(code: int | None) -> str:
    """How a process ended, naming the signal that killed it (a negative code from Popen/waitpid)."""
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-chars:].decode(errors="replace")


__all__ = [
    "Progress",
    "Rehearsal",
    "RehearsalUnit",
    "SignatureResult",
    "plan_units",
    "rehearse",
    "rehearse_signatures",
    "rehearse_spec",
]
