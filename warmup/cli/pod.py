"""The training pod's commands: pull, exec, coverage.

These run in training images that have only the base install: nothing here imports fastapi,
sqlalchemy or boto3 (boto3 is imported only by `pull --from s3://...`, when it runs).

Exit codes: 0 ok, 2 invalid spec, 3 not warmed / partly warmed / warm-up failed, 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmup.cli.common import SPEC_OPTION_DESTS, add_spec_arguments, load_spec_from_args
from warmup.errors import ServerUnreachableError, WarmupError
from warmup.formatting import format_table, short_id
from warmup.pod.training_env import IsaProbes, child_environment

if TYPE_CHECKING:
    pass

DEFAULT_PARALLEL = 16


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pull = sub.add_parser(
        "pull", help="install the warmed compile cache of a job into a local directory (training pods)"
    )
    add_spec_arguments(pull)
    add_pull_options(pull)
    pull.add_argument(
        "--print-env",
        action="store_true",
        help='print the `export` lines a shell needs to use the cache (eval "$(warmup pull ...)")',
    )
    pull.set_defaults(func=cmd_pull)

    exec_ = sub.add_parser(
        "exec",
        help="pull, and run a command with the cache environment and compile policy set (the files "
        "download while it starts; its first compile waits for them)",
        usage="warmup exec SPEC [--server URL | --from s3://bucket/prefix] --dest DIR [options] -- CMD ...",
        description="Without --server or --from, DIR is a directory `warmup warm` filled (in the image, on a "
        "volume): the command trains over it as it is, once this machine's toolchain is found equal to the one "
        "it was warmed under.",
    )
    add_spec_arguments(exec_)
    add_pull_options(exec_)
    options_only = argparse.ArgumentParser(prog="warmup exec", add_help=False)
    add_pull_options(options_only)
    for parser in (exec_, options_only):
        parser.add_argument(
            "--strict",
            action="store_true",
            help="fail closed: the training process stops at once, with the signature and the reason, "
            "when it meets a graph the cache does not hold, instead of compiling it (production runs where "
            "a surprise compile costs more than a failed start)",
        )
        parser.add_argument(
            "--pull-first",
            action="store_true",
            help="install every file before the command starts (by default the files download while the "
            "command starts, and its first compile waits for them)",
        )
    for action in exec_._actions:  # the spec options (--trainer, --side, --dataset, ...) may follow SPEC too
        if action.option_strings and action.dest in SPEC_OPTION_DESTS:
            extra = {"nargs": action.nargs, "const": action.const} if action.nargs == "?" else {}
            options_only.add_argument(
                *action.option_strings,
                dest=action.dest,
                type=action.type or str,
                choices=action.choices,
                **extra,
            )
    exec_.add_argument(
        "argv",
        metavar="CMD",
        nargs=argparse.REMAINDER,
        action=_ExecCommand,
        options=options_only,
        help="the command to run, after `--` (e.g. -- torchrun --nproc_per_node=4 train.py)",
    )
    exec_.set_defaults(func=cmd_exec)

    coverage = sub.add_parser("coverage", help="the coverage reports training runs posted for a warm-up job")
    coverage.add_argument(
        "job_id",
        help="the warm-up job's id (`warmup submit` prints it), or its first 8 characters (what the status page "
        "and `warmup submit`'s progress show; any prefix of 4 or more that only this job's id has)",
    )
    coverage.add_argument(
        "--server", default=os.environ.get("WARMUP_SERVER"), help="service URL (WARMUP_SERVER)"
    )
    coverage.add_argument(
        "--format",
        choices=["table", "json"],
        default="table",
        help="a table (default), or the reports as JSON",
    )
    coverage.set_defaults(func=cmd_coverage)


def add_pull_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server", default=os.environ.get("WARMUP_SERVER"), help="service URL (WARMUP_SERVER)"
    )
    parser.add_argument(
        "--from",
        dest="source",
        metavar="URL",
        help="pull from the bucket instead of the service: s3://bucket/prefix (standard AWS_* credentials)",
    )
    parser.add_argument(
        "--dest",
        "--cache-dir",  # the name `warmup warm` gives the same directory
        dest="dest",
        help="local cache directory to install into (required)",
    )
    parser.add_argument("--wait", action="store_true", help="wait for a warm-up that is not finished")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds --wait waits (default 3600)")
    parser.add_argument(
        "--allow-partial", action="store_true", help="install what is warm even if some signatures are not"
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=DEFAULT_PARALLEL,
        help=f"downloads at once (default {DEFAULT_PARALLEL})",
    )
    parser.add_argument("--poll", type=float, default=5.0, help=argparse.SUPPRESS)


class _ExecCommand(argparse.Action):
    """`warmup exec SPEC --dest D -- CMD ...`: argparse hands everything after SPEC to this positional
    (REMAINDER), options included; split it at the first `--` and parse the options part."""

    def __init__(self, *args: Any, options: argparse.ArgumentParser, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.options = options

    def __call__(
        self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None
    ) -> None:
        values = list(values or [])
        if "--" in values:
            cut = values.index("--")
            options, command = values[:cut], values[cut + 1 :]
        elif values and values[0].startswith("-"):
            parser.error("put the command after `--`: warmup exec SPEC --dest DIR -- CMD ...")
        else:
            options, command = [], values
        if options:
            self.options.parse_args(options, namespace)
        setattr(namespace, self.dest, command)


# --- pull ---------------------------------------------------------------------------------------


def cmd_pull(ns: argparse.Namespace) -> int:
    spec = load_spec_from_args(ns)
    result = _pull(ns, spec)
    if ns.print_env:
        for name, value in child_environment(spec, result, _server(ns)).items():
            print(f"export {name}={shlex.quote(value)}")
    return 0


def _pull(ns: argparse.Namespace, spec: Any) -> Any:
    """Install the cache of `spec` into --dest: the manifest, then every file, with a progress bar."""
    progress = Progress(sys.stderr)
    pending, probes = _prepare_with_probes(ns, spec, progress)
    installed = False
    try:
        result = pending.run()
        installed = True
    finally:
        probes.settle(installed, pending.toolchain_source)
    progress.done()
    print(summary_line(result), file=sys.stderr)
    return result


def _prepare_with_probes(
    ns: argparse.Namespace, spec: Any, progress: Progress | None
) -> tuple[Any, IsaProbes]:
    """`_prepare`, with Inductor's ISA probes built for DEST if the toolchain is computed; the caller
    settles the probes once the install has ended."""
    probes = IsaProbes(spec, _dest(ns))
    try:
        with probes.building():
            pending = _prepare(ns, spec, progress)
    except BaseException:
        probes.settle(False, "")
        raise
    _say_what_the_pull_found(pending)
    return pending, probes


def _prepare(ns: argparse.Namespace, spec: Any, progress: Progress | None) -> Any:
    """The first half of a pull: this pod's toolchain and the manifest (warmup.client.prepare_pull)."""
    from warmup.client.pulling import PullOptions, prepare_pull

    options = PullOptions(
        wait=ns.wait,
        timeout=ns.timeout,
        poll_interval=ns.poll,
        parallel=ns.parallel,
        on_progress=progress,
        on_waiting=(progress or Progress(sys.stderr)).waiting,
    )
    return prepare_pull(
        spec,
        _dest(ns),
        server=_server(ns),
        source=ns.source,
        allow_partial=ns.allow_partial,
        options=options,
    )


