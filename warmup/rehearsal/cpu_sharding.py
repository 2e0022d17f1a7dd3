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

from warmup._compat import accelerate as compat_accelerate


@functools.cache
def shard_on_cpu() -> None:
    """Make accelerate's AcceleratorState take its FSDP branch on CPU (once per process)."""
    compat_accelerate.take_fsdp_branch_on_cpu()
