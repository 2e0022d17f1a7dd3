"""The service's own commands: serve, worker, token and gc.

Their options are generated from `warmup.settings.Settings` (one place for every setting, with its
WARMUP_* variable); server packages (fastapi, sqlalchemy, boto3) are imported inside the commands.
"""

from __future__ import annotations

import argparse
import sys
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from warmup.errors import WarmupError
from warmup.formatting import short_id

if TYPE_CHECKING:
    from uvicorn import Server

    from warmup.api.services import Services
    from warmup.settings import Command, Settings
    from warmup.worker.loop import Worker

COMMANDS = ("serve", "worker", "token", "gc")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], *, with_options: bool = True) -> None:
    """The service's commands; `with_options=False` names them (for `warmup --help`) without importing
    the settings their options are generated from."""

    def add_options(parser: argparse.ArgumentParser, command: Command) -> None:
        if with_options:
            from warmup.settings import add_options

            add_options(parser, command)

    serve = sub.add_parser(
        "serve", help="run the service (embedded default: SQLite, local blobs, in-process worker)"
    )
    add_options(serve, "serve")
    serve.add_argument("--no-worker", action="store_true", help="do not run the in-process Inductor worker")
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="claim and warm tasks (one process per NeuronCore group)")
    add_options(worker, "worker")
    worker.set_defaults(func=cmd_worker)

    token = sub.add_parser(
        "token", help="create, list and revoke API tokens (run against the server's database)"
    )
    token_sub = token.add_subparsers(
        dest="token_command", required=True, metavar="ACTION", help="create, list or revoke"
    )
    create = token_sub.add_parser("create", help="create a token and print it (shown once)")
    create.add_argument(
        "--scope",
        action="append",
        required=True,
        choices=["read", "submit", "worker", "admin"],
        help="what the token may do; repeat for several (docs/how-to/tokens.md)",
    )
    create.add_argument("--name", default="token", help="a label to tell tokens apart in `token list`")
    listing = token_sub.add_parser("list", help="list tokens (never their values)")
    revoke = token_sub.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("token_id", help="the token's id, as `warmup token list` shows it")
    for parser in (create, listing, revoke):
        add_options(parser, "token")
    token.set_defaults(func=cmd_token)

    gc = sub.add_parser(
        "gc",
        help="retention: remove entries unused for N days, then blobs no entry references (safe while "
        "workers upload)",
    )
    gc.add_argument(
        "--unused-days", type=float, required=True, help="remove entries no manifest listed for this long"
    )
    add_options(gc, "gc")
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


# --- serve ------------------------------------------------------------------------------------


def cmd_serve(ns: argparse.Namespace) -> int:
    import uvicorn

    from warmup.api.app import create_app
    from warmup.api.services import Services
    from warmup.logs import configure_logging, redact
    from warmup.settings import settings_from

    try:
        settings = settings_from(ns, "serve")
    except WarmupError as error:
        raise WarmupError(redact(str(error))) from None
    configure_logging(settings.log_format, settings.log_level)
    services = Services.start(settings, warm_up=False)
    auth = "required" if settings.auth_required else "off"
    print(
        redact(
            f"trl-warmup on http://{settings.host}:{settings.port} (database {settings.resolved_database_url}, "
            f"store {settings.resolved_store_url}, auth {auth}"
            + (", no worker" if ns.no_worker else ", worker: starting")
            + ")"
        ),
        file=sys.stderr,
    )
    # log_config=None: uvicorn's loggers go through ours (one format, secrets redacted).
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(services=services),
            host=settings.host,
            port=settings.port,
            log_config=None,
            log_level=settings.log_level.lower(),
        )
    )
    starting = _Starting(services, settings, with_worker=not ns.no_worker, server=server)
    threading.Thread(target=starting.run, name="start-up", daemon=True).start()
    try:
        server.run()
    finally:
        starting.stop.set()
        services.close()
    if starting.failed is not None:
        raise starting.failed
    if not server.started:
        return 3  # uvicorn's start-up failure (the port taken): it said why
    return 0


