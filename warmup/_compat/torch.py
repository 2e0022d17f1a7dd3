"""torch's private names, in one place: Inductor's code cache and C++ build, its CPU ISA probes, the
compile caches' switches, Dynamo's recompile limits and miss counters.

Written against torch 2.13.0; checked on torch 2.13.0 and 2.14.1 (`CHECKED_ON`). Each function names the
private target it reaches in `TARGETS`; `check()` resolves them all (tests/unit/test_compat.py), and a
function whose target moved raises IncompatibleLibraryError naming itself. Importing this module imports
no torch; each function imports what it reaches.
"""

from __future__ import annotations

import functools
import importlib
import platform
import sys
from collections.abc import Callable
from typing import Any

from warmup._compat import targets
from warmup._compat.targets import Target

LIBRARY = "torch"
CHECKED_ON = ("2.13.0", "2.14.1")

_CODECACHE = "torch._inductor.codecache"
_VEC_ISA = "torch._inductor.cpu_vec_isa"
TARGETS = (
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
    Target("torch._dynamo.utils", "counters", "dynamo_counters"),
    Target("torch._dynamo.utils", "calculate_time_spent", "dynamo_compile_seconds"),
    Target("torch._inductor.compile_fx", None, "import_compiler"),
)
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
