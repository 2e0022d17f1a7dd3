"""Run by every Python process `warmup exec` starts (it is first on their PYTHONPATH).

Dynamo's recompile limits have no environment variable, and a training script under `warmup exec`
does not call `warmup.activate`. So this module installs an import hook: when `torch._dynamo.config`
is first imported (torch imports it lazily, at the first `torch.compile`), it raises
`recompile_limit` and `accumulated_recompile_limit` to WARMUP_RECOMPILE_LIMIT and
WARMUP_ACCUMULATED_RECOMPILE_LIMIT, as `warmup.activate` does; past the default of 8 shapes, Dynamo
would otherwise run new shapes eager without a word. The rest of the compile policy (cache directory,
key tag, static shapes) is plain environment, set by `warmup exec` itself. Under `warmup exec --strict`
(WARMUP_STRICT=1) a second hook gives every transformers Trainer a strict `WarmupCallback` when the
script did not add one: the callback is what stops a run that meets a graph the cache does not hold (the
same hook times each Trainer's first step for the trace skip's exit line).
When `warmup exec` downloads the cache beside the command (WARMUP_PULL_OUTCOME), a third hook makes
Dynamo's first compile wait for the download (warmup/client/background.py). Under the canonical kernel
layout (WARMUP_KERNEL_LAYOUT) a fourth puts it into Inductor as its code cache is imported (warmup/layout.py):
kernels keyed by the content of torch's and Python's installs, as the warm-up keyed them, and no
precompiled header built unless a kernel is. When the cache holds trace artifacts, a fifth makes the models
torch.compile wraps run them (warmup/trace_skip/), as `warmup.activate` does, and a sixth, as torch is imported,
the models compiled in place (DeepSpeed's engine).

It then runs the `sitecustomize` that was next on the path, if any, so that an image's own
customisation still runs. Standard library only as it is imported (the hooks reach torch and transformers
through trl-warmup's seams, warmup/_compat/, as they run), and nothing here may stop the process from starting.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

TARGET = "torch._dynamo.config"
LIMITS = {
    "recompile_limit": "WARMUP_RECOMPILE_LIMIT",
    "accumulated_recompile_limit": "WARMUP_ACCUMULATED_RECOMPILE_LIMIT",
}
HERE = os.path.dirname(os.path.abspath(__file__))


def _raise_limits(config: ModuleType) -> None:
    for name, variable in LIMITS.items():
        try:
            wanted = int(os.environ.get(variable, ""))
        except ValueError:
            continue
        current = getattr(config, name, None)
        if isinstance(current, int) and wanted > current:
            setattr(config, name, wanted)


def _trainers(module: ModuleType) -> None:
    """Every transformers Trainer times its first step, for the exit line the trace skip prints (the
    compile time and where it went). Under `warmup exec --strict` (WARMUP_STRICT) each also gets a
    WarmupCallback (unless it has one): the callback is what stops a run that meets an unwarmed graph."""
    from warmup._compat.transformers import wrap_trainer_init

    strict = os.environ.get("WARMUP_STRICT") == "1"

    def wrap(init: Any) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            from warmup.pod.callback.observer import WarmupCallback
            from warmup.pod.callback.timings import first_step_clock

            given = kwargs.get("callbacks") or ()
            # Built before the trainer, as a script passing `callbacks=[...]` does (planning keeps accelerate's
            # state either way: warmup.job.trl_args.accelerate_state_kept).
            callback = None
            if strict and not any(isinstance(c, WarmupCallback) for c in given):
                callback = WarmupCallback(strict=True)
                callback.stand_in = True  # a script that adds its own after the build (add_callback) keeps it
            init(self, *args, **kwargs)
            handler = getattr(self, "callback_handler", None)
            present = handler is None or any(isinstance(c, WarmupCallback) for c in handler.callbacks)
            if callback is not None and not present:
                self.add_callback(callback)  # verifies and counts from on_train_begin
            if handler is not None:
                self.add_callback(first_step_clock())

        return __init__

    wrap_trainer_init(module, wrap)


def _wait_for_the_cache(module: ModuleType) -> None:
    """When `warmup exec` downloads the cache beside this process (WARMUP_PULL_OUTCOME), every Dynamo
    compile first waits for the download to finish: no graph is compiled before its cached code is
    there (warmup/client/background.py; a failed download raises there)."""
    from warmup._compat.torch import register_compile_start

    def wait(_args: Any) -> None:
        from warmup.client.background import wait_for_pull

        wait_for_pull()

    register_compile_start(wait, module)


def _canonical_kernel_layout(module: ModuleType) -> None:
    from warmup.layout import defer_precompiled_headers, install

    install(module)
    defer_precompiled_headers(module)  # a training process: kernels come from the cache


def _skip_warmed_traces(module: ModuleType) -> None:
    """A warmed cache with trace artifacts (warmup/trace_skip/): the first model torch.compile wraps gets
    them, once the download beside the command is done; under WARMUP_TRACE_SKIP=0 its backbone is split as
    the warm-up split it, without them. At exit, where the compile time went."""
    from warmup.pod.callback.timings import exit_line
    from warmup.trace_skip.serve import enable_when_compiled

    enable_when_compiled(os.environ["TORCHINDUCTOR_CACHE_DIR"], exit_line)


def _skip_warmed_traces_in_place(module: ModuleType) -> None:
    """The same for a model compiled in place (`nn.Module.compile`, DeepSpeed's engine's compile), hooked as soon
    as torch is imported: that compile imports Dynamo itself, too late for the hook above to see it."""
    from warmup.pod.callback.timings import exit_line
    from warmup.trace_skip.serve import enable_when_compiled

    enable_when_compiled(os.environ["TORCHINDUCTOR_CACHE_DIR"], exit_line, in_place_only=True)


AFTER_IMPORT = {
    TARGET: _raise_limits,
    "torch._dynamo.eval_frame": _skip_warmed_traces,
    "torch": _skip_warmed_traces_in_place,
    "transformers.trainer": _trainers,
    "torch._dynamo.callback": _wait_for_the_cache,
    "torch._inductor.codecache": _canonical_kernel_layout,
}


class _LimitsHook(importlib.abc.MetaPathFinder):
    """Finds the modules of AFTER_IMPORT as the path finder would, and runs its function on each once it
    has run: Dynamo's limits are raised, and under --strict each Trainer gets the callback."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            try:
                AFTER_IMPORT[name](module)
            except Exception as error:  # never break torch's (or transformers') import
                print(f"trl-warmup: could not set up {name}: {error}", file=sys.stderr)

        loader.exec_module = exec_module
        return spec


