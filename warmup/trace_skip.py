"""Trace skip: a warmed training process runs Dynamo's output for a warmed call without tracing it.

A warmed Inductor cache spares the backend compile, but every new process still traces each graph with
Dynamo and runs AOTAutograd again before it finds the cached kernels. torch 2.13's `aot_compile` keeps
what those two steps produce (the guards, the transformed bytecode and the AOTAutograd-wrapped
Inductor graph, forward and backward) in one file, and `torch.compiler.load_compiled_function` loads it
without tracing (docs/compile-caches.md, "Skipping the trace", says why this mechanism and not
`caching_precompile` or the Mega-Cache).

`aot_compile` needs one graph without breaks, and TRL's forwards break: its fused LM head is an
`autograd.Function` Dynamo cannot trace. The backbone (`model.base_model`, the decoder stack: nearly
all of the compute and of the trace) has no break. So when accelerate wraps a model in `torch.compile`,
the backbone is compiled on its own (one graph, with the job's backend, mode and shape policy) and, in a
warmed process, runs its loaded artifact; the rest of the forward (the LM head, already outside any graph
in TRL's fused path, and the loss) runs eagerly around it, so that a warmed process traces nothing. The
rehearsal and the training process split the same way (the rehearsal leaves `trace/split.json` to say
so), so the graphs and their cache keys are the same in both. A PEFT model splits at the backbone of the model it
adapts (`adapted_model`), which is given its input embeddings (the embedding's gradient-checkpointing hook runs
eagerly before it).

The rehearsal (`Recorder`) notes the first backbone call per input signature and, after training,
compiles each ahead of time, saves it under `trace/` in the run's cache directory (ordinary files:
the entry, the store, pull and relocation carry them as any other), and keeps it only if, loaded back,
its outputs and gradients on the rehearsal batch equal a fresh compile's (bit for bit on CPU, where both
run their kernels on one thread for the check, so that every sum is taken in one order; `compare`).

A training process (`enable`, from `warmup.activate` or the sitecustomize of `warmup exec`) loads the
artifacts made for the backbone's class and config when accelerate compiles the model; each call runs
the first artifact whose guards (torch's own: shapes, strides, dtypes, `requires_grad`, grad mode,
train/eval, the config values the graph read) accept it, else the backbone compiled by Dynamo (a
miss: traced, served by the Inductor cache). A process that does not load them (the switch, a torch without
the mechanism, an artifact refused) still splits the backbone as the rehearsal did: its graphs are the warmed
ones, and the Inductor caches serve them. The guards that cannot be serialised (object identities,
closures of the decorators around `forward`) are left out, so each artifact also carries a digest of
the model's config and is refused for a model whose config differs.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib
import json
import logging
import os
import re
import sys
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmup._compat import kernels as compat_kernels
from warmup._compat import torch as compat_torch
from warmup.errors import IncompatibleLibraryError

log = logging.getLogger(__name__)

TRACE_DIR = "trace"
FORMAT = 1
# WARMUP_TRACE_SKIP=0 turns it off in a training process (and its capture in a rehearsal).
ENV_VAR = "WARMUP_TRACE_SKIP"
# Config keys that name where a model came from, not what it computes; `use_cache` is read (and guarded)
# by the graph itself, and the trainer flips it after the model is built.
COSMETIC_CONFIG_KEYS = frozenset(
    {
        "_name_or_path",
        "transformers_version",
        "_commit_hash",
        "architectures",
        "use_cache",
        "dtype",
        "torch_dtype",
    }
)
# An adapter's settings that name where its model came from, not what it computes.
COSMETIC_ADAPTER_KEYS = frozenset({"base_model_name_or_path", "revision"})


def unavailable_reason() -> str | None:
    """Why this process cannot skip the trace (None: it can): the switch, or torch lacking what the trace skip
    reaches (the mechanism, `aot_compile` and `load_compiled_function`, among it)."""
    if os.environ.get(ENV_VAR, "1") == "0":
        return f"{ENV_VAR}=0"
    return compat_torch.trace_skip_problem()


# --- what an artifact is for -----------------------------------------------------------------------


def config_digest(module: Any, adapters: dict[str, Any] | None = None) -> str:
    """The model's class and config, as far as they can change a graph (a guard the artifact cannot hold), and
    the settings of the PEFT adapters around it (`adapted_model`), if any."""
    config = getattr(module, "config", None)
    values: dict[str, Any] = {}
    if config is not None and hasattr(config, "to_dict"):
        values = {k: v for k, v in config.to_dict().items() if k not in COSMETIC_CONFIG_KEYS}
    cls = type(module)
    described: dict[str, Any] = {"class": f"{cls.__module__}.{cls.__qualname__}", "config": values}
    if adapters:
        described["adapters"] = adapters
    text = json.dumps(described, sort_keys=True, default=_as_json)
    return hashlib.sha256(text.encode()).hexdigest()


def _as_json(value: Any) -> Any:
    """A value json cannot write, as text; a set in order (peft's `target_modules`: a set's order changes from
    one process to the next)."""
    return sorted(map(str, value)) if isinstance(value, set | frozenset) else str(value)


def describe_call(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A call's input signature: what a graph specialises on among the arguments, with grad mode and mode."""
    import torch

    def one(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            shape = "x".join(str(s) for s in value.shape)
            return f"{value.dtype}[{shape}]{'g' if value.requires_grad else ''}@{value.device}"
        if value is None or isinstance(value, bool | int | float | str):
            return repr(value)
        return type(value).__qualname__

    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    grad = "grad" if torch.is_grad_enabled() else "no_grad"
    return f"{'train' if module.training else 'eval'};{grad};" + ",".join(parts)


def is_plain(module: Any) -> bool:
    """Whether calling the module is calling its `forward` (no hooks, no custom `__call__`): the artifact
    holds `forward` only, so a module with hooks goes through Dynamo, which traces the hooks too."""
    import torch

    return not compat_torch.has_hooks(module) and type(module).__call__ is torch.nn.Module.__call__


def guard_filter(closure_names: frozenset[str]) -> Callable[[Any], list[bool]]:
    """Dynamo's guards worth saving: those on the call's arguments (the module, its parameters and config, the
    batch) and the global state (grad mode, autocast, determinism), less the kinds torch cannot serialise.
    Dropped: guards on the closure cells of the decorators around `forward` (`closure_names`) and on module
    globals: the same code under the same toolchain; the config digest covers the model."""
    unsupported = compat_torch.unserializable_guard_types()

    def keep(entries: Any) -> list[bool]:
        kept = []
        for entry in entries:
            root = re.split(r"[.\[]", entry.name, maxsplit=1)[0]
            kinds = {entry.guard_type, *entry.derived_guard_types}
            kept.append(root not in closure_names and not entry.is_global and not kinds & unsupported)
        return kept

    return keep


def hidden_functions(module: Any) -> dict[str, Any]:
    """Functions the artifact refers to that pickle cannot find by name: the undecorated `forward` inside the
    decorators transformers puts around it. They travel as `external_data`, found again the same way."""
    found: dict[str, Any] = {}
    seen: set[int] = set()
    todo: list[Any] = [type(module).forward]
    while todo:
        fn = todo.pop()
        if isinstance(fn, types.MethodType):
            fn = fn.__func__
        if not isinstance(fn, types.FunctionType) or id(fn) in seen:
            continue
        seen.add(id(fn))
        if "<locals>" not in fn.__qualname__ and _by_name(fn) is not fn:
            found[f"{fn.__module__}.{fn.__qualname__}:{fn.__code__.co_firstlineno}"] = fn
        todo.extend(c.cell_contents for c in fn.__closure__ or () if _filled(c))
        if hasattr(fn, "__wrapped__"):
            todo.append(fn.__wrapped__)
    return found


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # an empty cell
        return False
    return True


def _by_name(fn: types.FunctionType) -> Any:
    obj: Any = importlib.import_module(fn.__module__)
    for part in fn.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj


# --- the split: the backbone compiled on its own --------------------------------------------------------

SPLIT_MARKER = "split.json"


def adapted_model(model: Any) -> tuple[Any, dict[str, Any]]:
    """The transformers model a PEFT wrapper adapts (peft's `get_base_model`), with its adapters' settings by
    name; the model itself and none when it is not a PEFT model. The adapters' layers sit inside the backbone,
    so a LoRA model splits where the model it adapts does."""
    if type(model).__module__.partition(".")[0] != "peft" or not callable(
        getattr(model, "get_base_model", None)
    ):
        return model, {}
    adapters = {
        name: {k: v for k, v in config.to_dict().items() if k not in COSMETIC_ADAPTER_KEYS}
        for name, config in getattr(model, "peft_config", {}).items()
    }
    return model.get_base_model(), adapters


def backbone_of(model: Any) -> Any:
    """The module whose forward is traced ahead of time: the model's backbone (`base_model`, the decoder
    stack), None when the model has none or it is not a plain module."""
    import torch

    backbone = getattr(model, "base_model", None)
    if not isinstance(backbone, torch.nn.Module) or backbone is model or not is_plain(backbone):
        return None
    # transformers' innermost model is its own base model; a PEFT wrapper's is not (its forward is the whole
    # model's again, LM head included): not split, it runs as before
    if getattr(backbone, "base_model", None) is not backbone:
        return None
    if not isinstance(getattr(type(backbone), "forward", None), types.FunctionType):
        return None
    return backbone


@dataclass
class Split:
    """A backbone whose forward Dynamo does not enter: it runs `serve` (artifacts) or else `compiled`."""

    module: Any
    backend: Any
    dynamic: bool | None
    compiled: Callable[..., Any]
    digest: str = ""  # config_digest(module), taken when the model is compiled


Serve = Callable[[Split, tuple[Any, ...], dict[str, Any]], Any]


def split_backbone(optimized: Any, serve: Serve) -> Split | None:
    """Make the backbone of the model accelerate just compiled a call Dynamo does not trace into: `serve`
    runs it (from an artifact, or recording the call), falling back to the backbone compiled on its own by
    Dynamo with the model's backend, mode and shape policy."""
    import torch

    model, backend, dynamic = compat_torch.compiled_module_parts(optimized)
    adapted, adapters = adapted_model(model)
    backbone = backbone_of(adapted)
    if backbone is None:
        return None
    _saveable_hub_kernels(backbone)
    eager = backbone.forward
    compiled = compat_torch.dynamo_compiled(eager, backend=backend, dynamic=dynamic)
    split = Split(backbone, backend, dynamic, compiled, config_digest(backbone, adapters))
    # The compiled model's call runs its forward eagerly around the backbone: what is left (TRL's LM head,
    # whose autograd.Function Dynamo cannot trace, and the loss) is a few small ops, and tracing them is
    # what a warmed process would otherwise still pay for on every shape. Calls of the bare model (TRL's
    # generation) run the backbone eagerly, as they did.
    inside = [0]

    def compiled_model(*args: Any, **kwargs: Any) -> Any:
        inside[0] += 1
        try:
            return model(*args, **kwargs)
        finally:
            inside[0] -= 1

    # A PEFT model's backbone gets its input embeddings, not its token ids: under gradient checkpointing its
    # embedding's hook (transformers' enable_input_require_grads) calls `requires_grad_()` on the frozen
    # embedding's output, which torch cannot keep inside one graph; run eagerly before the backbone, it is an
    # input of the graph instead. Rehearsal and training embed alike, so their graphs are the same.
    embed_first = bool(adapters)

    @torch.compiler.disable  # type: ignore[untyped-decorator]
    def forward(*args: Any, **kwargs: Any) -> Any:
        if not inside[0]:
            return eager(*args, **kwargs)
        if (
            embed_first
            and not args
            and kwargs.get("input_ids") is not None
            and kwargs.get("inputs_embeds") is None
        ):
            kwargs = {
                **kwargs,
                "input_ids": None,
                "inputs_embeds": backbone.get_input_embeddings()(kwargs["input_ids"]),
            }
        return serve(split, args, kwargs)

    optimized.forward = compiled_model
    backbone.forward = forward
    return split


def _saveable_hub_kernels(backbone: Any) -> None:
    """Let torch save a backbone that calls transformers' hub-kernel functions (warmup/_compat/kernels.py): a
    name change only, made in the warm-up and the training process alike. Where this kernels moved what it
    needs, the trace is not kept (the warm-up says so) and the graphs are the same all the same."""
    try:
        compat_kernels.saveable_kernel_functions(backbone)
    except IncompatibleLibraryError as error:
        log.warning("trace skip: %s; a model using hub kernels keeps no trace", error)


def _on_compiled_module(hook: Callable[[Any], None]) -> None:
    """Run `hook` on every OptimizedModule made from now on, once torch has set it up."""
    compat_torch.on_compiled_module(hook)


def remove_hook(hook: Callable[[Any], None]) -> None:
    """Stop running `hook` on new compiled modules (a recorder or a trace skip done with)."""
    compat_torch.remove_compiled_module_hook(hook)


# --- capture (the rehearsal) -----------------------------------------------------------------------


@dataclass
class RecordedCall:
    split: Split
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    grad: bool
    training: bool
    description: str


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

    def __init__(self, off: str | None = None) -> None:
        self.calls: dict[str, RecordedCall] = {}
        self.splits = 0
        self.models = 0  # compiled models seen
        self.off = off  # why this run neither splits nor captures (None: it does)

    def wrap(self, optimized: Any) -> None:
        self.models += 1
        if self.off is None and split_backbone(optimized, self.serve) is not None:
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
                split, _detached(args), _detached(kwargs), grad, training, description
            )
        return split.compiled(*args, **kwargs)

    def capture(self, cache_dir: str | os.PathLike[str], *, exact: bool = True) -> list[CaptureOutcome]:
        """Compile, save and check an artifact for every recorded call; an artifact that fails to compile,
        to save, to load or the numeric check is removed, the others are kept. Leaves the split marker
        when a backbone was split (the training process must split it too, artifacts or not)."""
        if not self.splits:
            return []
        folder = Path(cache_dir) / TRACE_DIR
        folder.mkdir(parents=True, exist_ok=True)
        (folder / SPLIT_MARKER).write_text(json.dumps({"format": FORMAT, "split": "base_model"}) + "\n")
        return [capture_call(call, Path(cache_dir), exact=exact) for call in self.calls.values()]


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


