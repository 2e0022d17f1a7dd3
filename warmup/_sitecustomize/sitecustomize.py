"""Run by every Python process `warmup exec` starts (it is first on their PYTHONPATH).

Dynamo's recompile limits have no environment variable, and a training script under `warmup exec`
does not call `warmup.activate`. So this module installs an import hook: when `torch._dynamo.config`
is first imported (torch imports it lazily, at the first `torch.compile`), it raises
`recompile_limit` and `accumulated_recompile_limit` to WARMUP_RECOMPILE_LIMIT and
WARMUP_ACCUMULATED_RECOMPILE_LIMIT, as `warmup.activate` does; past the default of 8 shapes, Dynamo
would otherwise run new shapes eager without a word. The rest of the compile policy (cache directory,
key tag, static shapes) is plain environment, set by `warmup exec` itself.

It then runs the `sitecustomize` that was next on the path, if any, so that an image's own
customisation still runs. Standard library only, and nothing here may stop the process from starting.
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


class _LimitsHook(importlib.abc.MetaPathFinder):
    """Finds torch._dynamo.config as the path finder would, and raises the limits once it has run."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            try:
                _raise_limits(module)
            except Exception as error:  # never break torch's import
                print(f"trl-warmup: could not raise Dynamo's recompile limits: {error}", file=sys.stderr)

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


if any(variable in os.environ for variable in LIMITS.values()) and TARGET not in sys.modules:
    sys.meta_path.insert(0, _LimitsHook())
_run_next_sitecustomize()