def _run_next_sitecustomize() -> None:
    """The sitecustomize this one shadows (an image's own, or the distribution's), if there is one."""
    path = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        print(f"trl-warmup: the sitecustomize in {spec.origin} failed: {error!r}", file=sys.stderr)


_hooked = set()
if any(variable in os.environ for variable in LIMITS.values()) and TARGET not in sys.modules:
    _hooked.add(TARGET)
if os.environ.get("WARMUP_PULL_OUTCOME") and "torch._dynamo.callback" not in sys.modules:
    _hooked.add("torch._dynamo.callback")
if os.environ.get("WARMUP_KERNEL_LAYOUT") == "1" and "torch._inductor.codecache" not in sys.modules:
    _hooked.add("torch._inductor.codecache")
# also under WARMUP_TRACE_SKIP=0: the backbone must be split as the warm-up split it (warmup/trace_skip/)
trace_skip = bool(os.environ.get("TORCHINDUCTOR_CACHE_DIR")) and "WARMUP_SPEC" in os.environ
if trace_skip and "torch._dynamo.eval_frame" not in sys.modules:
    _hooked.add("torch._dynamo.eval_frame")
if trace_skip and "torch" not in sys.modules:
    _hooked.add("torch")
# the strict callback, and the first step's time for the trace skip's exit line
if (trace_skip or os.environ.get("WARMUP_STRICT") == "1") and "transformers.trainer" not in sys.modules:
    _hooked.add("transformers.trainer")
if _hooked:
    sys.meta_path.insert(0, _LimitsHook(_hooked))
_run_next_sitecustomize()
