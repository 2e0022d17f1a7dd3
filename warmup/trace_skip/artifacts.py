"""What a trace artifact is for and how it is found again: the model it was made for (its class, config and
adapters), the call it serves, the guards it keeps, the functions it refers to, its name and how it loads."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import re
import types
from collections.abc import Callable, Iterator
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


Autocast = tuple[tuple[str, str], ...]  # (device type, dtype) of each autocast region a call runs in


def autocast_state(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Autocast:
    """The autocast regions the call runs in (accelerate's mixed precision: TRL's default bf16 on CPU, bf16 or
    fp16 on an accelerator), for the CPU and the devices of its tensors. Among Dynamo's global guards: an
    artifact compiled outside them is refused inside, so the rehearsal compiles and checks each call under the
    regions it met."""
    import torch

    devices = {"cpu"} | {v.device.type for v in [*args, *kwargs.values()] if isinstance(v, torch.Tensor)}
    return tuple(
        (device, str(torch.get_autocast_dtype(device)).removeprefix("torch."))
        for device in sorted(devices)
        if torch.is_autocast_enabled(device)
    )


@contextlib.contextmanager
def autocast_regions(state: Autocast) -> Iterator[None]:
    """Run the block inside the autocast regions `state` names (outside any, when it names none)."""
    import torch

    with contextlib.ExitStack() as stack:
        for device, dtype in state:
            stack.enter_context(torch.autocast(device_type=device, dtype=getattr(torch, dtype)))
        yield


@contextlib.contextmanager
def outside_autocast(state: Autocast) -> Iterator[None]:
    """Leave the autocast regions `state` names for the block (an artifact of a call made in them carries its own:
    `forward_in_autocast`)."""
    import torch

    with contextlib.ExitStack() as stack:
        for device, _dtype in state:
            stack.enter_context(torch.autocast(device_type=device, enabled=False))
        yield


# The keyword arguments `forward_in_autocast` takes its region from.
AUTOCAST_DEVICE, AUTOCAST_DTYPE = "_warmup_autocast_device", "_warmup_autocast_dtype"


def forward_in_autocast(module: Any, *args: Any, **kwargs: Any) -> Any:
    """The backbone's forward inside one autocast region, which is how the artifact of a call made in mixed
    precision is compiled and run. torch's aot_compile under an ambient autocast guards the inputs' dispatch keys
    as they are outside it, so such an artifact would refuse every call it was made for; compiled with the region
    inside the function and called outside the ambient one (`outside_autocast`), it runs the same casts."""
    import torch

    device, dtype = kwargs.pop(AUTOCAST_DEVICE), kwargs.pop(AUTOCAST_DTYPE)
    with torch.autocast(device_type=device, dtype=dtype):
        return type(module).forward(module, *args, **kwargs)


def autocast_arguments(state: Autocast) -> dict[str, Any]:
    """What `forward_in_autocast` is called with for `state` (one region; none: nothing)."""
    import torch

    if not state:
        return {}
    if len(state) > 1:
        raise ValueError(f"autocast on several devices at once ({', '.join(d for d, _ in state)})")
    ((device, dtype),) = state
    return {AUTOCAST_DEVICE: device, AUTOCAST_DTYPE: getattr(torch, dtype)}


def describe_call(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A call's input signature: what a graph specialises on among the arguments, with grad mode, mode and the
    autocast regions it runs in."""
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
    autocast = "".join(f"autocast={device}:{dtype};" for device, dtype in autocast_state(args, kwargs))
    return f"{'train' if module.training else 'eval'};{grad};{autocast}" + ",".join(parts)


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
