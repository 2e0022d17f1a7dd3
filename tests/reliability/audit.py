"""Check that nothing was lost: every entry's files are in the store with the bytes its hash names."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.engine import Engine

from warmup.db import models as m
from warmup.store import BlobStore


@dataclass
class Audit:
    entries: int = 0
    files: int = 0
    missing: list[str] = field(default_factory=list)  # blobs an entry points at that the store lacks
    corrupt: list[str] = field(default_factory=list)  # blobs whose bytes do not hash to their key

    @property
    def lost(self) -> int:
        return len(self.missing) + len(self.corrupt)


def audit_store(engine: Engine, store: BlobStore) -> Audit:
    """Read back every blob an entry references and hash it."""
    with engine.connect() as connection:
        entries = connection.execute(select(m.Entry.id)).scalars().all()
        referenced = connection.execute(select(m.EntryFile.blob_sha256).distinct()).scalars().all()
        files = connection.execute(select(m.EntryFile.path)).scalars().all()
    audit = Audit(entries=len(entries), files=len(files))
    for sha256 in referenced:
        if not store.has(sha256):
            audit.missing.append(sha256)
            continue
        digest = hashlib.sha256()
        with store.open(sha256) as blob:
            while chunk := blob.read(1 << 20):
                digest.update(chunk)
        if digest.hexdigest() != sha256:
            audit.corrupt.append(sha256)
    return audit
