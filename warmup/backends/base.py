"""What every compile backend provides to warm-up workers and training processes.

A backend knows where its compile cache lives, which environment and in-process settings make a
process use (and hit) a given cache directory, which files of that directory are artifacts, and how
to count the compiles a running process still had to do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from warmup.artifacts import ArtifactFile, list_paths

# Dynamo's defaults (torch._dynamo.config); a plan larger than these needs more.
DYNAMO_RECOMPILE_LIMIT = 8
DYNAMO_ACCUMULATED_RECOMPILE_LIMIT = 256


def recompile_limits(plan_size: int) -> tuple[int, int]:
    """(recompile_limit, accumulated_recompile_limit) for a plan of `plan_size` signatures.

    Dynamo keeps one compiled entry per shape for each code object it compiles (the model forward and
    the resume functions after graph breaks); past `recompile_limit` a new shape silently runs eager.
    Every signature of a plan can reach the same code object, so the limit is the plan's size plus
    headroom; the accumulated limit covers every code object of a forward together.
    """
    per_code = max(DYNAMO_RECOMPILE_LIMIT, plan_size + 8)
    return per_code, max(DYNAMO_ACCUMULATED_RECOMPILE_LIMIT, 16 * per_code)


@dataclass(frozen=True)
class FreshCompiles:
    """The compiles a process did since counting started: cache misses by kind, and new cache files."""

    counts: Mapping[str, int] = field(default_factory=dict)
    new_files: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.counts.values()) + len(self.new_files)

    def __bool__(self) -> bool:
        return self.total > 0

    def describe(self) -> str:
        if not self:
            return "no fresh compiles"
        parts = [f"{name}={count}" for name, count in sorted(self.counts.items()) if count]
        if self.new_files:
            shown = ", ".join(self.new_files[:5]) + (" ..." if len(self.new_files) > 5 else "")
            parts.append(f"{len(self.new_files)} new file(s): {shown}")
        return "; ".join(parts)


@runtime_checkable
class CompileCounter(Protocol):
    """Counts fresh compiles from the moment it was made."""

    def fresh(self) -> FreshCompiles: ...


class CacheCompileCounter:
    """Fresh compiles since construction: the backend's cache-miss counts, and new artifact files in the
    cache dir (Inductor's counters say "hit" even when g++ rebuilt a kernel; new files do not lie)."""

    def __init__(
        self,
        is_artifact: Callable[[str], bool],
        cache_dir: Path,
        read_counts: Callable[[], dict[str, int]],
    ) -> None:
        self.is_artifact = is_artifact
        self.cache_dir = cache_dir
        self.read_counts = read_counts
        self._start_counts = read_counts()
        self._start_files = list_paths(cache_dir)

    def fresh(self) -> FreshCompiles:
        now = self.read_counts()
        counts = {name: now[name] - self._start_counts.get(name, 0) for name in now}
        new_files = sorted(
            path for path in list_paths(self.cache_dir) - self._start_files if self.is_artifact(path)
        )
        return FreshCompiles(counts=counts, new_files=tuple(new_files))


@runtime_checkable
class Backend(Protocol):
    name: str
    cache_env_var: str

    def default_cache_dir(self) -> Path:
        """Where the backend caches when nothing is set."""
        ...

    def env(self, cache_dir: str | Path, plan_size: int) -> dict[str, str]:
        """Environment variables a process needs to use (and hit) `cache_dir` for a plan of this size."""
        ...

    def configure_process(self, cache_dir: str | Path, plan_size: int) -> dict[str, str]:
        """Apply it all in this process (environment and already-imported configs); returns the env set."""
        ...

    def is_artifact(self, relative_path: str) -> bool:
        """Whether a file of the cache dir belongs in an entry (not a lock, temp or partial file)."""
        ...

    def collect(self, cache_dir: str | Path) -> list[ArtifactFile]:
        """The artifact files of a cache dir, hashed."""
        ...

    def counter(self, cache_dir: str | Path) -> CompileCounter:
        """Start counting fresh compiles in this process (cache misses and new files in `cache_dir`)."""
        ...
