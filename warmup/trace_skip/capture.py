"""Capture (the rehearsal): record the backbone's first call per input signature, then compile each ahead of
time, save it under `trace/` and keep it only if, loaded back, it gives a fresh compile's outputs and
gradients."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmup._compat import torch as compat_torch
from warmup.errors import IncompatibleLibraryError
from warmup.trace_skip.artifacts import (
    FORMAT,
    OFF_MARKER,
    SPLIT_MARKER,
    TRACE_DIR,
    Autocast,
    artifact_name,
    autocast_arguments,
    autocast_regions,
    autocast_state,
    describe_call,
    forward_in_autocast,
    guard_filter,
    hidden_functions,
    load_artifact,
)
from warmup.trace_skip.losses import NO_BACKBONE, predicted_loss
from warmup.trace_skip.split import Split, on_compiled_module, split_backbone, unavailable_reason

log = logging.getLogger(__name__)


@dataclass
class RecordedCall:
    split: Split
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    grad: bool
    training: bool
    description: str
    autocast: Autocast = ()  # the autocast regions it ran in (mixed precision): `forward_in_autocast`


@dataclass(frozen=True)
class CaptureOutcome:
    """One recorded call: stored under `path` (relative to the cache dir), or not, and why."""

    description: str
    stored: bool
    path: str = ""
    reason: str = ""
    seconds: float = 0.0


class Recorder:
    """Splits every compiled model's backbone and records its first call per input signature; `capture`
    then compiles, saves and checks an artifact for each."""

    def __init__(self, off: str | None = None, *, job_off: bool = False) -> None:
        self.calls: dict[str, RecordedCall] = {}
        self.splits = 0
        self.models = 0  # compiled models seen
        self.off = off  # why this run neither splits nor captures (None: it does)
        # `off` is the job's own reason (not this process's switch or torch): the cache keeps it for training
        self.job_off = job_off

    def wrap(self, compiled: Any) -> None:
        self.models += 1
        if self.off is not None:
            return
        try:
            split = split_backbone(compiled, self.serve)
        except IncompatibleLibraryError as error:  # this torch lacks what the split reaches: nothing split
            self.off = str(error)
            log.warning("trace skip: not captured (%s); the entry holds today's caches only", error)
            return
        if split is not None:
            self.splits += 1

    def lost(self) -> str | None:
        """Why a run that compiled a model keeps no trace at all (None: it compiled none, or split one)."""
        if not self.models:
            return None
        if self.off is not None:
            return self.off
        if not self.splits:
            return NO_BACKBONE
        return None

    def serve(self, split: Split, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        import torch

        description = describe_call(split.module, args, kwargs)
        key = artifact_name(split.digest, description)
        if key not in self.calls:
            grad, training = torch.is_grad_enabled(), split.module.training
            self.calls[key] = RecordedCall(
                split,
                _detached(args),
                _detached(kwargs),
                grad,
                training,
                description,
                autocast_state(args, kwargs),
            )
        return split.compiled(*args, **kwargs)

    def capture(self, cache_dir: str | os.PathLike[str], *, exact: bool = True) -> list[CaptureOutcome]:
        """Compile, save and check an artifact for every recorded call; an artifact that fails to compile,
        to save, to load or the numeric check is removed, the others are kept. Leaves the split marker
        when a backbone was split (the training process must split it too, artifacts or not)."""
        if self.off is not None and self.job_off and self.models and (_ranks() or (0, 1))[0] == 0:
            folder = Path(cache_dir) / TRACE_DIR
            folder.mkdir(parents=True, exist_ok=True)
            (folder / OFF_MARKER).write_text(json.dumps({"format": FORMAT, "off": self.off}) + "\n")
        ranks = _ranks() if self.off is None else None
        if ranks is not None:
            return self._capture_ranks(Path(cache_dir), ranks, exact=exact)
        if not self.splits:
            return []
        _mark_split(Path(cache_dir))
        return [capture_call(call, Path(cache_dir), exact=exact) for call in self.calls.values()]

    def _capture_ranks(self, cache_dir: Path, ranks: tuple[int, int], *, exact: bool) -> list[CaptureOutcome]:
        """Every rank of a DDP rehearsal at once (one cache directory): rank 0 compiles, saves and checks an
        artifact for each call every rank made; then every other rank loads each one and checks it on its own
        recorded call; an artifact any rank refuses is removed. The outcomes are rank 0's."""
        import torch.distributed as dist

        rank, world = ranks
        made: list[Any] = [None] * world
        dist.all_gather_object(made, (self.splits, sorted(self.calls)))
        if not any(splits for splits, _ in made):
            return []
        common = set.intersection(*(set(keys) for _, keys in made))
        outcomes: list[Any] = [[]]
        failed: Exception | None = None
        if rank == 0:
            try:
                _mark_split(cache_dir)
                outcomes[0] = [
                    capture_call(call, cache_dir, exact=exact)
                    if key in common
                    else CaptureOutcome(call.description, False, reason=_missing_on(key, made))
                    for key, call in self.calls.items()
                ]
            except Exception as error:  # the other ranks wait in the collectives: join them, then fail
                failed = error
            others = set().union(*(set(keys) for _, keys in made)) - set(self.calls)
            outcomes[0] += [
                CaptureOutcome(key, False, reason=_missing_on(key, made)) for key in sorted(others)
            ]
        dist.broadcast_object_list(outcomes, src=0)
        problems = {} if rank == 0 else self._check_stored(outcomes[0], cache_dir, rank, exact=exact)
        refusals: list[Any] = [None] * world
        dist.all_gather_object(refusals, problems)
        if failed is not None:
            raise failed
        return _keep_agreed(outcomes[0], refusals, cache_dir) if rank == 0 else outcomes[0]

    def _check_stored(
        self, outcomes: list[CaptureOutcome], cache_dir: Path, rank: int, *, exact: bool
    ) -> dict[str, str]:
        """This rank's refusals of the artifacts rank 0 kept, by path: loaded, then `compare`d on this rank's
        own recorded call."""
        problems = {}
        for outcome in outcomes:
            if not outcome.stored:
                continue
            call = self.calls[Path(outcome.path).stem]
            try:
                loaded = load_artifact((cache_dir / outcome.path).read_bytes(), call.split.module)
                problem = compare(call, loaded, exact=exact)
            except Exception as error:  # as in capture_call: any failure is a refusal
                problem = f"{type(error).__name__}: {error}"[:500]
            if problem is not None:
                problems[outcome.path] = f"rank {rank}: {problem}"
        return problems


