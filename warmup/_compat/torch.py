"""torch's private names, in one place: Inductor's code cache and C++ build, its CPU ISA probes, the
compile caches' switches, Dynamo's recompile limits, miss counters and compile-start callbacks, and what the
trace skip reaches (warmup/trace_skip/): the hooks on every compiled module (an OptimizedModule, or a module
compiled in place by `nn.Module.compile`), the compiled module's backend and shape policy and its compiled call,
a module's hooks, Dynamo's compile of one function and its setting for a change of state under
gradient checkpointing, `aot_compile` and its guards' filter.

Written against torch 2.13.0; checked on torch 2.13.0 and 2.14.1 (`CHECKED_ON`). Each function names the
private target it reaches in `TARGETS`; `check()` resolves them all (tests/unit/test_compat.py), and a
function whose target moved raises IncompatibleLibraryError naming itself. Importing this module imports
no torch; each function imports what it reaches.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import platform
import sys
import types
from collections.abc import Callable
from typing import Any

from warmup._compat import targets
from warmup._compat.targets import Target

LIBRARY = "torch"
CHECKED_ON = ("2.13.0", "2.14.1")

_CODECACHE = "torch._inductor.codecache"
_VEC_ISA = "torch._inductor.cpu_vec_isa"
TARGETS: tuple[Target, ...] = (
    Target(_CODECACHE, "write", "wrap_kernel_write", ("content", "extension", "extra")),
    Target(_CODECACHE, "_precompile_header", "replace_precompiled_header", ("header", "hashable_cmd_line")),
    Target(_CODECACHE, "torch_key", "torch_key"),
    Target(_CODECACHE, "CppPythonBindingsCodeCache", "kernel_command_line"),
    Target(
        "torch._inductor.cpp_builder", "CppBuilder", "kernel_command_line", ("name", "sources", "BuildOption")
    ),
    Target("torch._inductor.cpp_builder", "CppTorchDeviceOptions", "kernel_command_line", ("vec_isa",)),
    Target(_VEC_ISA, "pick_vec_isa", "vec_isa"),
    Target(_VEC_ISA, "invalid_vec_isa", "kernel_command_line"),
    Target(_VEC_ISA, "supported_vec_isa_list", "vec_isa_candidates"),
    Target(_VEC_ISA, "x86_isa_checker", "vec_isa_candidates"),
    Target("torch._inductor.config", "fx_graph_cache", "enable_compile_caches"),
    Target("torch._functorch.config", "enable_autograd_cache", "enable_compile_caches"),
    Target("torch._dynamo.config", "recompile_limit", "raise_recompile_limits"),
    Target("torch._dynamo.config", "accumulated_recompile_limit", "raise_recompile_limits"),
    Target(
        "torch._dynamo.config",
        "skip_fwd_side_effects_in_bwd_under_checkpoint",
        "checkpoint_side_effects_once",
    ),
    Target("torch._dynamo.utils", "counters", "dynamo_counters"),
    Target("torch._dynamo.utils", "calculate_time_spent", "dynamo_compile_seconds"),
    Target("torch._inductor.compile_fx", None, "import_compiler"),
    Target(
        "torch._dynamo.callback",
        "callback_handler.register_start_callback",
        "register_compile_start",
        ("callback",),
    ),
)
_EVAL_FRAME = "torch._dynamo.eval_frame"
_AOT = "torch._dynamo.aot_compile"
_MODULE = "torch.nn.modules.module"
_GLOBAL_MODULE_HOOKS = (
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
    "_global_backward_pre_hooks",
    "_global_backward_hooks",
)
# What the trace skip reaches: where one does not hold, the trace skip is off (`trace_skip_problem`).
TRACE_SKIP_TARGETS = (
    Target(_EVAL_FRAME, "OptimizedModule._initialize", "on_compiled_module", ("self",)),
    Target(_MODULE, "Module.compile", "on_module_compiled_in_place", ("self",)),
    Target(_EVAL_FRAME, "innermost_backend", "compiled_module_parts", ("fn",)),
    Target(_EVAL_FRAME, "_TorchDynamoContext.__call__", "compiled_module_parts", ("self", "fn")),
    Target(_MODULE, "Module._compiled_call_impl", "compiled_module_parts"),
    Target(_MODULE, "Module._call_impl", "run_compiled_call", ("self",)),
    Target("torch._dynamo", "optimize", "dynamo_compiled"),
    Target(_AOT, "AOTCompiledFunction._extra_globals", "aot_compile"),
    Target(_AOT, "AOTCompiledFunction.disable_guard_check", "load_aot_compiled", ("self",)),
    Target("torch.compiler", "load_compiled_function", "load_aot_compiled", ("file",)),
    Target(_AOT, "AOTCompiledFunction.prepare_f_locals", "guard_failure", ("self",)),
    Target(
        "torch._dynamo.guards",
        "CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES",
        "unserializable_guard_types",
    ),
    *(Target(_MODULE, name, "has_hooks") for name in _GLOBAL_MODULE_HOOKS),
)
TARGETS += TRACE_SKIP_TARGETS
_BY_FUNCTION: dict[tuple[str, str | None], Target] = {(t.module, t.attribute): t for t in TARGETS}


def check() -> list[str]:
    """Every target of this seam that does not hold at the installed torch, one line each."""
    return targets.check(LIBRARY, CHECKED_ON, TARGETS)


def _get(module: str, attribute: str | None) -> Any:
    return targets.resolve(LIBRARY, CHECKED_ON, _BY_FUNCTION[(module, attribute)])


def codecache() -> Any:
    """Inductor's code cache module (`torch._inductor.codecache`), which the two patches below change."""
    return importlib.import_module(_CODECACHE)


