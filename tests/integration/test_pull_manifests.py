"""Manifests of several entries: a C++ kernel two rehearsals built is one file with two valid contents
(g++ embeds the build directory), any other disagreement is refused."""

from __future__ import annotations

import hashlib

import pytest

from tests.fixtures.factories import cpu_toolchain
from tests.support.tiny_model import write_tiny_model
from warmup.db.engine import make_engine
from warmup.db.manifests import build_manifest
from warmup.db.queue import TaskQueue
from warmup.db.records import FileRef, Keyed
from warmup.db.repository import Repository
from warmup.errors import UnsafeArtifactError
from warmup.job.spec import load_spec
from warmup.planner.planning import plan_spec

TOOLCHAIN = cpu_toolchain()


def ref(path: str, content: bytes) -> FileRef:
    return FileRef(path=path, sha256=hashlib.sha256(content).hexdigest(), size=len(content))


@pytest.mark.parametrize(
    ("shared", "allowed"), [("7x/c7xabc.main.so", True), ("fxgraph/7x/f7x/entry", False)]
)
def test_a_shared_kernel_built_twice_is_no_conflict_but_other_files_are(db_url, tmp_path, shared, allowed):
    spec = load_spec(
        {
            "trainer": "sft",
            "model": str(write_tiny_model(tmp_path / "model")),
            "args": {"per_device_train_batch_size": 2, "max_length": 64, "pad_to_multiple_of": 32},
            "data": {"num_train_examples": 8, "min_tokens": 10, "max_tokens": 60},
        }
    )
    signatures = plan_spec(spec).signatures
    engine = make_engine(db_url)
    queue = TaskQueue(engine)
    queue.submit_job(Keyed.of(spec), Keyed.of(TOOLCHAIN), [Keyed.of(s) for s in signatures])
    for build in (b"built in /work/run-1", b"built in /work/run-2"):
        task = queue.claim("w", TOOLCHAIN.key(), lease_s=60)
        files = [ref(shared, build), ref(f"own/{task.signature_key}", b"own")]
        queue.reserve_blobs(files)
        queue.complete(task.id, "w", files, compile_seconds=1.0)
    keys = [s.key() for s in signatures]
    build = lambda: build_manifest(  # noqa: E731
        Repository(engine),
        None,
        spec_key=spec.key(),
        toolchain=Keyed.of(TOOLCHAIN),
        signature_keys=keys,
        plan_size=2,
    )
    if allowed:
        manifest = build()
        shared_files = [f for f in manifest.files if f.path == shared]
        assert len(manifest.files) == 3 and len(shared_files) == 1
    else:
        with pytest.raises(UnsafeArtifactError, match="disagree"):
            build()
    engine.dispose()