def _ranks() -> tuple[int, int] | None:
    """(rank, world size) of a rehearsal of several processes whose process group is up, else None."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    return dist.get_rank(), dist.get_world_size()


def _mark_split(cache_dir: Path) -> None:
    folder = cache_dir / TRACE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SPLIT_MARKER).write_text(json.dumps({"format": FORMAT, "split": "base_model"}) + "\n")


def _missing_on(key: str, made: list[Any]) -> str:
    """Why a call rank 0 made is not captured: the ranks that never made it (its artifact could not be checked
    there)."""
    missing = [str(rank) for rank, (_, keys) in enumerate(made) if key not in keys]
    return f"not made by every rank (not by rank {', '.join(missing)}): it could not be checked there"


def _keep_agreed(
    outcomes: list[CaptureOutcome], refusals: list[dict[str, str]], cache_dir: Path
) -> list[CaptureOutcome]:
    """Rank 0's outcomes with every artifact another rank refused removed, and its reason said."""
    refused: dict[str, str] = {}
    for problems in refusals:
        for path, problem in problems.items():
            refused.setdefault(path, problem)
    kept = []
    for outcome in outcomes:
        why = refused.get(outcome.path) if outcome.stored else None
        if why is None:
            kept.append(outcome)
            continue
        artifact = cache_dir / outcome.path
        # the record first: an artifact without its record is never served
        artifact.with_suffix(".json").unlink(missing_ok=True)
        artifact.unlink(missing_ok=True)
        kept.append(CaptureOutcome(outcome.description, False, reason=why, seconds=outcome.seconds))
    return kept