def start_recording(world_size: int = 1) -> Recorder:
    """In a rehearsal, before the trainer is built: split and record; or, when this process cannot skip the
    trace (the switch, torch, a job of several processes), only note the compiled models, with the reason
    logged once (`Recorder.lost`)."""
    reason = unavailable_reason() or predicted_loss(world_size=world_size)
    if reason is not None:
        log.warning("trace skip: not captured (%s); the entry holds today's caches only", reason)
    recorder = Recorder(off=reason)
    _on_compiled_module(recorder.wrap)
    return recorder


NO_BACKBONE = "the compiled model has no plain backbone to split (hooks on the backbone, or no base_model)"


def predicted_loss(*, world_size: int) -> str | None:
    """Why a job keeps no trace, as far as its spec tells (`warmup plan`; the warm-up says it for certain)."""
    if world_size > 1:
        return f"a job of {world_size} processes (not captured: one rank's artifacts are not checked for the others)"
    return None


LOCAL_SCOPE = "defined in local scope"
# What torch's refusals mean for the user, by a phrase of its message (the first line of the message otherwise)
KNOWN_LOSSES = (
    (
        "torch.utils.checkpoint",
        "torch cannot trace non-reentrant gradient checkpointing (use_reentrant: false) as one graph "
        "(HOP: Unsafe side effect)",
    ),
    (
        LOCAL_SCOPE,
        "the model calls a function defined in a local scope (transformers' hub kernels, use_kernelized_func), "
        "which torch cannot save",
    ),
    (
        "returning intermediate with requires_grad_()",
        "with gradient checkpointing and a frozen embedding (not a PEFT model's, whose backbone is given the "
        "embeddings), transformers makes the embedding's output require grad inside the backbone "
        "(enable_input_require_grads), which torch cannot keep in one graph",
    ),
)


