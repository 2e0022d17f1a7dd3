"""What a trace artifact is for and how it is found again: the model it was made for (its class, config and
adapters), the call it serves, the guards it keeps, the functions it refers to, its name and how it loads."""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import re
import types
from collections.abc import Callable
from typing import Any

from warmup._compat import torch as compat_torch

log = logging.getLogger(__name__)

TRACE_DIR = "trace"
FORMAT = 1

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

SPLIT_MARKER = "split.json"
# Left instead of the split marker by a rehearsal that kept no trace for a reason of the job's (a sharded launch:
# `losses.predicted_loss`), so that a training process over its cache says that reason.
OFF_MARKER = "off.json"


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


def artifact_name(digest: str, description: str) -> str:
    return hashlib.sha256(f"{FORMAT};{digest};{description}".encode()).hexdigest()[:32]


def load_artifact(data: bytes, module: Any) -> Any:
    return compat_torch.load_aot_compiled(
        data, hidden_functions(module)
    )  # `TraceSkip.serve` checks the guards