def _detached(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, tuple):
        return tuple(_detached(v) for v in value)
    if isinstance(value, list):
        return [_detached(v) for v in value]
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def start_recording(world_size: int = 1, sharding: str | None = None) -> Recorder:
    """In a rehearsal, before the trainer is built: split and record; or, when this process cannot skip the
    trace (the switch, torch, a sharded job: `predicted_loss`), only note the compiled models, with the reason
    logged once (`Recorder.lost`)."""
    switched = unavailable_reason()
    reason = switched or predicted_loss(world_size=world_size, sharding=sharding)
    if reason is not None:
        log.warning("trace skip: not captured (%s); the entry holds today's caches only", reason)
    recorder = Recorder(off=reason, job_off=switched is None and reason is not None)
    on_compiled_module(recorder.wrap)
    return recorder


def capture_call(call: RecordedCall, cache_dir: Path, *, exact: bool = True) -> CaptureOutcome:
    import torch

    module = call.split.module
    digest = call.split.digest
    name = artifact_name(digest, call.description)
    folder = cache_dir / TRACE_DIR
    path, meta = folder / f"{name}.aot", folder / f"{name}.json"
    start = time.perf_counter()
    try:
        aot = compile_call(call)
        aot.save_compiled_function(str(path), external_data=hidden_functions(module))
        loaded = load_artifact(path.read_bytes(), module)
        problem = compare(call, loaded, exact=exact)
    except Exception as error:  # the mechanism is experimental: any failure is a refusal, not a crash
        problem = f"{type(error).__name__}: {error}"[:500]
    seconds = time.perf_counter() - start
    if problem is not None:
        path.unlink(missing_ok=True)
        return CaptureOutcome(call.description, False, reason=problem, seconds=seconds)
    cls = type(module)
    record = {
        "format": FORMAT,
        "module": f"{cls.__module__}.{cls.__qualname__}",
        "config": digest,
        "call": call.description,
        "torch": torch.__version__,
        "check": "bitwise" if exact else "tolerance",
        "autocast": [list(region) for region in call.autocast],
    }
    meta.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return CaptureOutcome(call.description, True, path=f"{TRACE_DIR}/{name}.aot", seconds=seconds)


def compile_call(call: RecordedCall) -> Any:
    """torch's aot_compile of the backbone's forward on the recorded call, with the model's backend."""
    import torch

    module = call.split.module
    forward = type(module).forward
    closure = frozenset(getattr(getattr(forward, "__code__", None), "co_freevars", ()))
    # torch 2.13 pickles a parameter's .grad into the guards unreadably: compile with none set
    module.zero_grad(set_to_none=True)
    module.train(call.training)
    # A call made in mixed precision: its region goes inside the compiled function, none around it.
    traced = forward_in_autocast if call.autocast else forward
    with torch.set_grad_enabled(call.grad), call.split.tracing():  # the settings `compiled` traces under
        return compat_torch.aot_compile(
            types.MethodType(traced, module),
            call.args,
            {**call.kwargs, **autocast_arguments(call.autocast)},
            backend=call.split.backend,
            dynamic=call.split.dynamic,
            guard_filter_fn=guard_filter(closure),
        )


def compare(call: RecordedCall, loaded: Any, *, exact: bool) -> str | None:
    """None when the loaded artifact's outputs and gradients on the recorded call equal a fresh compile's
    (the backbone compiled by Dynamo); else what differs.

    Both run under `serial_kernels`: the fresh compile and the artifact run the same kernels, and on one thread
    a parallel sum (on CPU, the embedding's gradient is a scatter-add whose order follows the threads) is
    taken in one order, so a sound artifact gives the fresh compile's very bits every time. The fresh compile
    runs twice all the same: a value it still does not reproduce (a device whose kernels the check cannot
    serialise) must stay within four times its own run-to-run spread; every other value must be equal (bit for
    bit with `exact`)."""
    import torch

    module = call.split.module
    module.train(call.training)
    region = autocast_arguments(call.autocast)  # served outside the call's autocast, carrying its own
    with torch.set_grad_enabled(call.grad):  # grad mode is among the guards
        accepted = loaded.guard_check(module, *call.args, **call.kwargs, **region)
    if not accepted:
        return "the artifact's guards refuse the very call it was compiled for"
    with serial_kernels():
        runs = [
            _run(call, lambda: call.split.compiled(*call.args, **call.kwargs), call.autocast)
            for _ in range(2)
        ]
        served = _run(call, lambda: loaded(module, *call.args, **call.kwargs, **region), ())
    return _differences(runs, served, exact=exact)


