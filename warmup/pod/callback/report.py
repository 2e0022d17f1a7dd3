"""The coverage report's way out: written beside the run's output, posted to the service (never failing
training), and the verdict line the run ends with; the toolchain it names."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from warmup.pod.callback.timings import describe_timings, verdict_said

log = logging.getLogger(__name__)

Shape = tuple[str, int, int]  # phase, batch, seq_len
REPORT_NAME = "warmup-coverage.json"
MAX_LISTED_FILES = 20


def label(shape: Shape) -> str:
    return f"{shape[0]} {shape[1]}x{shape[2]}"


def write_report(output_dir: Path | None, body: dict[str, Any]) -> Path | None:
    """The report in the run's output_dir; where it was written, if it was."""
    if output_dir is None:
        return None
    rank = body["details"]["rank"]
    name = REPORT_NAME if rank == 0 else REPORT_NAME.replace(".json", f".rank{rank}.json")
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / name).write_text(json.dumps(body, indent=1))
    except OSError as error:
        log.warning("trl-warmup: cannot write %s: %s", output_dir / name, error)
        return None
    return output_dir / name


def post_report(
    body: dict[str, Any],
    status: str,
    written: Path | None,
    *,
    server: str | None,
    token: str | None,
    timeout_s: float,
) -> dict[str, Any] | None:
    """Say the run's verdict and post the report to `server` (none: the verdict names the file); never raises.
    Returns the service's answer, or None when it was not posted."""
    warm = len(body["met"]) - len(body["missed"])  # every missed signature is a met one
    summary = (
        f"trl-warmup: {status}: met {len(body['met'])} signature(s), {warm} warm, "
        f"{len(body['missed'])} missed, {body['fresh_compiles']} fresh compile(s)"
    )
    if "timings" in body["details"]:
        summary += f"; {describe_timings(body['details']['timings'])}"
    if not server:  # a run without a service (a directory `warmup warm` filled): nothing to post
        say_verdict(summary + (f"; report written to {written}" if written else ""))
        return None
    try:
        from warmup.client.service import ServiceClient

        with ServiceClient(server, token=token, timeout=timeout_s, attempts=2) as client:
            response = client.post_coverage(body)
    except Exception as failure:  # the service being down must never fail training
        say_verdict(f"{summary}; the report could not be posted to {server}: {failure}")
        return None
    from warmup.formatting import short_id

    job = response.get("job_id")
    say_verdict(
        f"{summary}; report {response.get('report_id')} posted" + (f" for job {short_id(job)}" if job else "")
    )
    for why in (response.get("unwarmable") or {}).values():
        log.warning("trl-warmup: the service records it, but cannot warm it from this spec: %s", why)
    return response


def say_verdict(line: str) -> None:
    """The run's verdict, on stderr whatever the logging set-up: the last line a run under `warmup exec`
    prints (it carries the compile timings, so exec's own exit line is not printed after it)."""
    print(line, file=sys.stderr, flush=True)
    verdict_said()


def report_toolchain(cache_dir: Path, spec: Any) -> dict[str, Any]:
    """The toolchain the cache was pulled for (the pod's, as `warmup pull` computed it); else this
    process's own."""
    from warmup.client.local import read_local_manifest

    manifest = read_local_manifest(cache_dir, spec.key())
    if manifest is not None:
        return manifest.toolchain
    from warmup.toolchain.probes import current_toolchain

    target = spec.target
    return current_toolchain(target.backend, target.device, world_size=target.world_size).model_dump(
        mode="json"
    )
