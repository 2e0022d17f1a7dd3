"""The service side of the `warmup` command: serve, worker, submit, toolchain, token, gc.

Server packages (fastapi, sqlalchemy, boto3) are imported inside the commands that need them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from warmup.errors import WarmupError

# `warmup submit` exit codes that CI can branch on.
EXIT_READY, EXIT_INVALID, EXIT_FAILED, EXIT_TIMEOUT = 0, 2, 3, 4


def register(sub: argparse._SubParsersAction) -> None:
    from warmup.cli import add_spec_arguments

    serve = sub.add_parser(
        "serve", help="run the service (embedded default: SQLite, local blobs, in-process worker)"
    )
    # Unset options fall back to WARMUP_* environment variables (api.settings.Settings), then defaults.
    serve.add_argument("--data-dir", type=Path, help="SQLite file and blob directory (default ./data)")
    serve.add_argument("--host", help="default 127.0.0.1")
    serve.add_argument("--port", type=int, help="default 8000")
    serve.add_argument("--database-url", help="PostgreSQL URL instead of the SQLite file")
    serve.add_argument("--store", dest="store_url", help="s3://bucket/prefix instead of the blob directory")
    serve.add_argument(
        "--auth",
        choices=["required", "off", "auto"],
        help="bearer tokens: 'auto' (default) requires them unless listening on loopback only",
    )
    serve.add_argument("--no-worker", action="store_true", help="do not run the in-process Inductor worker")
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="claim and warm tasks (one process per NeuronCore group)")
    add_worker_arguments(worker)
    worker.set_defaults(func=cmd_worker)

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
    toolchain.add_argument("--backend", choices=["neuron", "inductor"], default="inductor")
    toolchain.add_argument("--device", choices=["neuron", "cuda", "cpu"], default=None)
    toolchain.set_defaults(func=cmd_toolchain)

    token = sub.add_parser(
        "token", help="create, list and revoke API tokens (run against the server's database)"
    )
    token_sub = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = token_sub.add_parser("create", help="create a token and print it (shown once)")
    create.add_argument(
        "--scope", action="append", required=True, choices=["read", "submit", "worker", "admin"]
    )
    create.add_argument("--name", default="token")
    listing = token_sub.add_parser("list", help="list tokens (never their values)")
    revoke = token_sub.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("token_id")
    for parser in (create, listing, revoke):
        parser.add_argument("--data-dir", type=Path, default=Path("./data"))
        parser.add_argument("--database-url", default=os.environ.get("WARMUP_DATABASE_URL"))
    token.set_defaults(func=cmd_token)

    gc = sub.add_parser(
        "gc",
        help="retention: remove entries unused for N days, then blobs no entry references (safe while "
        "workers upload)",
    )
    gc.add_argument(
        "--unused-days", type=float, required=True, help="remove entries no manifest listed for this long"
    )
    gc.add_argument(
        "--data-dir", type=Path, help="embedded setup: the `warmup serve` data dir (SQLite + blobs)"
    )
    gc.add_argument("--database-url", default=os.environ.get("WARMUP_DATABASE_URL"))
    gc.add_argument("--store", dest="store_url", default=os.environ.get("WARMUP_STORE_URL"))
    gc.add_argument(
        "--grace-hours",
        type=float,
        default=1.0,
        help="blobs of removed entries stay this long for pods that just read a manifest; a later gc "
        "removes them",
    )
    gc.add_argument(
        "--orphan-age-hours",
        type=float,
        default=6.0,
        help="store objects the database does not know are removed once this old (younger ones may "
        "be uploads in progress)",
    )
    gc.set_defaults(func=cmd_gc)


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        default=os.environ.get("WARMUP_DATABASE_URL"),
        help="SQLAlchemy URL of the service's database (WARMUP_DATABASE_URL)",
    )
    parser.add_argument(
        "--store",
        dest="store_url",
        default=os.environ.get("WARMUP_STORE_URL"),
        help="blob store: s3://bucket/prefix or a directory (WARMUP_STORE_URL)",
    )
    parser.add_argument(
        "--data-dir", type=Path, help="embedded setup: the `warmup serve` data dir (SQLite + blobs)"
    )
    parser.add_argument("--backend", choices=["inductor", "neuron"], default="inductor")
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda", "neuron"],
        default=None,
        help="default: neuron for the neuron backend, cuda when available, else cpu",
    )
    parser.add_argument("--pool", help="name of the worker pool this worker serves")
    parser.add_argument("--concurrency", type=int, default=1, help="worker processes on this host")
    parser.add_argument(
        "--lease", type=float, default=120.0, help="task lease in seconds (renewed by heartbeats)"
    )
    parser.add_argument("--task-timeout", type=float, default=3600.0, help="time limit of one rehearsal")
    parser.add_argument(
        "--grace", type=float, default=60.0, help="on SIGTERM, time to finish the current task"
    )
    parser.add_argument("--exit-when-idle", action="store_true", help="exit once no task is waiting")
    parser.add_argument(
        "--max-attempts", type=int, default=3, help="tries of a task that crashes or times out"
    )
    parser.add_argument("--retry-delay", type=float, default=30.0, help="seconds before a retry (doubling)")
    parser.add_argument("--poll-interval", type=float, default=2.0, help="seconds between claims when idle")
    parser.add_argument(
        "--world-sizes",
        default="1",
        help="comma-separated numbers of training processes this host rehearses (under torchrun beyond 1)",
    )


# --- serve ------------------------------------------------------------------------------------


def cmd_serve(ns: argparse.Namespace) -> int:
    import uvicorn

    from api.app import create_app
    from api.services import Services
    from api.settings import Settings
    from warmup.logs import configure_logging, redact

    given = {
        name: getattr(ns, name)
        for name in ("data_dir", "host", "port", "database_url", "store_url", "auth")
        if getattr(ns, name) is not None
    }
    try:
        settings = Settings(**given)
    except ValueError as error:
        raise WarmupError(f"refusing to start: {redact(str(error))}") from None
    configure_logging(settings.log_format, settings.log_level)
    services = Services.start(settings)
    worker = None
    if not ns.no_worker:
        from worker.loop import Worker, WorkerOptions
        from worker.main import default_device

        options = WorkerOptions(
            database_url=settings.resolved_database_url,
            store_url=settings.resolved_store_url,
            backend="inductor",
            device=default_device("inductor"),
            pool="embedded",
            work_dir=settings.data_dir / "work",
        )
        options.work_dir.mkdir(parents=True, exist_ok=True)
        worker = Worker(options, engine=services.engine, store=services.store)
        threading.Thread(target=worker.run, name="embedded-worker", daemon=True).start()
    auth = "required" if settings.auth_required else "off"
    print(
        redact(
            f"trl-warmup on http://{settings.host}:{settings.port} (database {settings.resolved_database_url}, "
            f"store {settings.resolved_store_url}, auth {auth}"
            + (f", worker: {worker.toolchain.short}" if worker else ", no worker")
            + ")"
        ),
        file=sys.stderr,
    )
    try:
        # log_config=None: uvicorn's loggers go through ours (one format, secrets redacted).
        uvicorn.run(
            create_app(services=services),
            host=settings.host,
            port=settings.port,
            log_config=None,
            log_level=settings.log_level.lower(),
        )
    finally:
        if worker is not None:
            worker.stop.set()
        services.close()
    return 0


# --- worker -----------------------------------------------------------------------------------


def cmd_worker(ns: argparse.Namespace) -> int:
    from worker.main import run

    return run(ns)


# --- toolchain --------------------------------------------------------------------------------


def cmd_toolchain(ns: argparse.Namespace) -> int:
    from warmup.toolchain import current_toolchain

    device = ns.device or ("neuron" if ns.backend == "neuron" else "cpu")
    print(json.dumps(current_toolchain(ns.backend, device).model_dump(mode="json"), indent=2))
    return 0


# --- submit -----------------------------------------------------------------------------------


def cmd_submit(ns: argparse.Namespace) -> int:
    from warmup.cli import load_spec_from_args
    from warmup.client import ServiceClient

    if not ns.server:
        raise WarmupError("give the service URL: --server URL (or WARMUP_SERVER)")
    spec = load_spec_from_args(ns)
    toolchain: dict[str, Any] | None = None
    if ns.toolchain is not None:
        toolchain = json.loads(ns.toolchain.read_text())
    elif ns.pool is None:
        from warmup.toolchain import current_toolchain

        target = spec.target
        toolchain = current_toolchain(target.backend, target.device, world_size=target.world_size).model_dump(
            mode="json"
        )
    with ServiceClient(ns.server) as client:
        job = client.submit(
            spec.model_dump(mode="json"), toolchain=toolchain, pool=ns.pool, retry_failed=ns.retry_failed
        )
        print(f"job {job['id']}: {_counts_line(job)}", file=sys.stderr)
        if not ns.wait:
            print(job["id"])
            return _exit_code(job)
        return _follow(client, job, ns.timeout)


def _follow(client: Any, job: dict[str, Any], timeout: float) -> int:
    """Poll the job until it is ready or failed, showing progress; exit codes for CI."""
    started = time.monotonic()
    progress = _ProgressLine(sys.stderr)
    while job["state"] not in ("ready", "failed"):
        elapsed = time.monotonic() - started
        if elapsed > timeout:
            progress.done()
            print(f"timed out after {timeout:.0f}s: {_counts_line(job)}", file=sys.stderr)
            return EXIT_TIMEOUT
        progress.show(f"{_counts_line(job)} | elapsed {_duration(elapsed)}{_remaining(job)}")
        time.sleep(2.0)
        job = client.job(job["id"])
    progress.done()
    print(
        f"job {job['id']} {job['state']}: {_counts_line(job)} in {_duration(time.monotonic() - started)}",
        file=sys.stderr,
    )
    for signature in job.get("signatures", []):
        if signature["state"] == "failed":
            label = _label(signature)
            print(
                f"  failed: {label}: {signature.get('error')} (log: GET /v1/tasks/{signature['task_id']}/log)",
                file=sys.stderr,
            )
    return _exit_code(job)


def _exit_code(job: dict[str, Any]) -> int:
    return EXIT_FAILED if job["state"] == "failed" else EXIT_READY


def _counts_line(job: dict[str, Any]) -> str:
    counts = job.get("counts", {})
    total = sum(counts.values())
    return (
        f"{counts.get('ready', 0)}/{total} ready, {counts.get('running', 0)} running, "
        f"{counts.get('queued', 0)} queued, {counts.get('failed', 0)} failed"
    )


def _remaining(job: dict[str, Any]) -> str:
    """Remaining time from the compile seconds of what is done, spread over the running workers."""
    done = [
        s["compile_seconds"]
        for s in job.get("signatures", [])
        if s["state"] == "ready" and s["compile_seconds"]
    ]
    counts = job.get("counts", {})
    left = counts.get("queued", 0) + counts.get("running", 0)
    if not done or not left:
        return ""
    parallel = max(1, counts.get("running", 0))
    return f" | ~{_duration(sum(done) / len(done) * left / parallel)} left"


def _label(signature: dict[str, Any]) -> str:
    doc = signature.get("signature") or {}
    label = f"{doc.get('phase')} {doc.get('batch')}x{doc.get('seq_len')}"
    return f"{label} cache {doc['cache_len']}" if doc.get("cache_len") else label


def _duration(seconds: float) -> str:
    from warmup.cli import format_duration

    return format_duration(seconds)


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


# --- token ------------------------------------------------------------------------------------


def cmd_token(ns: argparse.Namespace) -> int:
    import uuid

    from warmup.db.engine import make_engine
    from warmup.db.migrate import upgrade
    from warmup.db.tokens import TokenStore

    url = ns.database_url or f"sqlite:///{(ns.data_dir / 'warmup.db').resolve()}"
    upgrade(url)
    engine = make_engine(url)
    tokens = TokenStore(engine)
    try:
        if ns.token_command == "create":
            try:
                info, token = tokens.create(ns.name, ns.scope)
            except ValueError as error:
                raise WarmupError(str(error)) from None
            print(
                f"created token {info.id} ({info.name}, scopes {', '.join(info.scopes)}); it is shown only once:",
                file=sys.stderr,
            )
            print(token)
        elif ns.token_command == "list":
            for info in tokens.list():
                state = f"revoked {info.revoked_at:%Y-%m-%d}" if info.revoked_at else "active"
                print(f"{info.id}  {info.name:<20} {','.join(info.scopes):<24} {state}")
        else:
            try:
                token_id = uuid.UUID(ns.token_id)
            except ValueError:
                raise WarmupError(f"{ns.token_id!r} is not a token id (see `warmup token list`)") from None
            if not tokens.revoke(token_id):
                raise WarmupError(f"no active token {token_id}")
            print(f"revoked {token_id}", file=sys.stderr)
    finally:
        engine.dispose()
    return 0


# --- gc ---------------------------------------------------------------------------------------


def cmd_gc(ns: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from api.settings import Settings
    from warmup.db.engine import make_engine
    from warmup.db.retention import collect_garbage, expire_entries
    from warmup.logs import configure_logging, redact
    from warmup.store import open_store

    configure_logging()
    if ns.unused_days <= 0:
        raise WarmupError("--unused-days must be more than 0")
    if ns.data_dir is None and not (ns.database_url and ns.store_url):
        raise WarmupError(
            "give --data-dir, or --database-url and --store (or WARMUP_DATABASE_URL and WARMUP_STORE_URL)"
        )
    locations = {"data_dir": ns.data_dir, "database_url": ns.database_url, "store_url": ns.store_url}
    settings = Settings(**{k: v for k, v in locations.items() if v is not None})
    url = settings.resolved_database_url
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise WarmupError(f"no database at {url}: point --data-dir at the directory `warmup serve` uses")
    engine = make_engine(url)
    try:
        store = open_store(settings.resolved_store_url)
        store.check()
        expired = expire_entries(
            engine, unused_for_s=ns.unused_days * 86400, blob_grace_s=ns.grace_hours * 3600
        )
        report = collect_garbage(engine, store, orphan_age_s=ns.orphan_age_hours * 3600)
    except SQLAlchemyError as error:
        first = str(error).splitlines()[0]
        raise WarmupError(
            f"cannot collect garbage in {redact(url)}: {redact(first)} (is it the service's database?)"
        ) from None
    finally:
        engine.dispose()
    print(
        f"expired {expired} entries unused for {ns.unused_days:g} days; deleted {report.blobs_deleted} "
        f"blobs ({report.bytes_freed} bytes); adopted {report.orphans_adopted} orphaned store objects; "
        f"removed {report.stale_uploads_removed} files of cut-off uploads"
    )
    return 0