def wrap_kernel_write(
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]], mark: str, module: Any = None
) -> None:
    """Replace `codecache.write` (which computes every kernel's key and path from its `extra`: the command
    line) by `wrap(original)`, once: a replacement carrying the attribute `mark` is left as it is. `module`:
    a stand-in for the code cache (tests)."""
    if module is None:
        _get(_CODECACHE, "write")
        module = codecache()
    original = module.write
    if getattr(original, mark, False):
        return
    replacement = wrap(original)
    setattr(replacement, mark, True)
    module.write = replacement


def replace_precompiled_header(plain_header: Callable[..., str], mark: str, module: Any = None) -> None:
    """Replace `codecache._precompile_header` (a g++ build of the kernels' common header, called before a
    kernel is looked up) by `plain_header`, once (`mark` and `module` as in `wrap_kernel_write`)."""
    if module is None:
        _get(_CODECACHE, "_precompile_header")
        module = codecache()
    if getattr(module._precompile_header, mark, False):
        return
    setattr(plain_header, mark, True)
    module._precompile_header = plain_header


def torch_key() -> bytes:
    """Inductor's hash of every torch source file: in every one of its cache keys."""
    hashed: bytes = _get(_CODECACHE, "torch_key")()
    return hashed


def kernel_command_line(*, with_isa: bool) -> str:
    """The command line Inductor builds a C++ kernel with here (its hashable form: no source, no output).
    Without the ISA's flags, no ISA is probed."""
    bindings = _get(_CODECACHE, "CppPythonBindingsCodeCache")
    builder = _get("torch._inductor.cpp_builder", "CppBuilder")
    device_options = _get("torch._inductor.cpp_builder", "CppTorchDeviceOptions")
    isa = _get(_VEC_ISA, "pick_vec_isa")() if with_isa else _get(_VEC_ISA, "invalid_vec_isa")
    options = device_options(vec_isa=isa, device_type="cpu", **bindings.cpp_compile_command_flags)
    line: str = builder(name="o", sources="i", BuildOption=options).get_command_line()
    return line


def vec_isa_candidates() -> list[tuple[Any, str]]:
    """Inductor's x86 vector ISA candidates in its order of preference, each with the compiler flags it
    builds with (`_arch_flags`); empty off x86."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    return [(isa, str(getattr(isa, "_arch_flags", ""))) for isa in _get(_VEC_ISA, "supported_vec_isa_list")]


def probe_vec_isas(run_side_by_side: Callable[[list[Callable[[], Any]]], Any]) -> None:
    """Have Inductor decide every candidate ISA this CPU's flags allow at once, each a g++ probe build, with
    `run_side_by_side` (each candidate caches its answer, so `vec_isa` then only reads them). Nothing to do
    off x86, or where the ISA is set by configuration."""
    import torch._inductor.config

    if platform.machine() not in ("x86_64", "AMD64") or torch._inductor.config.cpp.vec_isa_ok is not None:
        return
    flags = _get(_VEC_ISA, "x86_isa_checker")()
    candidates = [isa for isa, _ in vec_isa_candidates() if all(flag in flags for flag in str(isa).split())]
    run_side_by_side([functools.partial(bool, isa) for isa in candidates])


def vec_isa() -> str:
    """The vector ISA Inductor's C++ backend generates code for on this CPU (e.g. `avx512 avx512_vnni`)."""
    isa = _get(_VEC_ISA, "pick_vec_isa")()
    return str(isa) if isa else "none"


