"""Retention: drop entries nobody used for long, then the blobs nothing references any more.

Safety rules, so that garbage collection never removes a blob that is about to be needed:

- A worker reserves its blobs (`TaskQueue.reserve_blobs`) before uploading them; an unreferenced blob
  is only removed once its reservation is over.
- Expiring an entry re-reserves its blobs for a grace period, so a pod that fetched a manifest just
  before can still download them.
- A blob's row is deleted, and then its object, inside one transaction: a worker reserving the same
  blob meanwhile waits for the row lock, finds the object gone afterwards and uploads it again.
- Objects in the store without a row (a crash, a reset database) are adopted as already-expired
  rows, and then go through the same path; the temp files of uploads cut off by a crash go once they
  are as old as a reservation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice

from sqlalchemy import Engine, delete, exists, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from warmup.db import models as m
from warmup.db.columns import db_now
from warmup.db.engine import dialect_insert, make_sessionmaker
from warmup.db.queue import BLOB_RESERVATION_S, CHUNK
from warmup.errors import StoreError
from warmup.store import BlobStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GarbageReport:
    blobs_deleted: int
    orphans_adopted: int
    bytes_freed: int
    stale_uploads_removed: int = 0


def expire_entries(engine: Engine, *, unused_for_s: float, blob_grace_s: float = 3600.0) -> int:
    """Delete entries whose last use is older than `unused_for_s`; returns how many. Their tasks
    stay done: submitting a spec that needs them again re-queues them."""
    sessions = make_sessionmaker(engine)
    with sessions.begin() as session:
        ids = list(
            session.execute(select(m.Entry.id).where(m.Entry.last_used_at < db_now(-unused_for_s))).scalars()
        )
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            used = select(m.EntryFile.blob_sha256).where(m.EntryFile.entry_id.in_(chunk))
            session.execute(
                update(m.Blob)
                .where(m.Blob.sha256.in_(used), m.Blob.reserved_until < db_now(blob_grace_s))
                .values(reserved_until=db_now(blob_grace_s))
            )
            session.execute(delete(m.Entry).where(m.Entry.id.in_(chunk)))
        return len(ids)


def collect_garbage(
    engine: Engine, store: BlobStore, *, orphan_age_s: float = BLOB_RESERVATION_S, limit: int = 10_000
) -> GarbageReport:
    """Delete up to `limit` blobs that no entry references and no reservation protects, from the
    database and the store. Store objects older than `orphan_age_s` that have no row are adopted
    first (objects younger than that may belong to an upload in progress)."""
    sessions = make_sessionmaker(engine)
    stale = len(store.remove_stale_uploads(datetime.now(UTC) - timedelta(seconds=orphan_age_s)).paths)
    adopted = _adopt_orphans(sessions, store, orphan_age_s)
    unreferenced = (
        m.Blob.reserved_until < db_now(),
        ~exists().where(m.EntryFile.blob_sha256 == m.Blob.sha256),
    )
    with sessions() as session:
        candidates = list(session.execute(select(m.Blob.sha256).where(*unreferenced).limit(limit)).scalars())
    deleted = freed = 0
    for sha in candidates:
        try:
            with sessions.begin() as session:
                size = session.execute(
                    delete(m.Blob).where(m.Blob.sha256 == sha, *unreferenced).returning(m.Blob.size)
                ).scalar_one_or_none()
                if size is None:  # reserved or referenced since we looked
                    continue
                store.delete(sha)  # before commit: a concurrent reservation waits for us
        except IntegrityError:  # an entry started to reference it in the meantime
            continue
        except StoreError as error:
            log.warning("could not delete blob %s from %s: %s", sha, store.location, error)
            continue
        deleted += 1
        freed += size
    return GarbageReport(
        blobs_deleted=deleted, orphans_adopted=adopted, bytes_freed=freed, stale_uploads_removed=stale
    )


def _adopt_orphans(sessions: sessionmaker[Session], store: BlobStore, orphan_age_s: float) -> int:
    cutoff = datetime.now(UTC) - timedelta(seconds=orphan_age_s)
    old = (info for info in store.iter_blobs() if info.modified < cutoff)
    adopted = 0
    while chunk := list(islice(old, CHUNK)):
        with sessions.begin() as session:
            rows = [{"sha256": b.sha256, "size": b.size, "reserved_until": db_now(-1.0)} for b in chunk]
            stmt = (
                dialect_insert(session, m.Blob).values(rows).on_conflict_do_nothing().returning(m.Blob.sha256)
            )
            adopted += len(session.execute(stmt).all())
    return adopted
