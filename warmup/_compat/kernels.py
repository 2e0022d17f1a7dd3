"""kernels' private names, in one place: the functions transformers' hub kernels turn into modules.

From transformers 5.25 on, `kernels` is a dependency, and `use_kernelized_func` (Qwen3's `apply_rotary_pos_emb`
and others) makes each such function an instance of a module class that `kernels` defines in a local scope,
one instance per decorated layer. torch refuses to save a Dynamo trace that holds an object of a local class
(the trace skip's `aot_compile` artifacts), although that class pickles itself by name: its `__reduce__`
rebuilds it with `_rebuild_kernel_func` from the function's module and name. `saveable_kernel_functions`
lets torch's pickler reach that `__reduce__`.

The forward of every layer `use_kernelized_func` decorates (Qwen3's attention) sets kernels' own context
variable `_ACTIVE_KERNEL_FUNCS` (a `CompileableContextVar`: under Dynamo, two attributes of one module-level
object) to route the function's calls to the layer's own instance, and resets it before it returns. Inside a
gradient-checkpointed decoder layer that set is a change of state outside the checkpoint, which Dynamo refuses
to trace as one graph; `sets_context_in_layers` says which models do it (warmup/trace_skip/split.py).

Written against kernels 0.19.1; checked on kernels 0.19.1 (`CHECKED_ON`). `check()` resolves every target
where kernels is installed (tests/unit/test_compat.py); without it there is nothing to reach. Importing this
module imports no kernels.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from warmup._compat import targets
from warmup._compat.targets import Target
from warmup.errors import IncompatibleLibraryError

LIBRARY = "kernels"
CHECKED_ON = ("0.19.1",)

_LAYER = "kernels._internals.layer.layer"
TARGETS = (
    Target(_LAYER, "_create_func_module", "saveable_kernel_functions", ("func",)),
    Target(_LAYER, "_rebuild_kernel_func", "saveable_kernel_functions", ("module_name", "func_name")),
    Target(_LAYER, "_ACTIVE_KERNEL_FUNCS", "sets_context_in_layers"),
    Target(_LAYER, "CompileableContextVar.set", "sets_context_in_layers", ("self", "value")),
    Target(_LAYER, "CompileableContextVar.reset", "sets_context_in_layers", ("self", "token")),
)
# Where `use_kernelized_func` keeps a layer's own instances of the function modules it calls.
_KERNEL_FUNCTIONS = "_kernel_funcs"


def installed() -> bool:
    return importlib.util.find_spec(LIBRARY) is not None


def check() -> list[str]:
    """Every target of this seam that does not hold at the installed kernels, one line each (none without it)."""
    return targets.check(LIBRARY, CHECKED_ON, TARGETS) if installed() else []


def saveable_kernel_functions(module: Any) -> int:
    """Give the function-module classes that `module`'s layers call (`use_kernelized_func`) their own name as
    qualified name, so that torch's pickler, which refuses a class of a local scope, pickles their instances by
    their own `__reduce__` (by the function's module and name). Only the name changes: the code, and so every
    graph, stays the same. Call it in the warm-up and in the training process alike, before Dynamo traces the
    module. Returns how many classes it renamed; raises IncompatibleLibraryError where this kernels moved them."""
    classes = {
        type(function)
        for layer in module.modules()
        for function in vars(layer).get(_KERNEL_FUNCTIONS, {}).values()
    }
    local = [cls for cls in classes if cls.__qualname__ != cls.__name__]
    if not local:
        return 0
    for target in TARGETS:
        if target.used_by == "saveable_kernel_functions":
            targets.resolve(LIBRARY, CHECKED_ON, target)
    for cls in local:
        if "__reduce__" not in vars(cls):
            raise IncompatibleLibraryError(
                f"kernels: {cls.__module__}.{cls.__qualname__} does not pickle itself by name any more; trl-warmup's "
                f"saveable_kernel_functions needs it to (checked on kernels {', '.join(CHECKED_ON)})"
            )
        cls.__qualname__ = cls.__name__
    return len(local)


def sets_context_in_layers(module: Any) -> bool:
    """Whether any layer of `module` is one `use_kernelized_func` decorated, whose forward sets kernels'
    context variable `_ACTIVE_KERNEL_FUNCS` and resets it to what it was before returning: a change of state
    the layer leaves as it found it, and which only routes a call to a function (resolved as Dynamo traces, so
    the graph holds the routed function's operations and no read of the variable). Raises
    IncompatibleLibraryError where this kernels no longer has that variable."""
    if not any(_KERNEL_FUNCTIONS in vars(layer) for layer in module.modules()):
        return False
    for target in TARGETS:
        if target.used_by == "sets_context_in_layers":
            targets.resolve(LIBRARY, CHECKED_ON, target)
    return True