def _dest(ns: argparse.Namespace) -> str:
    if not ns.dest:
        raise WarmupError("give the local cache directory to install into: --dest DIR")
    if not ns.source and not ns.server:
        raise WarmupError(
            "give the service URL (--server URL or WARMUP_SERVER) or the bucket (--from s3://bucket/prefix)"
        )
    return str(ns.dest)


def _say_what_the_pull_found(pending: Any) -> None:
    if pending.toolchain_source == "computed" and pending.manifest.device != "neuron":
        print(
            "note: this pod computed its toolchain (torch imported, Inductor's ISA probes built): run "
            "`warmup toolchain --remember` once in the training image's build and every pod skips it",
            file=sys.stderr,
        )
    if pending.manifest.missing:
        print(
            f"warning: {len(pending.manifest.missing)} signature(s) are not warm yet (--allow-partial): "
            "a run that meets one of these shapes compiles it (under --strict it stops there instead)",
            file=sys.stderr,
        )


def _server(ns: argparse.Namespace) -> str | None:
    return None if ns.source else ns.server


def summary_line(result: Any) -> str:
    from warmup.client.local import TEMP_DIR_NAME

    seconds = max(result.seconds, 1e-6)
    lines = []
    files, size = getattr(result, "removed_leftovers", (0, 0))
    if files:
        lines.append(
            f"removed {files} file(s), {_mb(size)} MB, that killed pulls had left in "
            f"{result.dest / TEMP_DIR_NAME}\n"
        )
    checked = _how_checked(result.skipped, getattr(result, "hashed", 0))
    if not result.downloaded:
        return "".join(lines) + (
            f"{result.dest} is up to date: {result.skipped} file(s) already in place{checked}, nothing "
            f"downloaded ({result.seconds:.2f}s)"
        )
    return "".join(lines) + (
        f"installed {result.downloaded} file(s), {_mb(result.bytes_downloaded)} MB, into {result.dest} in "
        f"{result.seconds:.2f}s ({_mb(result.bytes_downloaded / seconds)} MB/s, "
        f"{result.downloaded / seconds:.0f} files/s, sha256 verified); {result.skipped} already in place{checked}"
    )