def hub_kernels_loss() -> str | None:
    """Why a model calling transformers' hub-kernel functions (Qwen3 and others, where `kernels` is installed)
    keeps no trace here, None where it keeps it: the seam to kernels does not hold on this version."""
    problems = compat_kernels.check()
    return f"{dict(KNOWN_LOSSES)[LOCAL_SCOPE]} ({problems[0]})" if problems else None


def hub_kernels_checkpoint_loss() -> str | None:
    """Why a job under gradient checkpointing of a model calling hub-kernel functions keeps no trace here (None
    where `kernels` is not installed): kernels sets a context variable inside the checkpoint (non-reentrant, the
    default from transformers 5.25 on), which torch cannot trace as one graph. The FX/AOT caches still serve it."""
    if not compat_kernels.installed():
        return None
    return f"{dict(KNOWN_LOSSES)['torch.utils.checkpoint']}: kernels sets a context variable inside the checkpoint"


def loss_line(trace: list[dict[str, Any]], lost: str | None) -> str:
    """One line on what a rehearsal's trace skip did not keep ("" when it kept every call it recorded): its
    reason to keep none (`Recorder.lost`), or how many calls torch refused and why (`CaptureOutcome`)."""
    if lost:
        return f"trace skip off: {lost}"
    refused = [t for t in trace if not t.get("stored")]
    if not refused:
        return ""
    reason = str(refused[0].get("reason", ""))
    why = next((text for phrase, text in KNOWN_LOSSES if phrase in reason), reason.split("\n", 1)[0][:200])
    return f"trace not kept for {len(refused)} of {len(trace)} call(s): {why}"


