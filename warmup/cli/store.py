"""`warmup store check`: read the blob store back against the database (warmup/db/integrity.py).

Run against the service's database and store, like `warmup gc` (whose options it takes); server packages
are imported when it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from warmup.errors import StoreDamagedError, WarmupError

COMMANDS = ("store",)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], *, with_options: bool = True) -> None:
    """`with_options=False` names the command (for `warmup --help`) without importing the settings its
    options are generated from."""
    store = sub.add_parser("store", help="check the blob store against the entries that list its blobs")
    store_sub = store.add_subparsers(
        dest="store_command", required=True, metavar="ACTION", help="what to do with the store: check"
    )
    check = store_sub.add_parser(
        "check",
        help="read every blob an entry lists back against its sha256; remove what is damaged so that "
        "submitting its jobs again re-warms it",
        description=(
            "Reads back every blob an entry lists (and any marked damaged before) and compares it with its "
            "sha256 and size. A blob missing from the store, or stored with other bytes, is marked damaged, "
            "its bad copy deleted, the entries that list it removed (their tasks say why) and so are the "
            "bucket's manifests that name it; the jobs that needed them are no longer ready, and `warmup "
            "submit --wait` re-warms them. Exit status 0 when nothing is damaged, 3 when something is, 1 "
            "when the check could not run. docs/how-to/repair-store.md says how to repair."
        ),
    )
    check.add_argument(
        "--quick",
        action="store_true",
        help="compare the sizes the store lists only (finds missing and cut-short blobs, not altered bytes; "
        "reads no blob)",
    )
    check.add_argument(
        "--dry-run", action="store_true", help="say what is damaged and change nothing (no marks, no removal)"
    )
    if with_options:
        from warmup.settings import add_options

        add_options(check, "gc")  # the same storage locations and logging as `warmup gc`
    check.set_defaults(func=cmd_store)


def cmd_store(ns: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from warmup.db.engine import make_engine
    from warmup.db.integrity import Damage, check_store
    from warmup.db.migrate import upgrade
    from warmup.formatting import format_size
    from warmup.logs import configure_logging, redact
    from warmup.settings import settings_from
    from warmup.store import open_store

    settings = settings_from(ns, "gc")
    configure_logging(settings.log_format, settings.log_level)
    if not settings.locations_given:
        raise WarmupError(
            "give --data-dir, or --database-url and --store (or WARMUP_DATABASE_URL and WARMUP_STORE_URL)"
        )
    url = settings.resolved_database_url
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise WarmupError(f"no database at {url}: point --data-dir at the directory `warmup serve` uses")
    upgrade(url)  # as `warmup token` does: the schema of this version, whose blobs carry their damage
    store = open_store(settings.resolved_store_url)
    store.check()
    how = "sizes only (--quick)" if ns.quick else "reading each back"
    print(f"checking the blobs entries list in {store.location}, {how} ...", file=sys.stderr)

    def say(damage: Damage) -> None:
        print(f"damaged: blob {damage.sha256}: {damage.problem}", flush=True)

    engine = make_engine(url)
    try:
        report = check_store(engine, store, read_back=not ns.quick, repair=not ns.dry_run, on_damage=say)
    except SQLAlchemyError as error:
        raise WarmupError(
            f"cannot check the store against {redact(url)}: {redact(str(error).splitlines()[0])} "
            "(is it the service's database?)"
        ) from None
    finally:
        engine.dispose()
    summary = f"checked {report.blobs_checked} blobs ({format_size(report.bytes_checked)})"
    if report.marks_cleared:
        summary += f"; {report.marks_cleared} marked damaged before are whole now"
    if not report.damaged:
        print(summary + ": none damaged")
        return 0
    summary += f": {len(report.damaged)} damaged"
    if ns.dry_run:
        print(summary + "; nothing changed (--dry-run)")
    else:
        print(
            summary + f"; removed their copies, the {report.entries_removed} entries that listed them and "
            f"{report.manifests_removed} manifests in the bucket"
        )
    raise StoreDamagedError(
        f"{len(report.damaged)} blobs are damaged in {store.location}: "
        + (
            "run without --dry-run to take them out of the manifests, then "
            if ns.dry_run
            else "their jobs are not ready until re-warmed: "
        )
        + "submit those jobs again (`warmup submit --wait`); see docs/how-to/repair-store.md"
    )
