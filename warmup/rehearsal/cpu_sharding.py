"""FSDP on CPU, as accelerate runs it on an accelerator: the stand-in trl-warmup's CPU proofs use.

accelerate 1.15 takes its FSDP branch only on an accelerator: `AcceleratorState` sets up FSDP for MULTI_GPU,
MULTI_NEURON and the like, not for MULTI_CPU, so a job that trains with `use_cpu: true` under an FSDP launch
(`accelerate launch --config_file fsdp2.yaml`, `trl sft --accelerate_config fsdp2`) silently runs under DDP instead
(measured, docs/multi-node.md). DeepSpeed needs no help: with `use_cpu: true` the Trainer's Accelerator takes its
DeepSpeed branch on CPU (DeepSpeed's CPU accelerator, gloo). `shard_on_cpu()` makes the state take the FSDP branch
with the CPU as the device and gloo as the backend, with the plugin the launcher or the trainer config built: the
same `fully_shard` on CPU tensors. The rehearsal of a CPU job calls it in each rank; a CPU training process meant to
run the graphs such a cache holds calls it too, before its trainer is built.

Nothing here runs on a GPU or Neuron target: there accelerate shards by itself.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def shard_on_cpu() -> None:
    """Make accelerate's AcceleratorState take its FSDP branch on CPU (once per process)."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

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
            # what the accelerator branch does with the plugin, down to telling the PartialState (every later
            # AcceleratorState() copies its distributed_type back)
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = self.distributed_type

    AcceleratorState.__init__ = init
