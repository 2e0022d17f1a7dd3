"""`warmup store check`: every blob an entry lists, against the store's copy and its sha256.

A blob is damaged when the store has no copy of it, or a copy of another size or other bytes. A
damaged blob serves no pod (every pull refuses it), so the check, unless told only to look:

- marks its row (`damaged_at`, `damage`), which `/readyz`, the status page and the metrics show, and
  which makes every API process forget the manifests it keeps in memory within a second;
- deletes the bad copy, so that storing the blob again writes a good one (`put_file` keeps a copy
  of the right size, and a flipped byte keeps the size);
- removes the entries that list it, noting why on their tasks: their jobs are no longer ready, and
  submitting them again (`warmup submit --wait`) re-warms those signatures; a pull meanwhile is told
  the job is partly warmed (`--allow-partial` takes the rest), instead of failing on the bad copy;
- removes the manifests in the bucket that name it (a worker writes them again once the job is
  complete again).

Storing the blob again, with the entry of the task that re-warmed it, clears the mark
(`TaskQueue.complete`); so does a later check that finds a good copy.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Engine, delete, exists, func, select, update
from sqlalchemy.orm import Session

from warmup.db import models as m
from warmup.db.columns import db_now
from warmup.db.engine import dialect_insert, make_sessionmaker
from warmup.db.queue import CHUNK
from warmup.errors import BlobNotFoundError
from warmup.manifest import MANIFESTS_PREFIX
from warmup.store import BlobStore

# Blobs read back at once: S3 reads are network-bound; a local disk serves a few readers as fast as one.
READERS = 8


@dataclass(frozen=True)
class Damage:
    sha256: str
    problem: str


@dataclass
class StoreCheck:
    """What a check found and did."""

    blobs_checked: int = 0
    bytes_checked: int = 0
    read_back: bool = True  # False: sizes only (`--quick`)
    damaged: list[Damage] = field(default_factory=list)
    entries_removed: int = 0
    manifests_removed: int = 0
    marks_cleared: int = 0


def check_store(
    engine: Engine,
    store: BlobStore,
    *,
    read_back: bool = True,
    repair: bool = True,
    on_damage: Callable[[Damage], None] | None = None,
) -> StoreCheck:
    """Check the blobs entries list (and those marked damaged before); with `repair`, act on what is
    found (see the module's docstring). `read_back=False` compares sizes only: one listing of the
    store, no blob read."""
    sessions = make_sessionmaker(engine)
    with sessions() as session:
        rows = session.execute(
            select(m.Blob.sha256, m.Blob.size, m.Blob.damaged_at.is_not(None).label("marked"))
            .where(exists().where(m.EntryFile.blob_sha256 == m.Blob.sha256) | m.Blob.damaged_at.is_not(None))
            .order_by(m.Blob.sha256)
        ).all()
    stored = {info.sha256: info.size for info in store.iter_blobs()}

    def problem(sha256: str, size: int) -> str | None:
        if sha256 not in stored:
            return "missing from the store"
        if stored[sha256] != size:
            return f"{stored[sha256]} bytes stored, {size} recorded"
        return store.verify(sha256, size) if read_back else None

    report = StoreCheck(read_back=read_back)
    with ThreadPoolExecutor(READERS) as pool:
        problems = list(pool.map(lambda row: problem(row.sha256, row.size), rows))
    healed: list[str] = []
    for row, found in zip(rows, problems, strict=True):
        report.blobs_checked += 1
        report.bytes_checked += stored.get(row.sha256, 0)
        if found is not None:
            damage = Damage(row.sha256, found)
            report.damaged.append(damage)
            if on_damage is not None:
                on_damage(damage)
        elif row.marked:
            healed.append(row.sha256)
    if not repair:
        return report
    with sessions.begin() as session:
        for chunk in _chunks(healed):
            session.execute(
                update(m.Blob).where(m.Blob.sha256.in_(chunk)).values(damaged_at=None, damage=None)
            )
        report.marks_cleared = len(healed)
        for damage in report.damaged:
            session.execute(
                update(m.Blob)
                .where(m.Blob.sha256 == damage.sha256)
                .values(damaged_at=db_now(), damage=damage.problem)
            )
        bad = [d.sha256 for d in report.damaged]
        for chunk in _chunks(bad):
            listing = exists().where(m.EntryFile.entry_id == m.Entry.id, m.EntryFile.blob_sha256.in_(chunk))
            entries = session.execute(
                select(m.Entry.id, m.Entry.signature_key, m.Entry.toolchain_key).where(listing)
            ).all()
            _note_on_tasks(session, [(e.signature_key, e.toolchain_key) for e in entries], chunk)
            session.execute(delete(m.Entry).where(m.Entry.id.in_([e.id for e in entries])))
            report.entries_removed += len(entries)
        # Before the commit: if the check dies between the two, the next one finds the same damage.
        for sha256 in bad:
            if sha256 in stored:
                store.delete(sha256)
    report.manifests_removed = _remove_manifests_naming(store, set(bad))
    return report


def damaged_blobs(engine: Engine) -> tuple[int, datetime | None]:
    """(blobs a check found damaged and nobody stored again yet, when the latest was found): one indexed
    read, cheap enough for every API process to ask each second."""
    with make_sessionmaker(engine)() as session:
        count, latest = session.execute(
            select(func.count(), func.max(m.Blob.damaged_at)).where(m.Blob.damaged_at.is_not(None))
        ).one()
        return int(count), latest


def _note_on_tasks(session: Session, units: list[tuple[str, str]], damaged: Iterable[str]) -> None:
    """Say on each (signature, toolchain)'s task why its entry went, keeping the task done (an entry from
    an import has no task: it gets a done one), so that submitting the job again re-queues it."""
    if not units:
        return
    names = ", ".join(sha[:12] for sha in damaged)
    note = f"entry removed by `warmup store check`: blob(s) {names} damaged in the store; submit the job to re-warm"
    for signature_key, toolchain_key in sorted(set(units)):
        session.execute(
            dialect_insert(session, m.Task)
            .values(signature_key=signature_key, toolchain_key=toolchain_key, state=m.TaskState.done)
            .on_conflict_do_nothing()
        )
        session.execute(
            update(m.Task)
            .where(
                m.Task.signature_key == signature_key,
                m.Task.toolchain_key == toolchain_key,
                m.Task.state == m.TaskState.done,
            )
            .values(error=note)
        )


def _remove_manifests_naming(store: BlobStore, damaged: set[str]) -> int:
    """Delete the bucket's manifests that list a damaged blob; returns how many."""
    if not damaged:
        return 0
    removed = 0
    for key in store.list_documents(MANIFESTS_PREFIX + "/"):
        try:
            files = json.loads(store.get_object(key)).get("files", [])
        except (BlobNotFoundError, ValueError, AttributeError):
            continue
        if any(isinstance(f, dict) and f.get("sha256") in damaged for f in files):
            store.delete_object(key)
            removed += 1
    return removed


def _chunks(items: list[str]) -> Iterable[list[str]]:
    for start in range(0, len(items), CHUNK):
        yield items[start : start + CHUNK]


__all__ = ["Damage", "StoreCheck", "check_store", "damaged_blobs"]
