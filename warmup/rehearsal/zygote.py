"""The rehearsal supervisor process: imports torch and TRL once, then runs every unit in a child.

`rehearse()` starts this module as a subprocess (`python -m warmup.rehearsal.zygote JOB`), so the
caller (a worker with its heartbeat thread and database connections, or the CLI) never forks
itself. Here, after the heavy imports, each run happens in a forked child: it starts with torch,
transformers and TRL already imported (their import is paid once) and with nothing compiled. A
multi-process job's run goes under `torchrun` instead (fork cannot start ranks), a sharded job's under its
own `accelerate launch` (the same FSDP / DeepSpeed environment as its ranks).

Train units are grouped into one run when there are several: one train() whose step k produces
unit k, in one cache directory, exactly as a cold training run compiles them (the first compile in
a process pays one-time costs that separate processes would pay once per unit). Every signature of
a group gets the group's files as its entry: self-contained, if more than it strictly needs. If a
group fails in any way, its directory is dropped and its units are rehearsed again one by one, so
one bad signature never costs the others their entry.

Each child has its own session, so a crash or hang stays its own: when a run makes no progress for
the time limit, its whole process group (compile workers included) is killed.

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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmup.trainers.registry import family

EVENT_PREFIX = "@@warmup "
POLL_SECONDS = 0.2


def emit(event: str, **data: Any) -> None:
    sys.stdout.write(EVENT_PREFIX + json.dumps({"event": event, **data}) + "\n")
    sys.stdout.flush()


def run_paths(work_root: Path, index: int) -> dict[str, Path]:
    """The files of run `index`: its cache dir, trainer output, log, outcome and progress."""
    base = work_root / f"run-{index:03d}"
    return {
        "base": base,
        "cache": base / "cache",
        "work": base / "work",
        "log": base / "log.txt",
        "result": base / "result.json",
        "job": base / "run.json",
        "progress": base / "progress",
    }


@dataclass
class Running:
    index: int
    units: list[Any]
    timeout_s: float
    pid: int | None = None  # forked child
    process: subprocess.Popen[bytes] | None = None  # torchrun, accelerate launch or plain subprocess
    started: float = field(default_factory=time.monotonic)
    last_progress: float = field(default_factory=time.monotonic)
    steps_done: int = 0

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
        if target is None:  # never started
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(target, signal.SIGKILL)
        if self.process is not None:
            self.process.wait()
        else:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)  # type: ignore[arg-type]


def preload(trainer: str) -> None:
    """Import what every run needs, without running a single torch op (so forking stays safe)."""
    import datasets  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import trl

    from warmup._compat import torch as compat_torch
    from warmup.job.trl_args import config_class

    compat_torch.import_compiler()
    getattr(trl, family(trainer).trainer_class)  # TRL imports its modules lazily
    config_class(trainer)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def config_facts(spec: Any) -> dict[str, Any]:
    """What unit planning and grouping need from the job's TRL config, as TRL resolves it here."""
    from warmup.rehearsal.drivers import RunJob, build_config
    from warmup.rehearsal.units import RehearsalUnit

    probe_unit = RehearsalUnit(index=0, kind="train", batch=1, seq_len=1, signatures=[])
    config = build_config(RunJob(spec, [probe_unit], Path("."), Path(tempfile.gettempdir()), 1))
    record = family(spec.trainer)
    generation_rows = None
    if hasattr(config, "steps_per_generation"):
        generation_rows = {
            "train": config.per_device_train_batch_size * config.steps_per_generation,
            "eval": config.per_device_eval_batch_size,
        }
    elif record.generates:  # distillation: a round generates for the whole accumulation
        generation_rows = {
            "train": config.per_device_train_batch_size * config.gradient_accumulation_steps,
            "eval": config.per_device_eval_batch_size,
        }
    return {
        "pad_to_multiple_of": config.pad_to_multiple_of,
        "max_completion_length": getattr(config, "max_completion_length", None),
        "generation_rows": generation_rows,
        "train_rows": config.per_device_train_batch_size * record.rows_per_example,
        "max_length": getattr(config, "max_length", None),
        # SFT padding-free batches (BFD packing reorders rows across batches): one unit per run
        "padding_free": bool(
            getattr(config, "padding_free", False)
            or (
                getattr(config, "packing", False)
                and getattr(config, "packing_strategy", "") in ("bfd", "bfd_split")
            )
        ),
    }


def rehearsal_topology(spec: Any) -> tuple[int, Any, bool]:
    """How many processes rehearse `spec`, the spec each of them runs (see warmup/planner/topology.py), and whether
    the job's launcher shards the model (then its ranks start under that launcher: `job_launcher`)."""
    from warmup.job.trl_args import resolve_trainer_args
    from warmup.planner.topology import rank_args, rehearsal_processes

    args = resolve_trainer_args(spec)
    processes = rehearsal_processes(spec, args.config, args.launch)
    rank_spec = spec.model_copy(update={"args": rank_args(spec, args.config, processes)})
    return processes, rank_spec, args.launch.sharded


