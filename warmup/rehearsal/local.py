"""Warm a whole spec into one local cache directory (what `warmup warm` does).

The directory is the merged cache: the union of every ok signature's files, laid out as the backend
reads it, so a training process uses it directly (`warmup.activate(spec, cache_dir=DIR)`). Its
manifest, `trl-warmup.json`, records the toolchain it was built under and each signature's entry;
warming the same directory again skips the signatures it already holds.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmup.artifacts import MANIFEST_NAME, ArtifactFile, copy_tree
from warmup.errors import ToolchainMismatchError
from warmup.job.spec import Spec
from warmup.pod.activation import read_manifest
from warmup.rehearsal.runner import Progress, Rehearsal, SignatureResult, rehearse_signatures, rehearse_spec
from warmup.signature import Signature
from warmup.toolchain.model import Toolchain

MANIFEST_FORMAT = 1


@dataclass
class WarmReport:
    """What `warm_directory` did: a result per planned signature (reused ones included)."""

    cache_dir: Path
    results: list[SignatureResult]
    reused: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)
    processes: int = 1  # processes per run (a job of N > 1 runs fewer: warmup/planner/topology.py)

    @property
    def ok(self) -> bool:
        return all(result.status == "ok" for result in self.results)


def warm_directory(
    spec: Spec,
    cache_dir: str | os.PathLike[str],
    *,
    signatures: list[Signature] | None = None,
    timeout_s: float = 1800.0,
    jobs: int = 1,
    work_dir: str | os.PathLike[str] | None = None,
    keep_work: bool = False,
    on_progress: Callable[[Progress], None] | None = None,
) -> WarmReport:
    """Warm every signature of `spec` (or the given ones) into `cache_dir` on this machine.

    Planning and the toolchain come from the rehearsal supervisor (it imports TRL anyway), so this
    process stays light. Raises ToolchainMismatchError, before compiling anything, when the
    directory was warmed under another toolchain.
    """
    cache = Path(cache_dir).expanduser().absolute()
    cache.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(cache) or {}
    entries: dict[str, Any] = dict(manifest.get("entries", {}))
    present = {key for key, entry in entries.items() if _entry_present(entry, cache)}

    def check_toolchain(rehearsal: Rehearsal) -> None:
        if manifest.get("toolchain") and rehearsal.toolchain is not None:
            previous = Toolchain.model_validate(manifest["toolchain"])
            if previous.key() != rehearsal.toolchain.key():
                raise ToolchainMismatchError(rehearsal.toolchain.diff(previous), what=f"toolchain of {cache}")

    work = Path(work_dir).absolute() if work_dir else cache.parent / f".{cache.name}.warmup-work"
    if work.exists():
        shutil.rmtree(work)
    if signatures is None:
        rehearsal = rehearse_spec(
            spec,
            work,
            skip=present,
            on_planned=check_toolchain,
            timeout_s=timeout_s,
            jobs=jobs,
            on_progress=on_progress,
        )
    else:
        from warmup.toolchain.probes import current_toolchain

        world = spec.target.world_size
        toolchain = current_toolchain(spec.target.backend, spec.target.device, world_size=world)
        todo = [s for s in signatures if s.key() not in present]
        done = None
        if todo:
            done = rehearse_signatures(
                spec,
                todo,
                work,
                plan_size=len(signatures),
                timeout_s=timeout_s,
                jobs=jobs,
                on_progress=on_progress,
            )
        rehearsal = Rehearsal(
            signatures,
            [],
            toolchain,
            [s.key() for s in signatures if s.key() in present],
            done.results if done else [],
            done.processes if done else 1,
        )
        check_toolchain(rehearsal)
    for result in rehearsal.results:
        if result.status == "ok" and result.cache_dir is not None:
            copy_tree(result.cache_dir, cache, result.files)
        entries[result.key] = _entry(result)
    assert rehearsal.toolchain is not None
    _write_manifest(cache, spec, rehearsal.toolchain.model_dump(mode="json"), entries)
    if not keep_work and all(r.status == "ok" for r in rehearsal.results) and work.exists():
        shutil.rmtree(work)

    by_key = {r.key: r for r in rehearsal.results}
    reused = {s.key() for s in rehearsal.signatures if s.key() not in by_key}
    results = [
        by_key.get(s.key()) or _reused_result(s, entries[s.key()], cache) for s in rehearsal.signatures
    ]
    return WarmReport(
        cache_dir=cache,
        results=results,
        reused=reused,
        warnings=rehearsal.warnings,
        processes=rehearsal.processes,
    )


def _entry(result: SignatureResult) -> dict[str, Any]:
    return {
        "signature": result.signature.model_dump(mode="json"),
        "status": result.status,
        "files": [item.to_dict() for item in result.files],
        "compile_seconds": result.compile_seconds,
        "note": result.note,
    }


def _entry_present(entry: dict[str, Any] | None, cache: Path) -> bool:
    """An ok entry whose files are all in the directory (any bytes: `.so` files differ per build dir)."""
    if not entry or entry.get("status") != "ok":
        return False
    return all((cache / item["path"]).is_file() for item in entry.get("files", []))


def _reused_result(signature: Signature, entry: dict[str, Any], cache: Path) -> SignatureResult:
    files = [ArtifactFile.from_dict(item) for item in entry.get("files", [])]
    return SignatureResult(
        key=signature.key(),
        signature=signature,
        status="ok",
        files=files,
        cache_dir=cache if files else None,
        compile_seconds=float(entry.get("compile_seconds", 0.0)),
        note="already in the cache directory",
    )


def _write_manifest(cache: Path, spec: Spec, toolchain: dict[str, Any], entries: dict[str, Any]) -> None:
    manifest = {
        "format": MANIFEST_FORMAT,
        "backend": spec.target.backend,
        "device": spec.target.device,
        "toolchain": toolchain,
        "spec_key": spec.key(),
        "entries": entries,
    }
    temp = cache / f".{MANIFEST_NAME}.partial"
    temp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    temp.replace(cache / MANIFEST_NAME)
