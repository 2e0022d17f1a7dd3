"""What a sharded launch (FSDP, DeepSpeed ZeRO) changes in the compiled graphs, and how it is warmed.

Measured on CPU with TRL 1.16, accelerate 1.15, DeepSpeed 0.19.8 and torch 2.13 (docs/multi-node.md,
`benchmarks/sharded_entries.py`), each rank with a cache directory of its own:

- no mode puts a per-rank shape, a rank or a process group into a compiled graph. FSDP2 and ZeRO-3 gather the
  parameters in module hooks that Dynamo leaves out of the graph (a graph break at each), so every graph takes whole
  parameters; ZeRO-1 and ZeRO-2 never shard them. Every rank compiles the same FX graphs, AOTAutograd entries and
  kernels, at 1, 2 and 3 processes (FSDP2) and at 2 and 3 (ZeRO-1/2/3): one entry serves every rank of any world size.
- the mode does change the graphs: FSDP2 breaks the model at each wrapped layer, ZeRO-3 at each module whose
  parameters it gathers, and ZeRO-1/2 compile what one process compiles (a model larger than DDP's first gradient
  bucket is split by DDP and not by ZeRO). So the mode is in the signature (`Signature.sharding`), and the rehearsal
  runs the job's own launcher, the same wrapper, with 2 processes for a job of any size (1 for a job of 1).
- CPU offload (ZeRO-2's optimizer, ZeRO-3's optimizer and parameters) changes no graph: it is not in the signature.

On Neuron every eager op compiles to a NEFF too (docs/compile-caches.md §4), and FSDP2's own work on each rank's
shards (the optimizer step on them, the all-gather and reduce-scatter copies) runs eagerly on shapes that depend on
the world size and the rank: there the rehearsal runs the job's world size, every rank into the one cache. Unverified
on hardware.

What cannot run faithfully on a target is refused (`UnsupportedLaunchError`, exit 2) with the reason and the nearest
mode that works.
"""

from __future__ import annotations

from typing import Any

from warmup.errors import UnsupportedLaunchError
from warmup.job.spec import Spec
from warmup.job.trl_config import Launch
from warmup.trainers.registry import family

SHARDED = ("FSDP", "DEEPSPEED")
# DeepSpeed's accelerators (deepspeed/accelerator/real_accelerator.py, SUPPORTED_ACCELERATOR_LIST in 0.19.8).
DEEPSPEED_ACCELERATORS = ("cuda", "cpu", "xpu", "npu", "mps", "hpu", "mlu", "sdaa", "supa", "klxpu")


def sharding_label(launch: Launch) -> str | None:
    """The signature's `sharding`: the wrapper the graphs are compiled under, where it changes them."""
    if launch.distributed_type == "DEEPSPEED":
        return f"zero{launch.zero_stage or 0}"
    if launch.distributed_type == "FSDP":
        label = f"fsdp{launch.fsdp_version or 1}"
        # accelerate wraps each layer in a checkpoint wrapper: other graphs than transformers' own checkpointing
        return label + ":ac" if launch.fsdp.get("activation_checkpointing") is True else label
    return None


def refusal(spec: Spec, launch: Launch, use_cpu: bool) -> str | None:
    """Why the job's sharded launch cannot be warmed faithfully on its target, with the nearest mode that works;
    None when it can. `use_cpu`: the trainer config's."""
    if launch.distributed_type not in SHARDED:
        return None
    mode = launch.describe()
    target = spec.target
    if target.backend == "neuron":
        if launch.distributed_type == "DEEPSPEED":
            return (
                f"the job runs {mode}, which does not run on Neuron: DeepSpeed has no Neuron accelerator (DeepSpeed "
                f"0.19's are {', '.join(DEEPSPEED_ACCELERATORS)}) and TorchNeuron documents DDP, FSDP2 and DTensor, "
                "not ZeRO; shard with FSDP2 instead (accelerate_config: fsdp2, which shards parameters, gradients and "
                "optimizer state as ZeRO-3 does)"
            )
        if launch.fsdp_version != 2:
            return (
                f"the job runs {mode}, not on Neuron: TorchNeuron documents FSDP2 (fully_shard), not FullyShardedDataParallel "
                "(FSDP1); set fsdp_version: 2 (accelerate_config: fsdp2)"
            )
        return None
    if target.device == "cpu" and not use_cpu:
        return (
            f"the job runs {mode} on CPU without use_cpu: true, and accelerate 1.15 then does not shard it (measured: "
            "under FSDP each process trains alone, unwrapped; DeepSpeed fails its batch-size check, counting one "
            "process); set use_cpu: true"
        )
    if target.device == "cpu" and launch.distributed_type == "FSDP" and launch.fsdp_version != 2:
        return (
            f"the job runs {mode}, and accelerate's FSDP1 (FullyShardedDataParallel) does not run on CPU: it asks for "
            "an accelerator device (sync_module_states, device_id), measured with accelerate 1.15; set "
            "fsdp_version: 2 (accelerate_config: fsdp2), which runs on CPU, or target cuda"
        )
    return None