@contextlib.contextmanager
def job_launcher(spec: Any) -> Iterator[list[str] | None]:
    """The options `trl <trainer> --config` hands to `accelerate launch` for `spec` (its accelerate_config as
    --config_file, then every launcher key as `--key value`), with the launch files the spec carries written where
    accelerate opens them for as long as the context lasts; None when it hands none (the sharding then comes from
    the trainer config's own fields, deepspeed / fsdp, which TRL's Trainer applies under torchrun as well)."""
    from trl.cli.accelerate_config import resolve_accelerate_config_argument

    from warmup.job.trl_args import config_class
    from warmup.job.trl_config import read_trl_args
    from warmup.job.trl_launch import placed_files

    parsed = read_trl_args(spec, config_class(spec.trainer))
    own = {*parsed.trainer, *parsed.script, "env"}
    leftover = {name: value for name, value in spec.args.items() if name not in own}
    with placed_files(leftover, spec.files) as (placed, _):
        argv = [item for name, value in placed.items() for item in (f"--{name}", str(value))]
        yield resolve_accelerate_config_argument(argv) or None


def group_runs(units: list[Any], train_rows: int, grouping: bool) -> list[list[Any]]:
    """Runs to start: the train units together (full batches first, at most one short batch, last),
    every other unit alone."""
    train = [unit for unit in units if unit.kind == "train"]
    if not grouping or len(train) < 2:
        return [[unit] for unit in units]
    full = [unit for unit in train if unit.batch == train_rows]
    short = [unit for unit in train if unit.batch != train_rows]
    group = full + short[:1]
    alone = [unit for unit in units if unit not in group]
    return [group, *([unit] for unit in alone)]


def main(argv: list[str]) -> int:
    with contextlib.ExitStack() as files:  # the launch files a sharded job's launcher opens, while runs start
        return supervise(argv, files)


def supervise(argv: list[str], files: contextlib.ExitStack) -> int:
    parent = os.getppid()
    job = json.loads(Path(argv[0]).read_text())
    from warmup.errors import WarmupError
    from warmup.job.spec import Spec
    from warmup.rehearsal.drivers import RunJob
    from warmup.rehearsal.units import plan_units
    from warmup.signature import Signature

    spec = Spec.model_validate(job["spec"])
    work_root = Path(job["work_root"])
    fork = job["isolation"] == "fork" and spec.target.world_size == 1
    try:
        from warmup.job.model_facts import read_model_facts

        # A model path this machine lacks (the config was read on another): say which machine looked, and where.
        for model in (spec.model, spec.teacher_model):
            if model and model.startswith(("/", ".", "~")):
                read_model_facts(model)
        if fork:
            preload(spec.trainer)
        warnings: list[str] = []
        if job["signatures"] is None:
            from warmup.planner.planning import plan_spec

            plan = plan_spec(spec)
            signatures, warnings = plan.signatures, plan.warnings
        else:
            signatures = [Signature.model_validate(item) for item in job["signatures"]]
        toolchain = None
        if job.get("toolchain"):
            from warmup.toolchain.probes import current_toolchain

            world = spec.target.world_size
            toolchain = current_toolchain(spec.target.backend, spec.target.device, world_size=world)
        skip = set(job.get("skip") or [])
        todo = [signature for signature in signatures if signature.key() not in skip]
        plan_size = job.get("plan_size") or len(signatures)
        processes, rank_spec, sharded = rehearsal_topology(spec)
        launcher = files.enter_context(job_launcher(rank_spec)) if sharded else None
        fork = fork and launcher is None  # the launcher sets the ranks' environment: it starts even one
        facts = config_facts(rank_spec)
        planned = plan_units(
            spec.trainer,
            todo,
            backend=spec.target.backend,
            pad_to_multiple_of=facts["pad_to_multiple_of"],
            max_completion_length=facts["max_completion_length"],
            generation_rows=facts["generation_rows"],
            max_length=facts["max_length"],
        )
    except WarmupError as error:
        problems = [[p.loc, p.msg] for p in getattr(error, "problems", [])]
        emit("error", message=str(error), type=type(error).__name__, problems=problems)
        return 2
    emit(
        "planned",
        **planned.model_dump(mode="json"),
        signatures=None if job["signatures"] is not None else [s.model_dump(mode="json") for s in signatures],
        warnings=warnings,
        toolchain=toolchain.model_dump(mode="json") if toolchain else None,
        skipped=sorted(skip & {signature.key() for signature in signatures}),
        processes=processes,
    )

    grouping = job.get("grouping", True) and not facts["padding_free"]
    pending = group_runs(planned.units, facts["train_rows"], grouping)
    running: dict[int, Running] = {}
    next_index = 0

    def stop(signum: int, _frame: Any) -> None:
        for item in running.values():
            item.kill()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    while pending or running:
        if os.getppid() != parent:
            # Whoever asked for this rehearsal is gone (a worker killed with SIGKILL cannot stop us):
            # stop compiling for nobody, and free the cores (NeuronCores above all) for its successor.
            print("the process that started this rehearsal died; stopping", file=sys.stderr)
            for item in running.values():
                item.kill()
            return 1
        while pending and len(running) < job["jobs"]:
            units = pending.pop(0)
            paths = run_paths(work_root, next_index)
            for name in ("cache", "work"):
                paths[name].mkdir(parents=True, exist_ok=True)
            run_job = RunJob(rank_spec, units, paths["cache"], paths["work"], plan_size)
            paths["job"].write_text(run_job.to_json())
            running[next_index] = launch(next_index, run_job, paths, processes, fork, job, launcher)
            emit("started", unit=units[0].index, run=next_index)
            next_index += 1
        time.sleep(POLL_SECONDS)
        for index, item in list(running.items()):
            paths = run_paths(work_root, index)
            _follow_progress(item, paths)
            code = item.poll()
            now = time.monotonic()
            if code is None and now - item.last_progress <= item.timeout_s:
                continue
            del running[index]
            if code is None:
                item.kill()
            status = "timed_out" if code is None else "exited"
            if len(item.units) > 1 and not _succeeded(code, paths):
                # a group failed: its directory is dropped, each unit is rehearsed again alone
                print(
                    f"run {index} ({len(item.units)} units) {status} (exit {code}); one by one now",
                    file=sys.stderr,
                )
                pending[0:0] = [[unit] for unit in item.units]
                continue
            for unit in item.units:
                emit(
                    "finished",
                    unit=unit.index,
                    run=index,
                    run_units=[u.index for u in item.units],
                    status=status,
                    exit_code=code,
                    seconds=now - item.started,
                )
    return 0


