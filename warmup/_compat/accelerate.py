"""accelerate's private names, in one place: the one patch trl-warmup installs in accelerate, and the launch
command's validation, which applies accelerate's precedence between a config file and explicit keys.

Written against accelerate 1.15.0; checked on accelerate 1.15.0 and 1.16.0 (`CHECKED_ON`). `check()`
resolves every target (tests/unit/test_compat.py). Importing this module imports no accelerate.
"""

from __future__ import annotations

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
    Target("accelerate.commands.launch", "_validate_launch_command", "validate_launch_command", ("args",)),
)


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

    original = targets.resolve(LIBRARY, CHECKED_ON, TARGETS[0])
    targets.resolve(LIBRARY, CHECKED_ON, TARGETS[1])

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
            targets.resolve(LIBRARY, CHECKED_ON, TARGETS[1])["distributed_type"] = self.distributed_type

    AcceleratorState.__init__ = init


def validate_launch_command(args: Any) -> tuple[Any, Any, Any]:
    """`accelerate launch`'s own check of its parsed arguments, which fills them from the config file they name
    with its precedence: (args, defaults, mixed precision)."""
    validated: tuple[Any, Any, Any] = targets.resolve(LIBRARY, CHECKED_ON, TARGETS[2])(args)
    return validated