class _Starting:
    """What `serve` does once it listens: importing TRL and torch, then the embedded worker's toolchain
    (seconds, a minute on a loaded machine), while /readyz says which (`Services.starting`). A restart is
    then answered at once, and clients wait on /readyz or their retries, not on a refused connection. A
    failure stops the server and is the command's error, as it was when it came before listening."""

    def __init__(self, services: Services, settings: Settings, *, with_worker: bool, server: Server) -> None:
        self.services, self.settings, self.with_worker, self.server = services, settings, with_worker, server
        self.stop = threading.Event()  # the server stopped: the worker claims nothing new
        self.failed: BaseException | None = None
        services.starting = "importing TRL and torch"  # before the server listens: never ready too soon

    def run(self) -> None:
        worker = None
        try:
            self.services.warm_up()
            if self.with_worker:
                self.services.starting = "computing the worker's toolchain"
                worker = self._worker()
        except BaseException as error:  # not ready, ever: the server stops and the command says why
            self.failed = error
            self.server.should_exit = True
            return
        self.services.starting = None
        if worker is not None and not self.stop.is_set():
            worker.run()

    def _worker(self) -> Worker:
        from warmup.worker.loop import Worker, WorkerOptions

        work_dir = self.settings.data_dir / "work"
        work_dir.mkdir(parents=True, exist_ok=True)
        options = WorkerOptions.from_settings(
            self.settings.model_copy(update={"backend": "inductor", "device": None}),
            pool="embedded",
            work_dir=work_dir,
        )
        return Worker(options, engine=self.services.engine, store=self.services.store, stop=self.stop)


# --- worker -----------------------------------------------------------------------------------


def cmd_worker(ns: argparse.Namespace) -> int:
    from warmup.settings import settings_from
    from warmup.worker.main import run

    return run(settings_from(ns, "worker"), ns.command_argv)


# --- token ------------------------------------------------------------------------------------


def _token_id(given: str, ids: list[uuid.UUID]) -> uuid.UUID:
    """A token's id from its full form or a prefix only it has (`warmup token list` shows the first 8)."""
    digits = given.strip().lower().replace("-", "")
    if len(digits) < 4 or not all(c in "0123456789abcdef" for c in digits):
        raise WarmupError(
            f"{given!r} is not a token id: give the id `warmup token list` shows (4 or more of its characters)"
        )
    found = [token_id for token_id in ids if token_id.hex.startswith(digits)]
    if not found:
        raise WarmupError(f"no token {given} (see `warmup token list`)")
    if len(found) > 1:
        raise WarmupError(
            f"token id prefix {given!r} is ambiguous: {', '.join(str(t) for t in found)} start with it; give more of it"
        )
    return found[0]


def cmd_token(ns: argparse.Namespace) -> int:
    from warmup.db.engine import make_engine
    from warmup.db.migrate import upgrade
    from warmup.db.tokens import TokenStore
    from warmup.settings import settings_from

    url = settings_from(ns, "token").resolved_database_url
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
                print(f"{short_id(info.id)}  {info.name:<20} {','.join(info.scopes):<24} {state}")
        else:
            token_id = _token_id(ns.token_id, [info.id for info in tokens.list()])
            if not tokens.revoke(token_id):
                raise WarmupError(f"no active token {short_id(token_id)}")
            print(f"revoked {token_id}", file=sys.stderr)
    finally:
        engine.dispose()
    return 0


# --- gc ---------------------------------------------------------------------------------------


def cmd_gc(ns: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from warmup.db.engine import make_engine
    from warmup.db.retention import collect_garbage, expire_entries
    from warmup.logs import configure_logging, redact
    from warmup.settings import settings_from
    from warmup.store import open_store

    settings = settings_from(ns, "gc")
    configure_logging(settings.log_format, settings.log_level)
    if ns.unused_days <= 0:
        raise WarmupError("--unused-days must be more than 0")
    if not settings.locations_given:
        raise WarmupError(
            "give --data-dir, or --database-url and --store (or WARMUP_DATABASE_URL and WARMUP_STORE_URL)"
        )
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