def artifact_name(digest: str, description: str) -> str:
    return hashlib.sha256(f"{FORMAT};{digest};{description}".encode()).hexdigest()[:32]


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
    with torch.set_grad_enabled(call.grad):
        return compat_torch.aot_compile(
            types.MethodType(forward, module),
            call.args,
            call.kwargs,
            backend=call.split.backend,
            dynamic=call.split.dynamic,
            guard_filter_fn=guard_filter(closure),
        )


def load_artifact(data: bytes, module: Any) -> Any:
    return compat_torch.load_aot_compiled(
        data, hidden_functions(module)
    )  # `TraceSkip.serve` checks the guards


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
    with torch.set_grad_enabled(call.grad):  # grad mode is among the guards
        accepted = loaded.guard_check(module, *call.args, **call.kwargs)
    if not accepted:
        return "the artifact's guards refuse the very call it was compiled for"
    with serial_kernels():
        runs = [_run(call, lambda: call.split.compiled(*call.args, **call.kwargs)) for _ in range(2)]
        served = _run(call, lambda: loaded(module, *call.args, **call.kwargs))
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


def _run(call: RecordedCall, fn: Callable[[], Any]) -> list[Any]:
    """The call's output tensors and, when it has a graph to differentiate, every parameter's gradient of
    the loss (or of the sum of the outputs, for a module whose loss is computed outside)."""
    import torch

    module = call.split.module
    module.zero_grad(set_to_none=True)
    module.train(call.training)
    torch.manual_seed(0)
    with torch.set_grad_enabled(call.grad):
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