def check_launch(spec: Spec, launch: Launch, use_cpu: bool) -> None:
    """Raise UnsupportedLaunchError when the job's launch cannot be warmed faithfully on its target."""
    reason = refusal(spec, launch, use_cpu)
    if reason is not None:
        raise UnsupportedLaunchError(reason, loc=_where(launch))


def rehearsal_processes(spec: Spec, launch: Launch) -> int | None:
    """Processes a sharded job is rehearsed with (None: not sharded, the DDP rule applies)."""
    if launch.distributed_type not in SHARDED:
        return None
    world = spec.target.world_size
    if spec.target.backend == "neuron":
        return world  # each rank's shards compile as eager NEFFs of their own shapes
    if spec.target.device == "cuda":
        # accelerate's launcher has no --virtual-local-rank: local rank k compiles for cuda:k (in Inductor's key)
        return max(1, world // (launch.machines or 1))
    return 1 if world == 1 else 2


def notes(spec: Spec, launch: Launch, processes: int, config: Any) -> tuple[list[str], list[str]]:
    """(notes, warnings) a plan of a sharded job carries: what was assumed and measured; `config` is the job's
    resolved TRL config."""
    if launch.distributed_type not in SHARDED:
        return [], []
    mode, world = launch.describe(), spec.target.world_size
    label = sharding_label(launch)
    said: list[str] = []
    warned: list[str] = []
    if spec.target.backend == "neuron":
        said.append(
            f"{mode}: not verified on Trainium. The graphs torch.compile makes take whole parameters (FSDP2 gathers them "
            "in hooks outside the graphs, as measured on CPU), but TorchNeuron also compiles the eager ops FSDP2 runs "
            "on each rank's shards, whose shapes depend on the world size and the rank: the warm-up runs all "
            f"{world} processes, into one cache"
        )
        return said, warned
    said.append(
        f"{mode}: each rank compiles the same graphs at any world size (measured on CPU: the parameters are gathered "
        "or kept whole outside the compiled graphs, so no shard shape, rank or process group is in them), so one "
        f"entry per signature serves every rank; the warm-up runs the job's launcher ({label}) with {processes} "
        f"process{'es' if processes != 1 else ''}"
    )
    if launch.offload_optimizer or launch.offload_param:
        said.append("CPU offload changes no compiled graph (measured: the same entries with and without it)")
    if launch.distributed_type == "FSDP" and launch.fsdp_version != 2:
        said.append(
            "FSDP1 is not measured (it does not run on CPU): assumed like FSDP2, whose all-gathers run in hooks "
            "outside the compiled graphs; the coverage report of the first run tells"
        )
    if spec.target.device == "cuda":
        said.append(
            "not verified on GPU: the graphs were measured on CPU, where the same wrapper runs with gloo"
        )
    if (
        launch.distributed_type == "DEEPSPEED"
        and launch.zero_stage == 3
        and spec.target.backend == "inductor"
    ):
        warned.append(
            "under ZeRO-3 torch 2.13's AOTAutograd cache skips the graphs that hold DeepSpeed's own linear autograd "
            'Function ("Unsupported call_function target autograd_function_apply"; 5 graphs of the test model) and '
            "the graphs that compute nothing (a detach of a gathered input; 8), for which Inductor makes no code to "
            "cache: Inductor's compiled code still all hits, but each training process re-runs AOTAutograd on those "
            "graphs (seconds), which its compile counters and coverage report count as autograd_cache_bypass and "
            "autograd_cache_miss (and `warmup exec --strict` as compiles)"
        )
    if (
        spec.target.device == "cpu"
        and family(spec.trainer).fused_lm_head_loss
        and launch.zero_stage == 3
        and not getattr(config, "label_smoothing_factor", 0)
    ):
        warned.append(
            "measured on CPU: TRL 1.16's SFT loss (its fused LM head) fails in backward under ZeRO-3 (\"modified by an "
            'inplace operation" on the gathered lm_head weight), so this job fails in training and in its warm-up '
            "alike; with label_smoothing_factor > 0 the loss comes from the whole logits and runs (on GPU not known)"
        )
    if spec.target.device == "cpu" and launch.distributed_type == "FSDP":
        warned.append(
            "accelerate 1.15 sets up FSDP only on an accelerator: on CPU, `accelerate launch` trains this job under "
            "DDP and compiles other graphs (measured). The warm-up runs FSDP as on an accelerator, with the CPU as the "
            "device (warmup.rehearsal.cpu_sharding); a CPU training process meant to hit these entries calls "
            "warmup.rehearsal.cpu_sharding.shard_on_cpu() before building its trainer"
        )
    return said, warned


def _where(launch: Launch) -> str:
    """The config key the launch's mode comes from (Launch.source says where it was read)."""
    source = launch.source or ""
    for prefix, key in (
        ("accelerate_config", "accelerate_config"),
        ("deepspeed:", "deepspeed"),
        ("fsdp", "fsdp"),
    ):
        if source.startswith(prefix):
            return f"args.{key}"
    return "args.config_file" if source else "args"