def _how_checked(in_place: int, hashed: int) -> str:
    """How the files already in place were checked: "verified" only for those whose sha256 was."""
    if not in_place:
        return ""
    if hashed == in_place:
        return " (sha256 verified)"
    unchanged = "unchanged since a pull verified them: size, mtime, inode and ctime as the index recorded"
    return f" ({hashed} sha256 verified, {in_place - hashed} {unchanged})" if hashed else f" ({unchanged})"


def _mb(size: float) -> str:
    return f"{size / 1e6:.1f}"


class Progress:
    """Progress on stderr: one refreshed line on a terminal, a line every 5 s in a log."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.last = 0.0
        self.shown = self.final_shown = False
        self.last_reason = ""

    def __call__(self, progress: Any) -> None:
        now = time.monotonic()
        final = progress.files_done == progress.files_total
        if (final and self.final_shown) or (not final and now - self.last < (0.2 if self.tty else 5.0)):
            return
        self.last, self.final_shown = now, final
        rate = progress.bytes_done / max(progress.elapsed_s, 1e-6)
        text = (
            f"pulling: {progress.files_done}/{progress.files_total} files, "
            f"{_mb(progress.bytes_done)}/{_mb(progress.bytes_total)} MB, {_mb(rate)} MB/s"
        )
        if self.tty:
            self.stream.write("\r\033[K" + text)
            self.stream.flush()
            self.shown = True
        else:
            print(text, file=self.stream, flush=True)

    def waiting(self, error: WarmupError) -> None:
        reason = str(error)
        if reason != self.last_reason:
            print(f"waiting: {reason}", file=self.stream, flush=True)
            self.last_reason = reason

    def done(self) -> None:
        if self.tty and self.shown:
            self.stream.write("\n")
            self.stream.flush()


# --- exec ---------------------------------------------------------------------------------------


def cmd_exec(ns: argparse.Namespace) -> int:
    from warmup.client.background import can_overlap

    if not ns.argv:
        raise WarmupError("give the command to run after `--`: warmup exec SPEC --dest DIR -- CMD ...")
    if shutil.which(ns.argv[0]) is None:  # before the pull: a download left running for nothing
        raise WarmupError(f"cannot run {ns.argv[0]!r}: no such command (not on PATH, or not executable)")
    spec = load_spec_from_args(ns)
    try:
        if not ns.server and not ns.source:
            pulled = _pulled_in_place(ns, spec)
            env = (
                child_environment(pulled[1], pulled[0])
                if pulled is not None
                else child_environment(spec, _warmed_in_place(ns, spec))
            )
        elif ns.pull_first or not can_overlap():
            result = _pull(ns, spec)
            env = child_environment(spec, result, _server(ns))
        else:
            env = _pull_beside_the_command(ns, spec)
    except ServerUnreachableError as error:
        result, installed_spec = _installed_instead(ns, spec, error)
        env = child_environment(installed_spec, result, _server(ns))
    from warmup.cli.quiet import quieted

    env = {**{k: v for k, v in os.environ.items() if k not in quieted()}, **env}
    # read by WarmupCallback, which warmup/pod/_sitecustomize adds to every Trainer under --strict
    if ns.strict:
        env["WARMUP_STRICT"] = "1"
    print(f"exec: {shlex.join(ns.argv)}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    try:
        os.execvpe(ns.argv[0], ns.argv, env)
    except OSError as error:
        raise WarmupError(f"cannot run {ns.argv[0]!r}: {error.strerror or error}") from None
    return 0  # not reached: exec replaced this process


def _warmed_in_place(ns: argparse.Namespace, spec: Any) -> Any:
    """No service and no bucket: DEST is a directory `warmup warm` filled (in the image, on a volume), and
    the command trains over it as it is, once this machine's toolchain, computed exactly, is the one it was
    warmed under (any other install of the same wheels: docs/compile-caches.md, "Install locations")."""
    from warmup.errors import NotWarmedError
    from warmup.manifest import Manifest
    from warmup.pod.activation import check_manifest_toolchain, read_manifest
    from warmup.toolchain.model import Toolchain

    warmed = read_manifest(ns.dest) if ns.dest else None
    if warmed is None:
        raise WarmupError(
            "give the service URL (--server URL or WARMUP_SERVER), the bucket (--from s3://bucket/prefix), "
            "or a --dest that `warmup warm` filled or an earlier `warmup pull` of this job installed"
        )
    dest = Path(ns.dest).expanduser().resolve()
    if warmed.get("spec_key") != spec.key():
        raise NotWarmedError(
            f"{dest} was warmed for another job: `warmup warm SPEC --cache-dir {dest}` warms this one"
        )
    probes = IsaProbes(spec, str(dest))  # the training process's first compile must find them there
    installed = False
    try:
        with probes.building():
            check_manifest_toolchain(dest, spec)
        installed = True
    finally:
        probes.settle(installed, "computed")
    entries: dict[str, Any] = warmed.get("entries") or {}
    warm = sorted(key for key, entry in entries.items() if entry.get("status") == "ok")
    manifest = Manifest(
        spec_key=spec.key(),
        toolchain_key=Toolchain.model_validate(warmed["toolchain"]).key(),
        toolchain=warmed["toolchain"],
        backend=spec.target.backend,
        device=spec.target.device,
        plan_size=len(entries),
        signatures=warm,
        missing=sorted(set(entries) - set(warm)),
        files=[],
    )
    print(f"exec: training over {dest}, warmed by `warmup warm` ({len(warm)} signature(s))", file=sys.stderr)
    return argparse.Namespace(manifest=manifest, dest=dest, toolchain_source="computed")


def _pull_beside_the_command(ns: argparse.Namespace, spec: Any) -> dict[str, str]:
    """The manifest now; the files in a child process while the command starts (warmup/client/background.py).
    Returns the command's environment, which includes where the download will say it is done."""
    from warmup.client.background import install_beside

    pending, probes = _prepare_with_probes(ns, spec, None)
    try:
        env = child_environment(spec, pending, _server(ns))
    except BaseException:
        probes.settle(False, pending.toolchain_source)
        raise

    def after(installed: bool) -> None:
        probes.settle(installed, pending.toolchain_source)

    return {**env, **install_beside(pending, describe=summary_line, after=after)}


