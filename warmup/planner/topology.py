"""How many processes rehearse a job of N processes, and the config each of them is given.

Measured on CPU (docs/multi-node.md, `benchmarks/world_size_entries.py`): under DDP every rank of a
job compiles the same FX graphs, AOTAutograd entries and kernels at 2 and at 3 processes, rank 0 and
the others alike. DDP's gradient all-reduce runs in its hooks, outside the compiled graph, so nothing
of the world size reaches an entry. What does differ:

- 1 process against more: under DDP, Dynamo splits a model larger than DDP's first gradient bucket
  into one graph per bucket (measured: 7 FX graphs against 5; a model within the bucket compiled
  the same graphs with and without DDP), so a job of 1 process is rehearsed with 1, any other with
  2 or more;
- the thread count of each rank on CPU (in Inductor's key): OMP_NUM_THREADS, which torchrun sets to
  1 when it starts several processes per node; the toolchain carries it, and the rehearsal's ranks
  are given that same count;
- the shapes: a short last batch happens with 1 process only (accelerate's even_batches fills it
  otherwise), and GRPO/RLOO's generation batch spans every process. The planner lists the shapes
  for the job's N; each rank of the rehearsal is given the per-rank config of a job of N.

So a job of N > 1 processes is rehearsed with the fewest W >= 2 at which TRL accepts that per-rank
config: 2, unless GRPO/RLOO's global batches must hold whole groups of `num_generations`
completions (W x per-rank rows divisible by it), which can need up to N. A sharded job (FSDP, DeepSpeed
ZeRO) follows warmup/planner/sharding.py: its graphs do not depend on the world size either, except on Neuron.
"""

from __future__ import annotations

from typing import Any

from warmup.job.spec import Spec
from warmup.job.trl_config import Launch
from warmup.planner import sharding
from warmup.trainers.registry import family


def rehearsal_processes(spec: Spec, config: Any, launch: Launch) -> int:
    """The number of processes that rehearse `spec`; `config` is its TRL config resolved for its target, `launch`
    what its launcher runs."""
    world = spec.target.world_size
    fewest = 1 if world == 1 else 2
    if family(spec.trainer).generation_groups and world > 1:
        fewest = next(size for size in range(2, world + 1) if _whole_groups(config, size))
    return max(fewest, sharding.rehearsal_processes(spec, launch) or 0)


def _whole_groups(config: Any, processes: int) -> bool:
    """TRL's own checks (GRPOConfig / RLOOConfig __post_init__) at `processes` processes, per-rank rows fixed."""
    rows = config.per_device_train_batch_size * config.steps_per_generation * processes
    if rows % config.num_generations:
        return False
    if (
        getattr(config, "do_eval", False)
        and str(getattr(config.eval_strategy, "value", config.eval_strategy)) != "no"
    ):
        copies = config.num_generations_eval or config.num_generations
        if (config.per_device_eval_batch_size * processes) % copies:
            return False
    return True


def rank_args(spec: Spec, config: Any, processes: int) -> dict[str, Any]:
    """The spec's TRL config fields as the rehearsal's ranks get them: what each rank of the job has.

    GRPO/RLOO's `generation_batch_size` is global (all processes together); at another number of
    processes the same per-rank rows are `steps_per_generation`, resolved for the job's world size.
    """
    args = dict(spec.args)
    if family(spec.trainer).generation_groups and processes != spec.target.world_size:
        args.pop("generation_batch_size", None)
        args["steps_per_generation"] = config.steps_per_generation
    return args
