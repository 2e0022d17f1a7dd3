"""Hostile manifests and blobs served to the real pull client: every one refused, nothing written.

A server plays a compromised or buggy service: it answers the manifest request with whatever a case
says (paths that escape, wrong sizes and hashes, junk, a manifest of another spec) and serves blobs by
hash, optionally lying about their bytes. The cache directory holds a real earlier install and some
cases plant symlinks or files in it. After each refused pull, the whole tree (the cache directory and
the folder around it) is exactly as it was, and only the cases that get as far as downloading asked
for a blob at all.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.factories import cpu_toolchain
from tests.reliability.ledger import Row, record
from tests.support.pods import HostileService, hostile_service
from warmup.client.local import LOCAL_MANIFESTS_DIR, TEMP_DIR_NAME
from warmup.client.pulling import pull
from warmup.client.service import MAX_MANIFEST_BYTES
from warmup.errors import BlobIntegrityError, UnsafeArtifactError, WarmupError
from warmup.job.spec import Spec

SPEC = Spec.model_validate(
    {
        "trainer": "sft",
        "model": "tiny",
        "args": {"max_length": 64},
        "target": {"backend": "inductor", "device": "cpu"},
    }
)
TOOLCHAIN = cpu_toolchain()
GOOD = {"fxgraph/ab/fabc/entry": b"an fx graph entry\n" * 50, "ab/cabc.so": b"\x7fELF kernel" * 80}
PAYLOAD = b"hostile payload\n"
BIG_BLOB = 64 << 20  # what a server sends for a blob the manifest says is tiny


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry(path: str, data: bytes = PAYLOAD, **overrides: Any) -> dict[str, Any]:
    return {"path": path, "sha256": sha(data), "size": len(data), "url": None, **overrides}


def manifest(*files: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    return {
        "spec_key": SPEC.key(),
        "toolchain_key": TOOLCHAIN.key(),
        "toolchain": TOOLCHAIN.model_dump(mode="json"),
        "backend": "inductor",
        "device": "cpu",
        "plan_size": 1,
        "signatures": ["0" * 64],
        "missing": [],
        "files": list(files),
        **overrides,
    }


@pytest.fixture
def served() -> Iterator[tuple[HostileService, str]]:
    state = HostileService(
        manifest(*[entry(p, d) for p, d in GOOD.items()]),
        blobs={sha(data): data for data in (*GOOD.values(), PAYLOAD)},
        endless_bytes=BIG_BLOB,
    )
    with hostile_service(state) as running:
        yield running, running.url


def snapshot(root: Path) -> dict[str, tuple[str, Any]]:
    """Every entry under root: kind and content (or link target), with file modes and mtimes."""
    found: dict[str, tuple[str, Any]] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        stat = path.lstat()
        if path.is_symlink():
            found[name] = ("link", os.readlink(path))
        elif path.is_dir():
            found[name] = ("dir", stat.st_mode)
        else:
            found[name] = ("file", (stat.st_mode, stat.st_mtime_ns, sha(path.read_bytes())))
    return found


# --- the table -------------------------------------------------------------------------------------

Setup = Callable[[Path, Path, HostileService], None]  # (cache dir, the folder outside it, the server)


def paths(path: str) -> Setup:
    def setup(cache: Path, outside: Path, state: HostileService) -> None:
        state.manifest = manifest(entry("innocent.bin", b"innocent"), entry(path))
        state.blobs[sha(b"innocent")] = b"innocent"

    return setup


def answer(raw: bytes | dict[str, Any]) -> Setup:
    def setup(cache: Path, outside: Path, state: HostileService) -> None:
        state.manifest = raw

    return setup


def link(name: str, to: str, path: str) -> Setup:
    """A symlink at `name` in the cache dir to `to` outside it, and a manifest that writes to `path`."""

    def setup(cache: Path, outside: Path, state: HostileService) -> None:
        target = outside / to
        if not target.exists():
            target.mkdir() if "." not in to else target.write_bytes(b"outside, not to be touched")
        (cache / name).symlink_to(target)
        state.manifest = manifest(entry(path))

    return setup


def blob(served_bytes: bytes | None = None, *, endless: bool = False, **overrides: Any) -> Setup:
    """A manifest of one good file and one whose blob the server lies about."""

    def setup(cache: Path, outside: Path, state: HostileService) -> None:
        victim = entry("victim/kernel.so", PAYLOAD, **overrides)
        state.manifest = manifest(entry("fxgraph/ab/fabc/entry", GOOD["fxgraph/ab/fabc/entry"]), victim)
        if served_bytes is not None:
            state.lies[victim["sha256"]] = served_bytes
        if endless:
            state.endless.add(victim["sha256"])

    return setup


def file_in_the_way(cache: Path, outside: Path, state: HostileService) -> None:
    (cache / "plain").write_bytes(b"a file where the manifest wants a folder")
    state.manifest = manifest(entry("plain/inner.bin"))


def folder_in_the_way(cache: Path, outside: Path, state: HostileService) -> None:
    (cache / "folder").mkdir()
    state.manifest = manifest(entry("folder"))


@dataclass(frozen=True)
class Case:
    name: str
    setup: Setup
    error: type[WarmupError]
    match: str
    downloads: bool = False  # whether the refusal may come only after downloading (size, hash)


def deep_json(depth: int) -> bytes:
    return b'{"files": ' + b"[" * depth + b"]" * depth + b"}"


CASES = [
    # paths that would land outside the cache dir, or not where they say
    Case("dotdot", paths("../escape.bin"), UnsafeArtifactError, r"'\.\.' component"),
    Case("dotdot inside", paths("a/../../escape.bin"), UnsafeArtifactError, r"'\.\.' component"),
    Case("absolute", paths("/etc/cron.d/evil"), UnsafeArtifactError, "absolute"),
    Case("drive letter", paths("C:/Windows/evil.dll"), UnsafeArtifactError, "absolute"),
    Case("backslashes", paths("..\\..\\escape.bin"), UnsafeArtifactError, "backslash"),
    Case("NUL", paths("a.bin\x00.so"), UnsafeArtifactError, "control character"),
    Case("newline", paths("a\nb.bin"), UnsafeArtifactError, "control character"),
    Case("empty", paths(""), UnsafeArtifactError, "empty"),
    Case("empty segment", paths("a//b.bin"), UnsafeArtifactError, "empty"),
    Case("dot segment", paths("a/./b.bin"), UnsafeArtifactError, "'.'"),
    Case("trailing slash", paths("a/"), UnsafeArtifactError, "empty"),
    Case("very long path", paths("a/" * 600 + "b"), UnsafeArtifactError, "longer than 1024"),
    Case("very long name", paths("x" * 300 + ".so"), UnsafeArtifactError, "longer than 255 bytes"),
    Case("long name in bytes", paths("\u00e9" * 200), UnsafeArtifactError, "longer than 255 bytes"),
    Case("fullwidth dots", paths("\uff0e\uff0e/escape.bin"), UnsafeArtifactError, "normalises to '..'"),
    Case("fullwidth slash", paths("a\uff0f..\uff0fb"), UnsafeArtifactError, "normalises to"),
    Case("decomposed unicode", paths("caf\u0065\u0301.bin"), UnsafeArtifactError, "normal form C"),
    Case("right-to-left override", paths("evil\u202eos.bin"), UnsafeArtifactError, "invisible"),
    Case("zero-width space", paths("ker\u200bnel.so"), UnsafeArtifactError, "invisible"),
    Case("lone surrogate", paths("a\ud800.bin"), UnsafeArtifactError, "unencodable"),
    Case("the client's index", paths(".warmup-index.json"), UnsafeArtifactError, "its own state"),
    Case(
        "the client's manifests",
        paths(f"{LOCAL_MANIFESTS_DIR}/{SPEC.key()}.json"),
        UnsafeArtifactError,
        "own state",
    ),
    Case("the client's temp dir", paths(f"{TEMP_DIR_NAME}/x"), UnsafeArtifactError, "own state"),
    # symlinks in the cache dir pointing outside it
    Case("symlinked folder", link("sub", "elsewhere", "sub/evil.bin"), UnsafeArtifactError, "symlink"),
    Case("symlinked file", link("kernel.so", "victim.txt", "kernel.so"), UnsafeArtifactError, "symlink"),
    Case(
        "symlinked temp dir", link(TEMP_DIR_NAME, "tmp-elsewhere", "new.bin"), UnsafeArtifactError, "symlink"
    ),
    Case(
        "symlinked manifests dir",
        link(LOCAL_MANIFESTS_DIR + "-x", "m", "new.bin"),  # replaced below: the real dir exists already
        UnsafeArtifactError,
        "symlink",
    ),
    Case("file in the way of a folder", file_in_the_way, UnsafeArtifactError, "is a file, not a folder"),
    Case("folder in the way of a file", folder_in_the_way, UnsafeArtifactError, "not a regular file"),
    # sizes and hashes
    Case("blob bigger than listed", blob(PAYLOAD + b"and more"), BlobIntegrityError, "larger than", True),
    Case("blob that never ends", blob(endless=True), BlobIntegrityError, "larger than", True),
    Case("blob smaller than listed", blob(PAYLOAD[:5]), BlobIntegrityError, r"size 5 != expected", True),
    Case("wrong hash", blob(PAYLOAD.upper()), BlobIntegrityError, "sha256 mismatch", True),
    Case("negative size", blob(size=-1), UnsafeArtifactError, "greater than or equal to 0"),
    Case("more than the disk holds", blob(size=1 << 62), UnsafeArtifactError, "refusing to fill the disk"),
    Case(
        "same path, two contents",
        answer(manifest(entry("same.bin", b"one"), entry("same.bin", b"two"))),
        UnsafeArtifactError,
        "twice",
    ),
    Case(
        "a file that is also a folder",
        answer(manifest(entry("a/b"), entry("a/b/c.bin"))),
        UnsafeArtifactError,
        "both as a file and as a folder",
    ),
    # the manifest itself
    Case("not JSON", answer(b"<html>502 Bad Gateway</html>"), UnsafeArtifactError, "not JSON"),
    Case("a JSON list", answer([1, 2, 3]), UnsafeArtifactError, "malformed manifest"),
    Case("JSON nested too deep", answer(deep_json(100_000)), UnsafeArtifactError, "not JSON"),
    Case(
        "files is not a list", answer(manifest() | {"files": "everything"}), UnsafeArtifactError, "malformed"
    ),
    Case("size is text", answer(manifest(entry("a.bin", size="big"))), UnsafeArtifactError, "malformed"),
    Case(
        "hash is not sha256",
        answer(manifest(entry("a.bin", sha256="../../x"))),
        UnsafeArtifactError,
        "malformed",
    ),
    Case("negative plan size", answer(manifest(plan_size=-5)), UnsafeArtifactError, "malformed"),
    Case("missing fields", answer({"files": []}), UnsafeArtifactError, "malformed"),
    Case(
        "huge manifest", answer(b" " * (MAX_MANIFEST_BYTES + 1) + b"{}"), UnsafeArtifactError, "larger than"
    ),
    Case("for another spec", answer(manifest(spec_key="0" * 64)), UnsafeArtifactError, "another spec"),
    Case(
        "for another toolchain", answer(manifest(toolchain_key="1" * 64)), UnsafeArtifactError, "another spec"
    ),
]


def symlinked_manifests_dir(cache: Path, outside: Path, state: HostileService) -> None:
    """The folder of installed manifests replaced by a link outside: the next manifest would go there."""
    real = cache / LOCAL_MANIFESTS_DIR
    moved = outside / "manifests"
    real.rename(moved)
    real.symlink_to(moved)
    state.manifest = manifest(entry("new.bin"))


CASES = [
    Case(c.name, symlinked_manifests_dir, c.error, c.match) if c.name == "symlinked manifests dir" else c
    for c in CASES
]
tried = {"cases": 0, "refused": 0}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_hostile_pull_is_refused_and_writes_nothing(case: Case, served, tmp_path: Path) -> None:
    state, url = served
    root = tmp_path / "root"
    cache, outside = root / "cache", root / "outside"
    outside.mkdir(parents=True)
    (outside / "precious.txt").write_bytes(b"must not change")
    first = pull(SPEC, cache, server=url, toolchain=TOOLCHAIN)  # a real earlier install
    assert first.downloaded == len(GOOD)
    state.blob_requests = 0
    case.setup(cache, outside, state)
    before = snapshot(root)

    tried["cases"] += 1
    with pytest.raises(case.error, match=case.match) as refusal:
        pull(SPEC, cache, server=url, toolchain=TOOLCHAIN)
    tried["refused"] += 1

    assert snapshot(root) == before, f"{case.name}: the tree changed; refusal: {refusal.value}"
    if not case.downloads:
        assert state.blob_requests == 0, f"{case.name}: a blob was fetched before the refusal"
    if case.name == "blob that never ends":
        assert state.bytes_sent < 16 << 20, f"the client read {state.bytes_sent} bytes of an endless blob"


def test_a_refused_first_pull_leaves_no_cache_dir(served, tmp_path: Path) -> None:
    """With nothing installed before, a refused pull does not even leave the directory behind."""
    state, url = served
    blob(PAYLOAD.upper())(tmp_path, tmp_path, state)
    with pytest.raises(BlobIntegrityError, match="sha256 mismatch"):
        pull(SPEC, tmp_path / "new-cache", server=url, toolchain=TOOLCHAIN)
    assert not (tmp_path / "new-cache").exists()
    blob(size=1 << 62)(tmp_path, tmp_path, state)
    with pytest.raises(UnsafeArtifactError, match="fill the disk"):
        pull(SPEC, tmp_path / "new-cache", server=url, toolchain=TOOLCHAIN)
    assert not (tmp_path / "new-cache").exists()


@pytest.fixture(scope="module", autouse=True)
def _record_what_the_module_tried() -> Iterator[None]:
    """After the module's tests: one ledger row for all they tried (whichever of them ran)."""
    yield
    assert tried["cases"] == tried["refused"]  # all of CASES in a full run; fewer under -k
    if not tried["cases"]:
        return
    record(
        Row(
            scenario="hostile manifests and blobs (pull client)",
            bad_inputs=tried["cases"],
            requests=tried["cases"],
        )
    )
