"""Serving (the training process): load the artifacts made for the backbone's class and config when
accelerate compiles the model, and run the first one whose guards accept a call, else the backbone compiled
on its own."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmup._compat import torch as compat_torch
from warmup.errors import IncompatibleLibraryError
from warmup.trace_skip.artifacts import (
    FORMAT,
    OFF_MARKER,
    SPLIT_MARKER,
    TRACE_DIR,
    autocast_arguments,
    autocast_state,
    describe_call,
    load_artifact,
    outside_autocast,
)
from warmup.trace_skip.split import (
    Split,
    is_plain,
    on_compiled_module,
    on_module_compiled_in_place,
    remove_hook,
    split_backbone,
    unavailable_reason,
)

log = logging.getLogger(__name__)


@dataclass
class TraceSkip:
    """What the trace skip did in this process: artifacts loaded, refused (and why), calls served."""

    cache_dir: Path
    available: int = 0
    loaded: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0
    traced_because: dict[str, int] = field(default_factory=dict)  # why calls an artifact was made for traced
    load_seconds: float = 0.0
    off: str | None = None
    # per module: each loaded artifact, the autocast regions its call was made in, and that call
    _functions: dict[int, list[tuple[Any, tuple[tuple[str, str], ...], str | None]]] = field(
        default_factory=dict, repr=False
    )
    _loaded: dict[Path, Any] = field(default_factory=dict, repr=False)  # by artifact, for every module
    _records: list[tuple[Path, dict[str, Any]]] | None = field(default=None, repr=False)

    def refuse(self, reason: str, count: int = 1) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + count

    def describe(self) -> str:
        if self.off is not None:
            return f"trace skip off ({self.off})" + (f"; {self.misses} call(s) traced" if self.misses else "")
        text = f"trace skip: {self.hits} call(s) served without tracing, {self.misses} traced"
        text += f"; {self.loaded} of {self.available} artifact(s) loaded in {self.load_seconds:.2f} s"
        if self.refused:
            text += "; refused: " + ", ".join(f"{n} {why}" for why, n in sorted(self.refused.items()))
        if self.traced_because:
            text += "; traced: " + ", ".join(f"{n} {why}" for why, n in sorted(self.traced_because.items()))
        return text

    def wrap(self, compiled: Any) -> None:
        """Split a freshly compiled model's backbone as the rehearsal did, and load the artifacts made for
        its class and config (before the first forward; none when the trace skip is off: then every call
        goes to the backbone compiled on its own, the graph the rehearsal compiled)."""
        try:
            split = split_backbone(compiled, self.serve)
        except IncompatibleLibraryError as error:  # this torch lacks what the split reaches: nothing to split
            self.off = str(error)
            log.warning("trace skip off: %s", error)
            return
        if split is None or self.off is not None:
            return
        module = split.module
        cls = type(module)
        mine = [r for r in self.records() if r[1]["module"] == f"{cls.__module__}.{cls.__qualname__}"]
        digest = split.digest
        functions = []
        start = time.perf_counter()
        for path, record in mine:
            if record["config"] != digest:
                self.refuse("for another model config")
                continue
            # A loaded artifact takes its module as an argument and refers only to the class's functions:
            # another model of the same class and config (DPO's reference model) shares it.
            if path not in self._loaded:
                try:
                    self._loaded[path] = load_artifact(path.read_bytes(), module)
                except Exception as error:  # an artifact that does not load is a miss, never a crash
                    self.refuse(f"not loadable ({type(error).__name__})")
                    continue
                self.loaded += 1
            made_in = tuple(tuple(region) for region in record.get("autocast", ()))
            functions.append((self._loaded[path], made_in, record.get("call")))
        self.load_seconds += time.perf_counter() - start
        self._functions[id(module)] = functions

    def serve(self, split: Split, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        module = split.module
        if is_plain(module):
            autocast = autocast_state(args, kwargs)  # mixed precision: artifacts made in the same regions
            for fn, made_in, _call in self._functions.get(id(module), ()):
                if made_in != autocast:
                    continue
                region = autocast_arguments(autocast)  # the artifact enters it itself
                with outside_autocast(autocast):
                    if fn.guard_check(module, *args, **kwargs, **region):
                        self.hits += 1
                        return fn(module, *args, **kwargs, **region)
            self._say_why_traced(module, args, kwargs)
        self.misses += 1
        return split.compiled(*args, **kwargs)

    def _say_why_traced(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A call an artifact was made for (the same description) that its guards still refused: count it under
        the guard that failed, so the trace skip's line says why (a call no artifact was made for, another shape
        say, is a plain miss)."""
        made_for = describe_call(module, args, kwargs)
        for fn, made_in, call in self._functions.get(id(module), ()):
            if call != made_for:
                continue
            region = autocast_arguments(made_in)
            with outside_autocast(made_in):
                failed = compat_torch.guard_failure(fn, module, *args, **kwargs, **region)
            why = f"guards refused ({failed})" if failed else "guards refused"
            self.traced_because[why] = self.traced_because.get(why, 0) + 1
            log.debug("trace skip: %s traced: %s", made_for, why)
            return

    def summary(self) -> dict[str, Any]:
        """What it did, as a training run reports it."""
        return {
            "hits": self.hits,
            "misses": self.misses,
            "loaded": self.loaded,
            "refused": self.refused,
            "traced_because": self.traced_because,
            "off": self.off,
            "load_seconds": self.load_seconds,
        }

    def records(self) -> list[tuple[Path, dict[str, Any]]]:
        """The complete artifacts of this format in the cache (read once: the cache is whole by now)."""
        if self._records is None:
            self._records = self._read_records()
        return self._records

    def _read_records(self) -> list[tuple[Path, dict[str, Any]]]:
        found = []
        for meta in sorted((self.cache_dir / TRACE_DIR).glob("*.json")):
            with contextlib.suppress(OSError, json.JSONDecodeError):
                record = json.loads(meta.read_text())
                if record.get("format") == FORMAT and meta.with_suffix(".aot").is_file():
                    found.append((meta.with_suffix(".aot"), record))
        return found