def enable_compile_caches() -> None:
    """Inductor's FX graph cache and AOTAutograd's cache on (their variables are read when torch is imported,
    which may have happened already)."""
    import torch._functorch.config
    import torch._inductor.config

    _get("torch._inductor.config", "fx_graph_cache")
    _get("torch._functorch.config", "enable_autograd_cache")
    torch._inductor.config.fx_graph_cache = True
    torch._functorch.config.enable_autograd_cache = True


def raise_recompile_limits(limit: int, accumulated: int) -> None:
    """Dynamo's recompile limits raised to at least `limit` per code object and `accumulated` in all (past
    them a new shape silently runs eager)."""
    import torch._dynamo.config

    _get("torch._dynamo.config", "recompile_limit")
    _get("torch._dynamo.config", "accumulated_recompile_limit")
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
    torch._dynamo.config.accumulated_recompile_limit = max(
        torch._dynamo.config.accumulated_recompile_limit, accumulated
    )


def checkpoint_side_effects_once() -> contextlib.AbstractContextManager[Any]:
    """While it is open, Dynamo traces a gradient-checkpointed region whose forward changes state outside it
    (the checkpoint's higher-order op) as one graph: the change is made once, in the forward, and not again
    in the backward's recompute (torch's `skip_fwd_side_effects_in_bwd_under_checkpoint`); without it such a
    region breaks the graph. Dynamo reads it as it traces, so a graph is the same in every process that traces
    it under this setting."""
    import torch._dynamo.config

    _get("torch._dynamo.config", "skip_fwd_side_effects_in_bwd_under_checkpoint")
    patched: contextlib.AbstractContextManager[Any] = torch._dynamo.config.patch(
        skip_fwd_side_effects_in_bwd_under_checkpoint=True
    )
    return patched


def checkpoint_side_effects_problem() -> str | None:
    """Why `checkpoint_side_effects_once` does not hold at the installed torch, one sentence (None: it holds)."""
    target = _BY_FUNCTION[("torch._dynamo.config", "skip_fwd_side_effects_in_bwd_under_checkpoint")]
    problems = targets.check(LIBRARY, CHECKED_ON, (target,))
    return problems[0] if problems else None


def dynamo_counters() -> Any:
    """Dynamo's counters (`counters[group][name]`), or None where Dynamo was never imported (nothing counted)."""
    if "torch._dynamo.utils" not in sys.modules:
        return None
    return _get("torch._dynamo.utils", "counters")


def dynamo_compile_seconds() -> float:
    """Seconds Dynamo spent compiling in this process (frames, plus lazily compiled backwards); 0 where Dynamo
    was never imported."""
    if "torch._dynamo.utils" not in sys.modules:
        return 0.0
    spent = _get("torch._dynamo.utils", "calculate_time_spent")()
    return float(spent.get("total_wall_time", 0.0))


def import_kernel_builders() -> None:
    """Import what `kernel_command_line`, `torch_key` and the ISA probes import, so that they can then run in
    threads beside other work (two threads importing at once can meet a module the other half imported)."""
    import torch._inductor.codecache
    import torch._inductor.cpp_builder
    import torch._inductor.cpu_vec_isa
    import torch.utils.cpp_extension  # noqa: F401  (the ISA probe's build options import it)


def import_compiler() -> None:
    """Import Dynamo and Inductor's compiler stack now, not in the first training step."""
    import torch._dynamo  # noqa: F401

    _get("torch._inductor.compile_fx", None)


def dynamo_time_spent() -> dict[str, float]:
    """Dynamo's timers of this process by phase (`entire_frame_compile`, `backend_compile`,
    `entire_backward_compile`, ...); empty where Dynamo was never imported."""
    if "torch._dynamo.utils" not in sys.modules:
        return {}
    spent: dict[str, float] = _get("torch._dynamo.utils", "calculate_time_spent")()
    return spent


def register_compile_start(callback: Callable[[Any], None], module: Any = None) -> None:
    """Have Dynamo call `callback` before each compile it starts. `module`: `torch._dynamo.callback` as it is
    being imported (an import hook's), else imported here."""
    if module is None:
        module = importlib.import_module("torch._dynamo.callback")
    _get("torch._dynamo.callback", "callback_handler.register_start_callback")
    module.callback_handler.register_start_callback(callback)


# --- the trace skip ----------------------------------------------------------------------------------