def _installed_instead(ns: argparse.Namespace, spec: Any, error: ServerUnreachableError) -> tuple[Any, Any]:
    """When the service cannot be reached, train on what an earlier pull installed in DEST (the
    initContainer's, for this job whatever data facts it was pulled with), provided it was pulled for
    this toolchain and every file's sha256 is still right. Returns the install and the spec it was
    pulled for (the training process finds the cache by it)."""
    found = _installed_earlier(ns, spec, error)
    if found is None:
        raise error
    result, installed_spec, facts = found
    print(
        f"warning: {error}; using the cache an earlier pull installed in {result.dest}{facts} "
        f"({result.skipped} files, sha256 verified)",
        file=sys.stderr,
    )
    return result, installed_spec


def _pulled_in_place(ns: argparse.Namespace, spec: Any) -> tuple[Any, Any] | None:
    """No service and no bucket, and DEST is not a directory `warmup warm` filled: what an earlier pull of this
    job installed there, checked as the offline fallback checks it; None when it holds none."""
    from warmup.pod.activation import read_manifest

    if not ns.dest or read_manifest(ns.dest) is not None:
        return None
    no_service = WarmupError("no service given (--server URL or WARMUP_SERVER) to download it from")
    found = _installed_earlier(ns, spec, no_service)
    if found is None:
        return None
    result, installed_spec, facts = found
    print(
        f"exec: no service given: training over the cache an earlier pull installed in {result.dest}{facts} "
        f"({result.skipped} files, sha256 verified); the run's coverage report is written, not posted",
        file=sys.stderr,
    )
    return result, installed_spec


