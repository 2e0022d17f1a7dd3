"""trl-warmup: pre-warm compile caches for TRL training jobs.

The names below are the package's public surface: import them from `warmup` (`from warmup import
WarmupCallback, pull`); the modules they live in are internals that may move. Each is imported on first
use, so `import warmup` in a training pod imports nothing heavy (no torch, no TRL, no server package).
`__version__` is the project's one version (pyproject.toml reads it from here).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> (module, attribute): where each public name is defined.
_EXPORTS: dict[str, tuple[str, str]] = {
    # the training process
    "activate": ("warmup.pod.activation", "activate"),
    "Activation": ("warmup.pod.activation", "Activation"),
    "WarmupCallback": ("warmup.pod.callback.observer", "WarmupCallback"),
    # the pod's client
    "pull": ("warmup.client.pulling", "pull"),
    "PullResult": ("warmup.client.installing", "PullResult"),
    # specs, plans and toolchains
    "load_spec": ("warmup.job.spec", "load_spec"),
    "Spec": ("warmup.job.spec", "Spec"),
    "Target": ("warmup.job.spec", "Target"),
    "DataFacts": ("warmup.job.spec", "DataFacts"),
    "plan": ("warmup.planner.planning", "plan_spec"),
    "Plan": ("warmup.signature", "Plan"),
    "Signature": ("warmup.signature", "Signature"),
    "Toolchain": ("warmup.toolchain.model", "Toolchain"),
    "dataset_facts": ("warmup.facts.reading", "dataset_facts"),
    "DatasetFacts": ("warmup.facts.summary", "DatasetFacts"),
    # the errors a user catches (every one is a WarmupError)
    "WarmupError": ("warmup.errors", "WarmupError"),
    "SpecError": ("warmup.errors", "SpecError"),
    "ToolchainMismatchError": ("warmup.errors", "ToolchainMismatchError"),
    "NotWarmedError": ("warmup.errors", "NotWarmedError"),
    "PartlyWarmedError": ("warmup.errors", "PartlyWarmedError"),
    "WarmupFailedError": ("warmup.errors", "WarmupFailedError"),
    "UnwarmedCompileError": ("warmup.errors", "UnwarmedCompileError"),
    "BackgroundPullError": ("warmup.errors", "BackgroundPullError"),
    "ServerError": ("warmup.errors", "ServerError"),
    "ServerUnreachableError": ("warmup.errors", "ServerUnreachableError"),
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:  # what a type checker and an editor see (`X as X`: a re-export)
    from warmup.client.installing import PullResult as PullResult
    from warmup.client.pulling import pull as pull
    from warmup.errors import BackgroundPullError as BackgroundPullError
    from warmup.errors import NotWarmedError as NotWarmedError
    from warmup.errors import PartlyWarmedError as PartlyWarmedError
    from warmup.errors import ServerError as ServerError
    from warmup.errors import ServerUnreachableError as ServerUnreachableError
    from warmup.errors import SpecError as SpecError
    from warmup.errors import ToolchainMismatchError as ToolchainMismatchError
    from warmup.errors import UnwarmedCompileError as UnwarmedCompileError
    from warmup.errors import WarmupError as WarmupError
    from warmup.errors import WarmupFailedError as WarmupFailedError
    from warmup.facts.reading import dataset_facts as dataset_facts
    from warmup.facts.summary import DatasetFacts as DatasetFacts
    from warmup.job.spec import DataFacts as DataFacts
    from warmup.job.spec import Spec as Spec
    from warmup.job.spec import Target as Target
    from warmup.job.spec import load_spec as load_spec
    from warmup.planner.planning import plan_spec
    from warmup.pod.activation import Activation as Activation
    from warmup.pod.activation import activate as activate
    from warmup.pod.callback.observer import WarmupCallback as WarmupCallback
    from warmup.signature import Plan as Plan
    from warmup.signature import Signature as Signature
    from warmup.toolchain.model import Toolchain as Toolchain

    plan = plan_spec


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'warmup' has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