def trace_skip_problem() -> str | None:
    """The first target of the trace skip's that does not hold at the installed torch, one sentence (None: all
    hold)."""
    problems = targets.check(LIBRARY, CHECKED_ON, TRACE_SKIP_TARGETS)
    return problems[0] if problems else None


_COMPILED_MODULE_HOOKS: list[Callable[[Any], None]] = []
_IN_PLACE_HOOKS: list[Callable[[Any], None]] = []


def on_compiled_module(hook: Callable[[Any], None]) -> None:
    """Run `hook` (once, however often it is given) on every OptimizedModule made from now on (accelerate wraps
    the model in torch.compile while the trainer is built), once torch has set it up: its `_initialize` is
    wrapped, once."""
    _get(_EVAL_FRAME, "OptimizedModule._initialize")
    optimized_module = importlib.import_module(_EVAL_FRAME).OptimizedModule
    _run_after(optimized_module, "_initialize", _COMPILED_MODULE_HOOKS, hook)


def on_module_compiled_in_place(hook: Callable[[Any], None]) -> None:
    """Run `hook` (once, however often it is given) on every module compiled in place from now on
    (`nn.Module.compile`, which DeepSpeed's engine calls on the model it wraps: torch.compile of the module's
    `_call_impl`, kept as its `_compiled_call_impl`, which its `__call__` runs; no OptimizedModule is made), once
    torch has set that compiled call: `Module.compile` is wrapped, once (a subclass that overrides it and calls it
    reaches the wrapper too). Imports no Dynamo."""
    _get(_MODULE, "Module.compile")
    module_class = importlib.import_module(_MODULE).Module
    _run_after(module_class, "compile", _IN_PLACE_HOOKS, hook)