def _installed_earlier(ns: argparse.Namespace, spec: Any, error: Exception) -> tuple[Any, Any, str] | None:
    """What an earlier pull of this job installed in DEST under this toolchain, every file's sha256 checked (a
    changed file fails with `error`: nothing to download it from): the install, the spec it was pulled for, and
    a note when that spec's data facts differ. None when DEST holds no such install."""
    from warmup.client.installing import install
    from warmup.client.local import find_installed
    from warmup.toolchain.memo import remembered_toolchain

    found = find_installed(ns.dest, spec) if ns.dest else None
    target = spec.target
    toolchain = remembered_toolchain(
        target.backend, target.device, world_size=target.world_size, directory=ns.dest
    )
    if found is None or found[0].toolchain_key != toolchain.key():
        return None
    manifest, installed_spec = found
    try:  # hashes every file; downloads nothing
        result = install(manifest, ns.dest, _Unreachable(error), trust_index=False, spec=installed_spec)
    except WarmupError:
        if isinstance(error, ServerUnreachableError):
            raise error from None
        raise
    facts = "" if installed_spec is spec else ", pulled with other data facts (--dataset) for this config"
    return result, installed_spec, facts


class _Unreachable:
    """A blob source for when the service is away: any file still to download fails the install."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def open(self, file: Any) -> Any:
        raise WarmupError(f"{file.path} is missing or changed in the cache, and {self.error}")


# --- coverage -----------------------------------------------------------------------------------


def cmd_coverage(ns: argparse.Namespace) -> int:
    from warmup.client.service import ServiceClient, signature_label

    if not ns.server:
        raise WarmupError("give the service URL: --server URL (or WARMUP_SERVER)")
    with ServiceClient(ns.server) as client:
        job = client.job(ns.job_id)
        reports = client.coverage(ns.job_id)
    if ns.format == "json":
        print(json.dumps(reports, indent=2))
        return 0
    labels = {s["key"]: signature_label(s.get("signature") or {}) for s in job.get("signatures", [])}
    rows = [
        (
            report["id"],
            str(report["created_at"])[:19].replace("T", " "),
            report.get("details", {}).get("status", "-"),
            len(report["met"]),
            len(set(report["met"]) - set(report["missed"])),
            len(report["missed"]),
            report["fresh_compiles"],
        )
        for report in reports
    ]
    headers = ("report", "created", "status", "met", "warm", "missed", "fresh compiles")
    if rows:  # a job no run has reported on: its count alone, no empty table
        print(format_table(headers, rows, right={0, 3, 4, 5, 6}))
    for report in reports:
        missed = [labels.get(key, key[:12]) for key in report["missed"]]
        if missed:
            print(f"report {report['id']} missed: {', '.join(missed)}")
    reported = [s for s in job.get("signatures", []) if s.get("source") == "coverage"]
    if reported:  # evidence: they never change the job's state
        print("\nmet by training runs, not in the spec's plan:")
        for signature in reported:
            why = f": {signature['error']}" if signature.get("error") else ""
            print(f"  {labels.get(signature['key'], signature['key'][:12])}  {signature['state']}{why}")
    gap = "\n" if rows or reported else ""
    print(f"{gap}{len(reports)} report(s) for job {short_id(job['id'])} ({job['state']})")
    return 0


__all__: Sequence[str] = ["register"]
