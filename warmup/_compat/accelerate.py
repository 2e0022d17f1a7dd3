"""accelerate's private names, in one place: the one patch trl-warmup installs in accelerate, its process-wide
state kept across a TRL config's construction, and the launch command's validation, which applies accelerate's
precedence between a config file and explicit keys.

Written against accelerate 1.15.0; checked on accelerate 1.15.0 and 1.16.0 (`CHECKED_ON`). `check()`
resolves every target (tests/unit/test_compat.py). Importing this module imports no accelerate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from warmup._compat import targets
from warmup._compat.targets import Target

LIBRARY = "accelerate"
CHECKED_ON = ("1.15.0", "1.16.0")

_STATE = "accelerate.state"
TARGETS = (
    Target(
        _STATE,
        "AcceleratorState.__init__",
        "take_fsdp_branch_on_cpu",
        ("self", "mixed_precision", "cpu", "dynamo_plugin", "deepspeed_plugin", "fsdp_plugin"),
    ),
    Target(_STATE, "PartialState._shared_state", "take_fsdp_branch_on_cpu"),
    Target(_STATE, "AcceleratorState._shared_state", "shared_state_kept"),
    Target("accelerate.commands.launch", "_validate_launch_command", "validate_launch_command", ("args",)),
)


_INIT, _PARTIAL_SHARED_STATE, _ACCELERATOR_SHARED_STATE, _VALIDATE = TARGETS


def check() -> list[str]:
    """Every target of this seam that does not hold at the installed accelerate, one line each."""
    return targets.check(LIBRARY, CHECKED_ON, TARGETS)


def take_fsdp_branch_on_cpu() -> None:
    """Make `AcceleratorState` take its FSDP branch on CPU: what its accelerator branch does with the FSDP
    plugin (set the distributed type, the plugin's mixed precision, the plugin), down to telling the
    `PartialState`, whose shared state every later `AcceleratorState()` copies its distributed type from.
    Call once per process (warmup.rehearsal.cpu_sharding.shard_on_cpu)."""
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    original = targets.resolve(LIBRARY, CHECKED_ON, _INIT)
    targets.resolve(LIBRARY, CHECKED_ON, _PARTIAL_SHARED_STATE)

    def init(
        self: Any,
        mixed_precision: str | None = None,
        cpu: bool = False,
        dynamo_plugin: Any = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        original(self, mixed_precision, cpu, dynamo_plugin, deepspeed_plugin, fsdp_plugin, *args, **kwargs)
        if self.distributed_type == DistributedType.MULTI_CPU and fsdp_plugin is not None:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            targets.resolve(LIBRARY, CHECKED_ON, _PARTIAL_SHARED_STATE)["distributed_type"] = (
                self.distributed_type
            )

    AcceleratorState.__init__ = init


def validate_launch_command(args: Any) -> tuple[Any, Any, Any]:
    """`accelerate launch`'s own check of its parsed arguments, which fills them from the config file they name
    with its precedence: (args, defaults, mixed precision)."""
    validated: tuple[Any, Any, Any] = targets.resolve(LIBRARY, CHECKED_ON, _VALIDATE)(args)
    return validated


@contextlib.contextmanager
def shared_state_kept() -> Iterator[None]:
    """Build a TRL config without touching a live trainer's accelerate state.

    Building any TrainingArguments sets its devices up, and transformers first resets accelerate's
    process-wide state (`AcceleratorState._reset_state(reset_partial_state=True)`). Where a trainer already
    made its Accelerator (the callback or `activate` planning inside a training process), that state is the
    trainer's: it is put back as it was, else `train()` fails on an emptied `AcceleratorState`.
    """
    try:
        import accelerate.state  # noqa: F401
    except ImportError:  # no accelerate, no state to keep
        yield
        return
    shared_states = [
        targets.resolve(LIBRARY, CHECKED_ON, target)
        for target in (_PARTIAL_SHARED_STATE, _ACCELERATOR_SHARED_STATE)
    ]
    kept = [(shared, dict(shared)) for shared in shared_states]
    try:
        yield
    finally:
        for shared, before in kept:
            if before:  # the same dict object: every live PartialState / AcceleratorState sees it again
                shared.clear()
                shared.update(before)
