"""What a run met and what it compiled: each shape's first step, and the fresh compiles attributed to it.

The backend's counter (Inductor: FX graph and AOTAutograd cache misses and bypasses, and new files in the
cache dir; Neuron: the runtime's cache statistics and new NEFFs) says how many compiles the process did so
far. When a new shape is met, the compiles since the previous count belong to the shapes first met since
then (`settle`). The callback decides what a compile means (a warning, strict mode's stop); this only counts.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmup.pod.callback.report import Shape

log = logging.getLogger("warmup.pod.callback")


@dataclass
class Met:
    """A shape the run met: the step it was first met at, and whether it compiled."""

    step: int
    compiled: bool = False


@dataclass(frozen=True)
class Settled:
    """What a count found: whether anything compiled since the previous one, and the shapes it is put on."""

    compiled: bool
    shapes: list[Shape] = field(default_factory=list)


class CompileLedger:
    """The shapes a run met and the compiles put on them; safe to call from the hooks' threads."""

    def __init__(self) -> None:
        self.met: dict[Shape, Met] = {}
        self.counter: Any = None  # the backend's CompileCounter, once counting started
        self._lock = threading.Lock()
        self._pending: set[Shape] = set()
        self._fresh_total = 0

    def start_counting(self, backend: str, device: str, cache_dir: Path) -> None:
        """Count from now on (once: a later call keeps the first counter and its baseline)."""
        if self.counter is not None:
            return
        from warmup.backends.registry import get_backend

        try:
            self.counter = get_backend(backend, device).counter(cache_dir)
        except Exception as error:
            log.warning("trl-warmup: cannot count compiles in %s (%s)", cache_dir, error)

    def meet(self, shape: Shape, step: int) -> bool:
        """Record `shape` as met at `step`; False if it was met before."""
        with self._lock:
            if shape in self.met:
                return False
            self.met[shape] = Met(step=step)
            self._pending.add(shape)
            return True

    def has_pending(self) -> bool:
        return bool(self._pending)

    def settle(self) -> Settled | None:
        """Count the compiles since the previous count and put them on the shapes first met since then; None
        when nothing counts (no counter, or the count failed)."""
        if self.counter is None:
            return None
        try:
            total = self.counter.fresh().total
        except Exception as error:
            log.debug("trl-warmup: counting compiles failed: %s", error)
            return None
        with self._lock:
            compiled = total > self._fresh_total
            self._fresh_total = total
            pending, self._pending = self._pending, set()
        if not compiled:
            return Settled(compiled=False)
        shapes = sorted(pending)
        for shape in shapes:
            self.met[shape].compiled = True
        return Settled(compiled=True, shapes=shapes)

    def fresh(self) -> Any:
        """The counter's FreshCompiles (None before counting started)."""
        return self.counter.fresh() if self.counter is not None else None
