"""A SeaweedFS S3 server for the benchmarks: the test fixture's, with volumes big enough for their blobs."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

from tests.fixtures.services import S3Server
from tests.fixtures.services import seaweedfs as _seaweedfs


def seaweedfs(root: Path) -> AbstractContextManager[S3Server]:
    """`weed server -s3` on free ports with its data under `root`; killed on exit."""
    return _seaweedfs(root, volume_size_mb=1024, volume_max=100)
