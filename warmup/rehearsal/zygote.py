"""The rehearsal supervisor process: imports torch and TRL once, then runs every unit in a child.

`rehearse()` starts this module as a subprocess (`python -m warmup.rehearsal.zygote JOB`), so the
caller (a worker with its heartbeat thread and database connections, or the CLI) never forks
itself. Here, after the heavy imports, each unit runs in a forked child: a child starts with torch,
transformers and TRL already imported (saving their 5-10 s import per unit) and with nothing
compiled. A unit of a multi-process job runs under `torchrun` instead (fork cannot start ranks).

Each child has its own session, so a crash or hang stays its own: past its time limit its whole
process group (compile workers included) is killed and the unit is reported as timed out.

Events go to stdout as lines `@@warmup <json>`; everything else goes to the log files.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EVENT_PREFIX = "@@warmup "
POLL_SECONDS = 0.2


def emit(event: str, **data: Any) -> None:
    sys.stdout.write(EVENT_PREFIX + json.dumps({"event": event, **data}) + "\n")
    sys.stdout.flush()


@dataclass
class Running:
    index: int
    deadline: float
    pid: int | None = None  # forked child
    process: subprocess.Popen | None = None  # torchrun or plain subprocess
    started: float = field(default_factory=time.monotonic)

    def poll(self) -> int | None:
        if self.process is not None:
            return self.process.poll()
        assert self.pid is not None
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return None
        return os.waitstatus_to_exitcode(status)

    def kill(self) -> None:
        target = self.process.pid if self.process is not None else self.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(target, signal.SIGKILL)
        if self.process is not None:
            self.process.wait()
        else:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)  # type: ignore[arg-type]


def preload(trainer: str) -> None:
    """Import what every unit needs, without running a single torch op (so forking stays safe)."""
    import datasets  # noqa: F401
    import torch
    import torch._dynamo
    import torch._inductor.compile_fx  # noqa: F401
    import transformers  # noqa: F401
    import trl

    from warmup.rehearsal import drivers

    getattr(trl, drivers.TRAINER_CLASSES.get(trainer, "SFTTrainer"))
    getattr(trl, drivers.CONFIG_CLASSES.get(trainer, "SFTConfig"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def unit_paths(work_root: Path, index: int) -> dict[str, Path]:
    base = work_root / f"unit-{index:03d}"
    return {
        "base": base,
        "cache": base / "cache",
        "work": base / "work",
        "log": base / "log.txt",
        "result": base / "result.json",
        "job": base / "unit.json",
    }


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    from warmup.errors import WarmupError
    from warmup.rehearsal.drivers import UnitJob
    from warmup.rehearsal.units import plan_units
    from warmup.signature import Signature
    from warmup.spec import Spec

    spec = Spec.model_validate(job["spec"])
    work_root = Path(job["work_root"])
    try:
        if job["isolation"] == "fork":
            preload(spec.trainer)
        signatures = [Signature.model_validate(item) for item in job["signatures"]]
        facts = config_facts(spec)
        planned = plan_units(
            spec.trainer,
            signatures,
            backend=spec.target.backend,
            pad_to_multiple_of=facts["pad_to_multiple_of"],
            max_completion_length=facts["max_completion_length"],
            generation_rows=facts["generation_rows"],
        )
    except WarmupError as error:
        emit("error", message=str(error))
        return 2
    emit("planned", **planned.model_dump(mode="json"))

    running: dict[int, Running] = {}
    pending = list(planned.units)

    def stop(signum: int, _frame: Any) -> None:
        for item in running.values():
            item.kill()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    while pending or running:
        while pending and len(running) < job["jobs"]:
            unit = pending.pop(0)
            paths = unit_paths(work_root, unit.index)
            for name in ("cache", "work"):
                paths[name].mkdir(parents=True, exist_ok=True)
            unit_job = UnitJob(spec, unit, paths["cache"], paths["work"], job["plan_size"])
            paths["job"].write_text(unit_job.to_json())
            running[unit.index] = launch(unit_job, paths, spec.target.world_size, job)
            emit("started", unit=unit.index)
        time.sleep(POLL_SECONDS)
        now = time.monotonic()
        for index, item in list(running.items()):
            code = item.poll()
            if code is None and now > item.deadline:
                item.kill()
                del running[index]
                emit("finished", unit=index, status="timed_out", exit_code=None, seconds=now - item.started)
            elif code is not None:
                del running[index]
                emit("finished", unit=index, status="exited", exit_code=code, seconds=now - item.started)
    return 0


def config_facts(spec: Any) -> dict[str, Any]:
    """What unit planning needs from the job's TRL config, as TRL resolves it on this device."""
    from warmup.rehearsal.drivers import UnitJob, build_config
    from warmup.rehearsal.units import RehearsalUnit

    probe_unit = RehearsalUnit(index=0, kind="train", batch=1, seq_len=1, signatures=[])
    config = build_config(UnitJob(spec, probe_unit, Path("."), Path(tempfile.gettempdir()), 1))
    generation_rows = None
    if hasattr(config, "steps_per_generation"):
        generation_rows = {
            "train": config.per_device_train_batch_size * config.steps_per_generation,
            "eval": config.per_device_eval_batch_size,
        }
    return {
        "pad_to_multiple_of": config.pad_to_multiple_of,
        "max_completion_length": getattr(config, "max_completion_length", None),
        "generation_rows": generation_rows,
    }


def launch(unit_job: Any, paths: dict[str, Path], world_size: int, job: dict[str, Any]) -> Running:
    deadline = time.monotonic() + float(job["timeout_s"])
    if world_size == 1 and job["isolation"] == "fork":
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setsid()
                log = os.open(paths["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(log, 1)
                os.dup2(log, 2)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                from warmup.rehearsal.drivers import run_unit_to_file

                code = run_unit_to_file(unit_job, paths["result"])
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        return Running(unit_job.unit.index, deadline, pid=pid)
    command = [sys.executable, "-m", "warmup.rehearsal.child", str(paths["job"]), str(paths["result"])]
    if world_size > 1:
        command[1:3] = [
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={world_size}",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            "-m",
            "warmup.rehearsal.child",
        ]
    with open(paths["log"], "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return Running(unit_job.unit.index, deadline, process=process)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