_ACTIVE: list[TraceSkip] = []


def enable(cache_dir: str | os.PathLike[str]) -> TraceSkip:
    """In a training process, before the trainer is built: split the backbones as the rehearsal did and
    serve warmed calls from the artifacts in `cache_dir`/trace. Says once, naming the reason, when it
    cannot load them: the backbones are split all the same (the graphs the rehearsal compiled, which the
    Inductor caches serve; a process that did not split would compile the whole model's other graphs)."""
    cache = Path(cache_dir)
    for state in _ACTIVE:
        if state.cache_dir == cache:
            return state
    state = TraceSkip(cache)
    state.available = len(state.records())
    if not (cache / TRACE_DIR / SPLIT_MARKER).is_file():
        state.off = "the cache was warmed without it" + _warmed_off(cache)
        log.warning("trace skip off: %s; Dynamo traces every graph, the warmed cache serves it", state.off)
        return state
    state.off = unavailable_reason()
    if state.off is not None:
        log.warning(
            "trace skip off: %s; Dynamo traces the backbone compiled on its own, as the warm-up split it, "
            "and the warmed cache serves it",
            state.off,
        )
    try:
        on_compiled_module(state.wrap)
    except IncompatibleLibraryError as error:
        state.off = str(error)
        log.warning("trace skip off: %s", error)
        return state
    _ACTIVE.append(state)
    return state


def _warmed_off(cache: Path) -> str:
    """Why the rehearsal kept no trace, where it was the job's reason (a sharded launch), as ": reason"; else ""."""
    with contextlib.suppress(OSError, json.JSONDecodeError, AttributeError):
        reason = json.loads((cache / TRACE_DIR / OFF_MARKER).read_text()).get("off")
        if isinstance(reason, str) and reason:
            return f": {reason}"
    return ""


class _FirstCompile:
    """`enable_when_compiled`'s hook: the first model compiled, of either kind, enables the trace skip once the
    cache is whole and is split by it; then `at_exit` is registered. Runs once, however many times it is hooked."""

    def __init__(self, cache_dir: str | os.PathLike[str], at_exit: Callable[[], None]) -> None:
        self.cache_dir, self.at_exit, self.done = cache_dir, at_exit, False

    def __call__(self, compiled: Any) -> None:
        from warmup.client.background import wait_for_pull

        remove_hook(self)
        if self.done:
            return
        self.done = True
        wait_for_pull()
        state = enable(self.cache_dir)
        if state in _ACTIVE:  # split as the warm-up did (artifacts or not)
            state.wrap(compiled)
        atexit.register(self.at_exit)


_FIRST: list[_FirstCompile] = []


def enable_when_compiled(
    cache_dir: str | os.PathLike[str], at_exit: Callable[[], None], *, in_place_only: bool = False
) -> None:
    """For `warmup exec`'s processes (its sitecustomize): `enable` at the first torch.compile of a model,
    once the cache the command starts beside has finished downloading; then `at_exit` is run at exit (where
    the compile time went: warmup/pod/callback/timings.py). `in_place_only`: hook only the modules compiled in
    place (`nn.Module.compile`), which needs no Dynamo: the sitecustomize hooks those as torch is imported, since
    that compile (DeepSpeed's engine's) is what imports Dynamo, too late for a hook installed then; and the
    OptimizedModules as Dynamo is imported. The first compile of either kind is the one."""
    if not _FIRST:
        _FIRST.append(_FirstCompile(cache_dir, at_exit))
    first = _FIRST[0]
    if first.done:
        return
    if in_place_only:
        on_module_compiled_in_place(first)
    else:
        on_compiled_module(first)


def active() -> TraceSkip | None:
    """The trace skip this process enabled, if any."""
    return _ACTIVE[0] if _ACTIVE else None