# --- load (the training process) ---------------------------------------------------------------------


@dataclass
class TraceSkip:
    """What the trace skip did in this process: artifacts loaded, refused (and why), calls served."""

    cache_dir: Path
    available: int = 0
    loaded: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0
    load_seconds: float = 0.0
    off: str | None = None
    _functions: dict[int, list[Any]] = field(default_factory=dict, repr=False)
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
        return text

    def wrap(self, optimized: Any) -> None:
        """Split a freshly compiled model's backbone as the rehearsal did, and load the artifacts made for
        its class and config (before the first forward; none when the trace skip is off: then every call
        goes to the backbone compiled on its own, the graph the rehearsal compiled)."""
        try:
            split = split_backbone(optimized, self.serve)
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
            functions.append(self._loaded[path])
        self.load_seconds += time.perf_counter() - start
        self._functions[id(module)] = functions

    def serve(self, split: Split, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        module = split.module
        if is_plain(module):
            for fn in self._functions.get(id(module), ()):
                if fn.guard_check(module, *args, **kwargs):
                    self.hits += 1
                    return fn(module, *args, **kwargs)
        self.misses += 1
        return split.compiled(*args, **kwargs)

    def summary(self) -> dict[str, Any]:
        """What it did, as a training run reports it."""
        return {
            "hits": self.hits,
            "misses": self.misses,
            "loaded": self.loaded,
            "refused": self.refused,
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
        state.off = "the cache was warmed without it"
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
        _on_compiled_module(state.wrap)
    except IncompatibleLibraryError as error:
        state.off = str(error)
        log.warning("trace skip off: %s", error)
        return state
    _ACTIVE.append(state)
    return state


def enable_when_compiled(cache_dir: str | os.PathLike[str]) -> None:
    """For `warmup exec`'s processes (its sitecustomize): `enable` at the first torch.compile of a model,
    once the cache the command starts beside has finished downloading; at exit, where the compile time went."""

    def first(optimized: Any) -> None:
        from warmup.client.background import wait_for_pull

        remove_hook(first)
        wait_for_pull()
        state = enable(cache_dir)
        if state in _ACTIVE:  # split as the warm-up did (artifacts or not)
            state.wrap(optimized)
        atexit.register(_exit_line)

    _on_compiled_module(first)


def _exit_line() -> None:
    """Where the process's compile time went and how many graphs Inductor compiled afresh (its cache misses),
    unless a WarmupCallback's verdict, which counts new cache files too, already said it (and so stays the
    last line of the run)."""
    if _VERDICT_SAID:
        return
    from warmup.backends.inductor import MISS_COUNTERS

    counters = compat_torch.dynamo_counters()
    fresh = sum(int(counters[group][name]) for group, name in MISS_COUNTERS) if counters is not None else 0
    timings = describe_timings(compile_timings(timed_first_step()))
    print(f"trl-warmup: {timings}; {fresh} fresh compile(s) (Inductor cache misses)", file=sys.stderr)


_VERDICT_SAID: list[bool] = []


def verdict_said() -> None:
    """A WarmupCallback printed its verdict (with these timings) in this process: no exit line after it."""
    _VERDICT_SAID.append(True)


_FIRST_STEP: list[float] = []  # this process's first training step, in seconds (`first_step_clock`)


def first_step_clock() -> Any:
    """A TrainerCallback timing the process's first training step, for `warmup exec`'s exit line (its
    sitecustomize gives one to every Trainer; `WarmupCallback` times its own)."""
    from transformers import TrainerCallback

    class FirstStepClock(TrainerCallback):
        started: float | None = None

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.started is None:
                self.started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.started is not None and not _FIRST_STEP:
                _FIRST_STEP.append(time.perf_counter() - self.started)

    return FirstStepClock()


def timed_first_step() -> float | None:
    """The first training step's seconds in this process, once a `first_step_clock` has timed it."""
    return _FIRST_STEP[0] if _FIRST_STEP else None


def compile_timings(first_step_s: float | None = None) -> dict[str, Any]:
    """Where this process's compile time went, from torch's own timers: Dynamo's trace (its frames, less
    the backend inside them), the backend (AOTAutograd and Inductor, or their cache loads, backwards
    included), the trace artifacts' loading, and the calls they served."""
    spent = compat_torch.dynamo_time_spent()
    frames, backend = spent.get("entire_frame_compile", 0.0), spent.get("backend_compile", 0.0)
    state = active()
    timings: dict[str, Any] = {
        "trace_s": round(max(frames - backend, 0.0), 3),
        "backend_s": round(backend + spent.get("entire_backward_compile", 0.0), 3),
        "cache_load_s": round(state.load_seconds, 3) if state else 0.0,
        "served_untraced": state.hits if state else 0,
        "traced": state.misses if state else None,
    }
    if state is not None and state.off is not None:
        timings["trace_skip_off"] = state.off
    if state is not None and state.refused:
        timings["trace_refused"] = dict(state.refused)
    if first_step_s is not None:
        timings["first_step_s"] = round(first_step_s, 3)
    return timings


def describe_timings(timings: dict[str, Any]) -> str:
    text = (
        f"trace {timings['trace_s']:.1f} s, backend {timings['backend_s']:.1f} s, "
        f"cache load {timings['cache_load_s']:.1f} s"
    )
    if "first_step_s" in timings:
        text += f", first step {timings['first_step_s']:.1f} s"
    state = active()
    return text + (f"; {state.describe()}" if state else "")


def active() -> TraceSkip | None:
    """The trace skip this process enabled, if any."""
    return _ACTIVE[0] if _ACTIVE else None