def _run_after(
    owner: type, method: str, hooks: list[Callable[[Any], None]], hook: Callable[[Any], None]
) -> None:
    """Add `hook` to `hooks` (once), each run on the instance after `owner.method` returns; the method is
    wrapped once (the wrapper carries `hooks`)."""
    if hook not in hooks:
        hooks.append(hook)
    original = getattr(owner, method)
    if getattr(original, "_warmup_hooks", None) is not None:
        return

    @functools.wraps(original)
    def run_hooks_after(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        for each in list(hooks):
            each(self)
        return result

    run_hooks_after._warmup_hooks = hooks  # type: ignore[attr-defined]
    setattr(owner, method, run_hooks_after)


def remove_compiled_module_hook(hook: Callable[[Any], None]) -> None:
    """Stop running `hook` on new compiled modules, of either kind."""
    for hooks in (_COMPILED_MODULE_HOOKS, _IN_PLACE_HOOKS):
        if hook in hooks:
            hooks.remove(hook)


def _is_optimized_module(compiled: Any) -> bool:
    optimized_module = importlib.import_module(_EVAL_FRAME).OptimizedModule
    return isinstance(compiled, optimized_module)


def compiled_module_parts(compiled: Any) -> tuple[Any, Any, bool | None]:
    """What torch.compile compiled: the module, the backend (the innermost, as given to torch.compile) and the
    shape policy (`dynamic`), of an OptimizedModule (its `dynamo_ctx`) or of a module compiled in place (the
    Dynamo context that made its `_compiled_call_impl`, which torch's compiled function keeps in its closure
    as `self`: `_TorchDynamoContext.__call__`)."""
    innermost_backend = _get(_EVAL_FRAME, "innermost_backend")
    if _is_optimized_module(compiled):
        context = compiled.dynamo_ctx
        return compiled._orig_mod, innermost_backend(context.callback), context._dynamic
    _get(_MODULE, "Module._compiled_call_impl")
    context = _dynamo_context(compiled._compiled_call_impl)
    return compiled, innermost_backend(context.callback), context._dynamic


def _dynamo_context(fn: Any) -> Any:
    """The Dynamo context a compiled function was made by (the `self` of `_TorchDynamoContext.__call__`, in the
    function's closure); IncompatibleLibraryError naming `compiled_module_parts` where torch keeps it no more."""
    target = _BY_FUNCTION[(_EVAL_FRAME, "_TorchDynamoContext.__call__")]
    _get(_EVAL_FRAME, "_TorchDynamoContext.__call__")
    context_class = importlib.import_module(_EVAL_FRAME)._TorchDynamoContext
    code = getattr(fn, "__code__", None)
    cells = dict(zip(getattr(code, "co_freevars", ()), getattr(fn, "__closure__", None) or (), strict=False))
    cell = cells.get("self")
    context = cell.cell_contents if cell is not None else None
    if not isinstance(context, context_class):
        what = "no longer keeps its Dynamo context in the compiled function's closure as `self`"
        raise targets.incompatible(LIBRARY, CHECKED_ON, target, what)
    return context


def run_compiled_call(compiled: Any, call: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Have calls of what torch.compile compiled run `call(eager)` instead of Dynamo, where `eager` calls the
    module as it is without torch.compile: an OptimizedModule's `forward` (what its call runs) becomes it,
    `eager` calling the module it wraps; a module compiled in place gets it as its `_compiled_call_impl`,
    `eager` being its `_call_impl` (its hooks, then its forward)."""
    if _is_optimized_module(compiled):
        compiled.forward = call(compiled._orig_mod)
        return
    _get(_MODULE, "Module._call_impl")
    _get(_MODULE, "Module._compiled_call_impl")
    compiled._compiled_call_impl = call(compiled._call_impl)


def has_hooks(module: Any) -> bool:
    """Whether calling the module runs hooks besides its `forward`: its own, or the global ones every module
    runs."""
    hooks = importlib.import_module(_MODULE)
    own = (
        module._forward_pre_hooks,
        module._forward_hooks,
        module._backward_pre_hooks,
        module._backward_hooks,
    )
    # called on every backbone call: its targets are checked once, by `trace_skip_problem`
    return any(own) or any(getattr(hooks, name) for name in _GLOBAL_MODULE_HOOKS)


def dynamo_compiled(fn: Callable[..., Any], *, backend: Any, dynamic: bool | None) -> Callable[..., Any]:
    """`fn` compiled by Dynamo with `backend` and the shape policy `dynamic`, as torch.compile compiles a model."""
    compiled: Callable[..., Any] = _get("torch._dynamo", "optimize")(backend=backend, dynamic=dynamic)(fn)
    return compiled


def unserializable_guard_types() -> frozenset[str]:
    """The kinds of Dynamo guards torch cannot save with an `aot_compile` artifact."""
    kinds = _get("torch._dynamo.guards", "CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES")
    return frozenset(kinds)


def aot_compile(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    backend: Any,
    dynamic: bool | None,
    guard_filter_fn: Callable[[Any], list[bool]],
) -> Any:
    """torch's `aot_compile` of `fn` on (args, kwargs), one graph without breaks, keeping the guards
    `guard_filter_fn` keeps: an artifact to `save_compiled_function`. Globals the transformed bytecode loads
    but torch does not save with it (modules Dynamo installed under generated names) are saved by value, as
    torch saves the graph's own globals."""
    _get(_AOT, "AOTCompiledFunction._extra_globals")
    optimize = _get("torch._dynamo", "optimize")
    compiled = optimize(backend=backend, nopython=True, dynamic=dynamic, guard_filter_fn=guard_filter_fn)(fn)
    aot = compiled.aot_compile((args, kwargs))
    artifacts = aot._artifacts
    env = artifacts.runtime_env
    missing = env.external_refs - env.used_globals.keys() - env.import_sources.keys() - {artifacts.backend_id}
    for ref in missing:
        value = (aot._extra_globals or {}).get(ref)
        if not isinstance(value, types.ModuleType):
            raise RuntimeError(f"the compiled code needs global {ref!r}, which cannot be saved")
        env.used_globals[ref] = value
    return aot


def guard_failure(loaded: Any, *args: Any, **kwargs: Any) -> str:
    """Why the `aot_compile` artifact `loaded` refuses a call: its first failing guard as Dynamo words it (`''`
    when torch does not say). A second evaluation of the guards: for a call that is traced anyway."""
    try:
        _get(_AOT, "AOTCompiledFunction.prepare_f_locals")
        info = loaded._artifacts.guard_manager.check_verbose(loaded.prepare_f_locals(*args, **kwargs))
        parts = [str(part).strip() for part in getattr(info, "verbose_code_parts", None) or ()]
    except Exception:  # only words for a miss: never a reason to fail the call
        return ""
    return " ".join(parts[0].split())[:200] if parts else ""


def load_aot_compiled(data: bytes, external_data: dict[str, Any]) -> Any:
    """An `aot_compile` artifact loaded back, its guards left to the caller (`guard_check`), which checks them
    once before it calls it."""
    load = _get("torch.compiler", "load_compiled_function")
    _get(_AOT, "AOTCompiledFunction.disable_guard_check")
    loaded = load(io.BytesIO(data), external_data=external_data)
    loaded.disable_guard_check()
    return loaded
