"""Artifact files: hashing, safe relative paths, scanning and copying into a merged cache dir."""

from __future__ import annotations

import hashlib
import os

import pytest

from warmup.artifacts import ArtifactFile, copy_tree, list_paths, safe_relative_path, scan_files, sha256_file
from warmup.errors import UnsafeArtifactError


def test_sha256_of_a_file_larger_than_one_chunk(tmp_path):
    data = os.urandom((1 << 20) * 2 + 17)
    (tmp_path / "blob").write_bytes(data)
    assert sha256_file(tmp_path / "blob") == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    "path", ["", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a\\b", "C:/x", "a/\x00"]
)
def test_unsafe_paths_are_refused(path):
    with pytest.raises(UnsafeArtifactError):
        safe_relative_path(path)


def test_safe_paths_pass_unchanged():
    assert safe_relative_path("fxgraph/ab/key/entry") == "fxgraph/ab/key/entry"
    assert safe_relative_path(".hidden/x.so") == ".hidden/x.so"


def test_artifact_file_round_trips_and_checks_its_path():
    item = ArtifactFile("ab/c.so", "0" * 64, 12)
    assert ArtifactFile.from_dict(item.to_dict()) == item
    with pytest.raises(UnsafeArtifactError):
        ArtifactFile.from_dict({"path": "../c.so", "sha256": "0" * 64, "size": 1})


def test_scan_files_hashes_sorted_regular_files_only(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "two").write_bytes(b"22")
    (tmp_path / "a").write_bytes(b"1")
    os.symlink(tmp_path / "a", tmp_path / "link")
    files = scan_files(tmp_path)
    assert files == [
        ArtifactFile("a", hashlib.sha256(b"1").hexdigest(), 1),
        ArtifactFile("b/two", hashlib.sha256(b"22").hexdigest(), 2),
    ]
    assert scan_files(tmp_path, include=lambda p: p.startswith("b/")) == files[1:]
    assert scan_files(tmp_path / "missing") == []
    assert list_paths(tmp_path) == {"a", "b/two"}


def test_copy_tree_copies_missing_files_and_keeps_present_ones(tmp_path):
    source, dest = tmp_path / "src", tmp_path / "dest"
    (source / "ab").mkdir(parents=True)
    (source / "ab" / "k.so").write_bytes(b"built in src")
    (source / "new.py").write_bytes(b"print()")
    (dest / "ab").mkdir(parents=True)
    (dest / "ab" / "k.so").write_bytes(b"built elsewhere")  # same kernel, other build dir: both valid
    files = scan_files(source)
    assert copy_tree(source, dest, files) == ["new.py"]
    assert (dest / "ab" / "k.so").read_bytes() == b"built elsewhere"
    assert (dest / "new.py").read_bytes() == b"print()"
    assert not list(dest.rglob("*.partial"))
