"""Submit a job to the service (CI pre-warming) and follow it; print this machine's toolchain."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from warmup.cli.common import add_spec_arguments, load_job_from_args
from warmup.errors import WarmupError
from warmup.formatting import format_duration, short_id

# `warmup submit` exit codes that CI can branch on.
EXIT_READY, EXIT_INVALID, EXIT_FAILED, EXIT_TIMEOUT = 0, 2, 3, 4
IMAGE_MEMO_ENV = (
    "WARMUP_TOOLCHAIN_MEMO"  # warmup.toolchain.memo.IMAGE_MEMO_ENV, without importing it for --help
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    submit = sub.add_parser("submit", help="submit a spec for warming (CI pre-warming); --wait follows it")
    add_spec_arguments(submit)
    submit.add_argument(
        "--server", default=os.environ.get("WARMUP_SERVER"), help="service URL (WARMUP_SERVER)"
    )
    target = submit.add_mutually_exclusive_group()
    target.add_argument("--pool", help="warm for the toolchain of this worker pool (e.g. the Trainium pool)")
    target.add_argument(
        "--toolchain", type=Path, help="a toolchain JSON (from `warmup toolchain` on the training image)"
    )
    submit.add_argument("--wait", action="store_true", help="wait until every signature is warm or failed")
    submit.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait (exit code 4 past it)")
    submit.add_argument(
        "--retry-failed", action="store_true", help="queue again signatures that failed before"
    )
    submit.set_defaults(func=cmd_submit)

    toolchain = sub.add_parser(
        "toolchain", help="print this environment's toolchain (what must match for a hit)"
    )
    toolchain.add_argument(
        "--backend",
        choices=["neuron", "inductor"],
        default="inductor",
        help="compile backend (default: inductor)",
    )
    toolchain.add_argument(
        "--device",
        choices=["neuron", "cuda", "cpu"],
        default=None,
        help="device kind (default: neuron for the neuron backend; else cuda when torch sees a GPU, cpu otherwise)",
    )
    toolchain.add_argument(
        "--world-size", type=int, default=1, help="training processes of the job (threads per process)"
    )
    toolchain.add_argument(
        "--remember",
        action="store_true",
        help="compute it exactly and remember it in the image's memo (run once in the training image's "
        "build, e.g. a Dockerfile RUN step): then `warmup pull` on every pod skips computing it "
        f"(where: ${IMAGE_MEMO_ENV}, else <prefix>/share/trl-warmup/toolchain.json)",
    )
    toolchain.set_defaults(func=cmd_toolchain)


# --- toolchain --------------------------------------------------------------------------------


def cmd_toolchain(ns: argparse.Namespace) -> int:
    from warmup.toolchain.memo import image_isa_probes, image_memo_path, remember_in_image
    from warmup.toolchain.probes import current_toolchain

    device = ns.device or ("neuron" if ns.backend == "neuron" else "cpu")
    memo = image_memo_path(for_writing=True) if ns.remember else None
    if memo is not None and (ns.backend, device) == ("inductor", "cpu"):
        # Inductor builds its CPU ISA probe programs into its cache directory as the toolchain is computed:
        # here, the image's, for `warmup exec` to hand every pod (warmup.toolchain.memo.image_isa_probes)
        probes = image_isa_probes(memo)
        shutil.rmtree(probes, ignore_errors=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(probes)
    toolchain = current_toolchain(ns.backend, device, world_size=ns.world_size)
    print(json.dumps(toolchain.model_dump(mode="json"), indent=2))
    if ns.remember:
        where = remember_in_image(toolchain, world_size=ns.world_size)
        if where is None:
            raise WarmupError(
                f"nowhere to remember the toolchain: set {IMAGE_MEMO_ENV} to a file in a writable folder"
                + (" (Neuron toolchains are always computed)" if device == "neuron" else "")
            )
        print(f"remembered in {where}", file=sys.stderr)
    return 0


# --- submit -----------------------------------------------------------------------------------


def cmd_submit(ns: argparse.Namespace) -> int:
    from warmup.client.service import ServiceClient

    if not ns.server:
        raise WarmupError("give the service URL: --server URL (or WARMUP_SERVER)")
    job_file = load_job_from_args(ns)
    spec = job_file.spec
    pool = (
        ns.pool if ns.pool is not None or ns.toolchain is not None else job_file.pool
    )  # the side file's pool
    toolchain: dict[str, Any] | None = None
    if ns.toolchain is not None:
        toolchain = json.loads(ns.toolchain.read_text())
    elif pool is None:
        from warmup.toolchain.memo import host_toolchain

        target = spec.target
        toolchain = host_toolchain(target.backend, target.device, world_size=target.world_size).model_dump(
            mode="json"
        )
    with ServiceClient(ns.server) as client:
        job = client.submit(
            spec.model_dump(mode="json"), toolchain=toolchain, pool=pool, retry_failed=ns.retry_failed
        )
        print(f"job {short_id(job['id'])}: {_counts_line(job)}", file=sys.stderr)
        if not ns.wait:
            print(job["id"])
            return _exit_code(job)
        return _follow(client, job, ns.timeout)


def _follow(client: Any, job: dict[str, Any], timeout: float) -> int:
    """Poll the job until it is ready or failed, showing progress; exit codes for CI."""
    from warmup.client.service import signature_label

    started = time.monotonic()
    progress = _ProgressLine(sys.stderr)
    running_since: dict[str, float] = {}
    while job["state"] not in ("ready", "failed"):
        now = time.monotonic()
        elapsed = now - started
        if elapsed > timeout:
            progress.done()
            print(f"timed out after {timeout:.0f}s: {_counts_line(job)}", file=sys.stderr)
            return EXIT_TIMEOUT
        remaining = _remaining(job, running_since, now)
        progress.show(f"{_counts_line(job)} | elapsed {format_duration(elapsed)}{remaining}")
        time.sleep(2.0)
        job = _poll(client, job["id"])
    progress.done()
    print(
        f"job {short_id(job['id'])} {job['state']}: {_counts_line(job)} in {format_duration(time.monotonic() - started)}",
        file=sys.stderr,
    )
    for signature in job.get("signatures", []):
        if signature["state"] == "failed":
            label = signature_label(signature.get("signature") or {})
            print(
                f"  failed: {label}: {signature.get('error')} (log: GET /v1/tasks/{signature['task_id']}/log)",
                file=sys.stderr,
            )
    return _exit_code(job)


def _poll(client: Any, job_id: str) -> dict[str, Any]:
    """The job's progress; a token that may submit but not read it (a service older than submit tokens
    reading their own jobs) is told which scope is missing, not just refused."""
    from warmup.errors import AuthError

    try:
        job: dict[str, Any] = client.job(job_id)
    except AuthError as error:
        if error.status != 403:
            raise
        raise AuthError(
            f"job {job_id} was submitted, but this token cannot follow it ({error}): give the token the "
            "'read' scope as well, or submit without --wait and follow the job with a read token "
            f"(GET /v1/warmups/{job_id})",
            status=403,
        ) from None
    return job


def _exit_code(job: dict[str, Any]) -> int:
    return EXIT_FAILED if job["state"] == "failed" else EXIT_READY


def _counts_line(job: dict[str, Any]) -> str:
    counts = job.get("counts", {})
    total = sum(counts.values())
    return (
        f"{counts.get('ready', 0)}/{total} ready, {counts.get('running', 0)} running, "
        f"{counts.get('queued', 0)} queued, {counts.get('failed', 0)} failed"
    )


def _remaining(job: dict[str, Any], running_since: dict[str, float], now: float) -> str:
    """Remaining time: each queued signature takes the average compile seconds of those done, each running
    one that average less how long it has run (since this command first saw it running, so no clock is
    compared with the server's), spread over the running workers. `running_since` is kept across polls."""
    signatures = job.get("signatures", [])
    running = {s["key"] for s in signatures if s["state"] == "running"}
    for key in set(running_since) - running:
        del running_since[key]
    for key in running:
        running_since.setdefault(key, now)
    done = [s["compile_seconds"] for s in signatures if s["state"] == "ready" and s["compile_seconds"]]
    queued = job.get("counts", {}).get("queued", 0)
    if not done or not (queued or running):
        return ""
    average = sum(done) / len(done)
    work = queued * average + sum(max(0.0, average - (now - running_since[key])) for key in running)
    if work <= 0:
        return f" | running past the {format_duration(average)} average"
    return f" | ~{format_duration(work / max(1, len(running)))} left"


class _ProgressLine:
    """One refreshed line on a terminal; a line every 15 s (or on change) in CI logs."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last_text = ""
        self.last_time = 0.0

    def show(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + text)
            self.stream.flush()
        elif text.split(" | ")[0] != self.last_text.split(" | ")[0] or time.monotonic() - self.last_time > 15:
            print(text, file=self.stream, flush=True)
            self.last_time = time.monotonic()
        self.last_text = text

    def done(self) -> None:
        if self.tty and self.last_text:
            self.stream.write("\n")