def _follow_progress(item: Running, paths: dict[str, Path]) -> None:
    """A group's child writes its finished-step count: announce the next unit, reset the time limit."""
    try:
        done = int(paths["progress"].read_text() or 0)
    except (OSError, ValueError):
        return
    if done > item.steps_done:
        item.steps_done = done
        item.last_progress = time.monotonic()
        if done < len(item.units):
            emit("started", unit=item.units[done].index, run=item.index)


def _succeeded(code: int | None, paths: dict[str, Path]) -> bool:
    if code != 0:
        return False
    try:
        result: dict[str, Any] = json.loads(paths["result"].read_text())
        return result.get("status") == "ok"
    except (OSError, json.JSONDecodeError):
        return False


def launch(
    index: int,
    run_job: Any,
    paths: dict[str, Path],
    processes: int,
    fork: bool,
    job: dict[str, Any],
    launcher: list[str] | None = None,
) -> Running:
    running = Running(index, run_job.units, float(job["timeout_s"]))
    if fork:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setsid()
                log_fd = os.open(paths["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(log_fd, 1)
                os.dup2(log_fd, 2)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                from warmup.rehearsal.drivers import run_to_file

                code = run_to_file(run_job, paths["result"], progress=paths["progress"])
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        running.pid = pid
        return running
    command = [
        "-m",
        "warmup.rehearsal.child",
        str(paths["job"]),
        str(paths["result"]),
        str(paths["progress"]),
    ]
    env = None
    target = run_job.spec.target
    if target.device == "cpu" and (processes > 1 or launcher is not None):
        from warmup.toolchain.probes import training_threads

        # each rank runs the threads a rank of the job runs (in Inductor's key on CPU)
        env = {**os.environ, "OMP_NUM_THREADS": str(training_threads(target.world_size))}
    if launcher is not None:
        # The job's own launcher (`trl` starts its script under `accelerate launch`): the same environment, so the
        # same FSDP / DeepSpeed plugin; on one machine, with the rehearsal's number of processes.
        accelerate = ["-m", "accelerate.commands.launch", *launcher, f"--num_processes={processes}"]
        accelerate += ["--num_machines=1", "--machine_rank=0", "--main_process_ip=127.0.0.1"]
        accelerate += [f"--main_process_port={free_port()}"]
        if env is not None:
            accelerate.append(f"--num_cpu_threads_per_process={env['OMP_NUM_THREADS']}")
        command = [*accelerate, "--module", *command[1:]]
    elif processes > 1:
        torchrun = ["-m", "torch.distributed.run", f"--nproc-per-node={processes}"]
        torchrun += ["--master-addr=127.0.0.1", f"--master-port={free_port()}"]
        if target.device == "cuda":
            # the GPU index is in Inductor's key: every rank compiles for cuda:0, as training under
            # `torchrun --virtual-local-rank` does
            torchrun.append("--virtual-local-rank")
        command = torchrun + command
    with open(paths["log"], "wb") as log:
        running.process = subprocess.Popen(
            [sys.executable, *command],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    return running


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