# OpenMP runtimes torch's builds load (GNU's on Linux, LLVM's on macOS, Intel's in some images)
OPENMP_LIBRARIES = ("libgomp.so.1", "libomp.so", "libomp.dylib", "libiomp5.so")


@contextlib.contextmanager
def serial_kernels() -> Iterator[None]:
    """Every OpenMP team on one thread until the block ends: OpenMP's `max-active-levels` of 0, set in the
    runtime the process has loaded (torch's, which Inductor's kernels share), holds even a team whose size a
    kernel names (`num_threads(N)`) to one thread, and torch's own parallel loops with it. Not
    `torch.set_num_threads`: the thread count is among Dynamo's global guards, so the fresh compile would
    compile again, other kernels than the artifact's. Without a known OpenMP runtime, nothing changes."""
    import ctypes

    runtime = None
    for name in OPENMP_LIBRARIES:
        with contextlib.suppress(OSError):
            runtime = ctypes.CDLL(name, mode=getattr(os, "RTLD_NOLOAD", 0))  # only one already loaded
            break
    if runtime is None:
        yield
        return
    levels = runtime.omp_get_max_active_levels()
    runtime.omp_set_max_active_levels(0)
    try:
        yield
    finally:
        runtime.omp_set_max_active_levels(levels)


def _run(call: RecordedCall, fn: Callable[[], Any], autocast: Autocast) -> list[Any]:
    """The call's output tensors and, when it has a graph to differentiate, every parameter's gradient of
    the loss (or of the sum of the outputs, for a module whose loss is computed outside); the forward in the
    autocast regions `autocast` names, the backward outside them, as a training step runs them."""
    import torch

    module = call.split.module
    module.zero_grad(set_to_none=True)
    module.train(call.training)
    torch.manual_seed(0)
    with torch.set_grad_enabled(call.grad), autocast_regions(autocast):
        out = fn()
    tensors = [t for t in _tensors(out) if isinstance(t, torch.Tensor)]
    results: list[Any] = [t.detach().clone() for t in tensors]
    differentiable = [t for t in tensors if t.requires_grad and t.is_floating_point()]
    if differentiable:
        loss = getattr(out, "loss", None)
        scalar = loss if isinstance(loss, torch.Tensor) else sum(t.float().sum() for t in differentiable)
        scalar.backward()
        results += [p.grad.detach().clone() if p.grad is not None else None for p in module.parameters()]
    module.zero_grad(set_to_none=True)
    return results


def _tensors(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _tensors(item)
    else:
        yield value


def _differences(runs: list[list[Any]], served: list[Any], *, exact: bool) -> str | None:
    """What differs between the artifact's values and the fresh compile's `runs` of the same call."""
    import torch

    fresh = runs[0]
    if any(len(run) != len(fresh) for run in runs) or len(served) != len(fresh):
        return f"the artifact gives {len(served)} outputs and gradients, a fresh compile {len(fresh)}"
    for index, (a, c) in enumerate(zip(fresh, served, strict=True)):
        if a is None or c is None:
            if a is not c:
                return f"value {index}: a gradient is missing on one side"
            continue
        if a.shape != c.shape or a.dtype != c.dtype:
            return f"value {index}: {c.dtype}{list(c.shape)} where a fresh compile gives {a.dtype}{list(a.shape)}"
        others = [run[index] for run in runs[1:]]
        if any(b is None for b in others):
            return f"value {index}: a gradient is missing in a fresh run"
        if any(not torch.equal(a, b) for b in others):
            # the fresh compile does not reproduce it: its own spread is the bound
            spread = max((a.double() - b.double()).abs().max().item() for b in others)
            off = (a.double() - c.double()).abs().max().item()
            if off > 4 * spread:
                return f"value {index} differs from a fresh compile's by {off:.3g}, beyond 4x its own spread {spread:.3g}"
            continue
        same = torch.equal(a, c) if exact else torch.allclose(a, c, rtol=1e-4, atol=1e-5)
        if not same:
            off = (a.double() - c.double()).abs().max().item()
            kind = "bitwise" if exact else "rtol 1e-4"
            return (
                f"value {index} ({c.dtype}{list(c.shape)}) differs from a fresh compile's ({kind}; max {off:.3g}; "
                f"the same in {len(runs)} fresh runs)"
            )
    return None
