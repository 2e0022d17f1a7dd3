"""Spec -> plan: the exact set of signatures a TRL job will hit, plus warnings for what cannot be listed.

One module per group of trainer families, each following the TRL 1.16 rules in docs/trl-shapes.md:
sft (SFT), preference (DPO, KTO, Reward), online (GRPO, RLOO), distillation; each family's record
(warmup/trainers/) names its planner.

`plan()` is pure Python once the model config is read and the args are resolved; `plan_spec()`
does both and is what callers normally use.
"""

from __future__ import annotations

from warmup.errors import EmptyPlanError, FieldProblem, ModelConfigError, SpecError
from warmup.job.model_facts import ModelFacts, read_model_facts
from warmup.job.spec import SUPPORTED_NEURON_CORE_GROUPS, Spec
from warmup.job.trl_args import TrainerArgs, resolve_trainer_args
from warmup.planner.common import MAX_SIGNATURES, PlanBuilder
from warmup.planner.estimate import estimate_seconds
from warmup.planner.sharding import sharding_label
from warmup.signature import Plan
from warmup.trace_skip.losses import predicted_loss
from warmup.trainers.registry import family

# Dynamo's default recompile limit per code object (torch._dynamo.config.recompile_limit).
DYNAMO_DEFAULT_RECOMPILE_LIMIT = 8
# Compiled sequence lengths an unpadded plan may have before it is told to pad.
UNPADDED_LENGTHS_WARNED = 8


def plan(spec: Spec, args: TrainerArgs, model: ModelFacts, teacher: ModelFacts | None = None) -> Plan:
    """Plan a spec whose args are resolved and whose model config is read."""
    builder = PlanBuilder(spec=spec, args=args, model=model, teacher=teacher)
    _target_warnings(builder)
    _world_size_notes(builder)
    _check_model_length(builder)
    _config_warnings(builder)
    family(spec.trainer).plan(builder)
    if not builder.signatures:
        raise EmptyPlanError(
            builder.missing
            or [
                FieldProblem(
                    "args",
                    f"the {spec.trainer} job lists no signature: "
                    + "; ".join(builder.warnings or ["no shape reached"]),
                )
            ]
        )
    _recompile_limit_warning(builder)
    _unpadded_lengths_warning(builder)
    _nothing_compiles_warning(builder)
    _trace_skip_warning(builder)
    return builder.build()


def _trace_skip_warning(plan: PlanBuilder) -> None:
    """A compiled job whose warm-up will keep no trace (warmup/trace_skip/) says so before it is warmed."""
    reason = predicted_loss(world_size=plan.world_size, sharding=sharding_label(plan.args.launch))
    if plan.args.compile_backend is not None and reason is not None:
        plan.warn(
            f"trace skip: {reason}; each training process traces the backbone with Dynamo at its start (the warmed "
            "caches serve it, with no fresh compile)"
        )


def plan_spec(spec: Spec) -> Plan:
    """Validate the args with TRL, read the model config(s), and plan."""
    args = resolve_trainer_args(spec)
    model = read_model_facts(spec.model)
    try:
        teacher = read_model_facts(spec.teacher_model) if spec.teacher_model else None
    except ModelConfigError as error:  # name the teacher, not the model
        raise SpecError(str(error), loc="teacher_model") from None
    return plan(spec, args, model, teacher)


def _check_model_length(plan: PlanBuilder) -> None:
    """A max_length beyond the model's position embeddings cannot run (and lists shapes the model never takes)."""
    config = plan.model.config.get("text_config") or plan.model.config
    positions = config.get("max_position_embeddings")
    max_length = getattr(plan.args.config, "max_length", None)
    if isinstance(positions, int) and isinstance(max_length, int) and max_length > positions:
        raise SpecError(
            f"max_length {max_length} is beyond the model's max_position_embeddings {positions}: set max_length to "
            f"{positions} or less",
            loc="args.max_length",
        )


def _config_warnings(plan: PlanBuilder) -> None:
    """What the config says beside the trainer's fields: the launcher, deprecations, estimated data facts."""
    for note in plan.args.notes:
        plan.warn(note)
    launch = plan.args.launch
    if launch.sequence_parallel > 1:
        plan.warn(
            f"context / sequence parallelism of {launch.sequence_parallel} splits every sequence across processes: "
            "the listed lengths are whole sequences, not the per-process shards the job compiles"
        )
    if launch.dynamo_dynamic:
        plan.warn(
            "the accelerate config asks Dynamo for dynamic shapes (dynamo_use_dynamic): the compiled graphs are "
            "not the static ones warmed here; set dynamo_use_dynamic: false"
        )
    reward_model = plan.args.script.get("reward_model_name_or_path")
    if reward_model:
        plan.warn(
            f"reward_model_name_or_path {reward_model}: the reward model scores each completion as its own tokenizer "
            "reads the text, shapes this plan does not list (under torch_compile accelerate compiles it too)"
        )
    if plan.data.estimated_from is not None:
        plan.warn(
            f"the data facts are an estimate from {plan.data.estimated_from} examples per split (--sample): a longer "
            "example than those read makes a shape this plan does not list; compute them on the whole dataset"
        )


def _target_warnings(plan: PlanBuilder) -> None:
    target = plan.spec.target
    args = plan.args
    if target.backend == "neuron" and plan.multiple is None:
        plan.warn(
            "no padding on Neuron (pad_to_multiple_of is None): every distinct sequence length is a new "
            "compile of about a minute; set pad_to_multiple_of: 128 (or leave it 'auto')"
        )
    if target.backend == "inductor" and args.compile_backend is None:
        plan.warn(
            "torch_compile is off: under Inductor the job compiles nothing, so there is nothing to warm; "
            "set torch_compile: true to compile (and warm) the listed signatures"
        )
    if args.auto_find_batch_size:
        plan.warn(
            "auto_find_batch_size halves the batch on out-of-memory, so the batch sizes cannot be listed; "
            "set per_device_train_batch_size and turn auto_find_batch_size off"
        )
    strategy = getattr(args.config, "train_sampling_strategy", None)
    if strategy == "batch_rebalance":
        plan.warn(
            "train_sampling_strategy 'batch_rebalance' makes variable batch sizes by design; only the configured "
            "batch size is listed: use 'random' or 'group_by_length'"
        )
    cores = target.neuron_rt_visible_cores
    if cores is not None and cores.replace(" ", "") not in SUPPORTED_NEURON_CORE_GROUPS:
        plan.warn(
            f"NEURON_RT_VISIBLE_CORES {cores!r} is not a supported core group: use 0,1 / 2,3 / 0-3 "
            "(a group must start at a multiple of its size)"
        )


def _world_size_notes(plan: PlanBuilder) -> None:
    """What of a job of several processes depends on its world size, and how it is warmed (see
    warmup/planner/topology.py and docs/multi-node.md)."""
    from warmup.planner import sharding
    from warmup.planner.topology import rehearsal_processes

    target = plan.spec.target
    world = target.world_size
    launch = plan.args.launch
    sharding.check_launch(plan.spec, launch, bool(plan.args.given.get("use_cpu")))
    processes = rehearsal_processes(plan.spec, plan.args.config, launch)
    said, warned = sharding.notes(plan.spec, launch, processes, plan.args.config)
    for message in said:
        plan.note(message)
    for message in warned:
        plan.warn(message)
    if world == 1:
        return
    if not launch.sharded:
        why = (
            ""
            if processes == 2
            else " (the fewest at which every global generation batch holds whole groups of num_generations)"
        )
        plan.note(
            f"world_size {world}: under DDP each rank compiles the same graphs at any world size above 1 (no "
            f"collective is inside a compiled graph), so the warm-up runs {processes} processes{why}; the "
            f"shapes listed are those of each rank of a job of {world} processes"
        )
    if target.backend == "inductor" and plan.args.compile_backend is not None and not launch.sharded:
        plan.warn(
            "under DDP, Dynamo splits a model larger than DDP's first gradient bucket (1 MB) into one graph per "
            "bucket, and torch 2.13's AOTAutograd cache skips those graphs (\"fakify_first_call\"): Inductor's "
            "compiled code still hits, but each training process re-runs AOTAutograd on them (seconds), which "
            "its compile counters and coverage report count as autograd_cache_bypass; not where the trace skip "
            "serves the backbone (its artifact is one graph, AOTAutograd's output kept), only where a process traces it"
        )
    if target.device == "cpu":
        plan.note(
            "each rank's CPU thread count is in the compile key, and the toolchain carries it: "
            "OMP_NUM_THREADS, which torchrun sets to 1 when it starts several processes per node; `warmup exec` "
            "sets it to the cache's count when it is unset, so a job of one process per node that wants every "
            "core sets OMP_NUM_THREADS where it pulls and where it trains"
        )
    elif target.device == "cuda" and not launch.sharded:
        plan.warn(
            "the GPU index is in Inductor's compile key: start training with `torchrun --virtual-local-rank` "
            "(every rank sees its GPU as cuda:0, as the warm-up's ranks do), or each local rank but the first "
            "compiles its own graphs"
        )
    elif not launch.sharded:
        plan.note(
            "not verified on Trainium: TorchNeuron keys a graph by its HLO, the same on every rank, and DDP's "
            "all-reduce runs outside the compiled graph, but whether its collectives compile per world size is "
            "unmeasured: the coverage report of the first multi-process run (fresh compiles) tells"
        )


def _recompile_limit_warning(plan: PlanBuilder) -> None:
    """Dynamo silently runs eager past its recompile limit; count the graphs it traces per model forward.

    Only passes through the torch.compile wrapper count, on either backend: generation, eval and the other
    bare-policy passes are not torch.compile frames (on Neuron they compile as eager TorchNeuron ops).
    """
    per_model: dict[str, int] = {}
    for key in plan.dynamo_keys:
        model = plan.signatures[key].model
        per_model[model] = per_model.get(model, 0) + 1
    most = max(per_model.values(), default=0)
    if most > DYNAMO_DEFAULT_RECOMPILE_LIMIT:
        plan.warn(
            f"{most} signatures compile through one model forward, above Dynamo's default recompile_limit "
            f"({DYNAMO_DEFAULT_RECOMPILE_LIMIT}): past it new shapes silently run eager; call "
            "warmup.activate() in the training process (it raises the limit to the plan's size) or set "
            f"torch._dynamo.config.recompile_limit >= {most}"
        )


def _unpadded_lengths_warning(plan: PlanBuilder) -> None:
    """Without pad_to_multiple_of (TRL's default off Neuron) every batch length is its own compile: say so
    and where the fix is, rather than leave a long plan to look like the job's nature."""
    if plan.multiple is not None:
        return
    # every length the table lists, a batch of one-token rows included; a decode step's length 1 is not a batch's
    lengths = sorted(
        {s.seq_len for s in plan.signatures.values() if s.compile != "eager" and s.phase != "generate_decode"}
    )
    if len(lengths) > UNPADDED_LENGTHS_WARNED:
        plan.warn(
            "pad_to_multiple_of is unset (TRL's default off Neuron), so every batch length compiles on its own: "
            f"{len(lengths)} lengths from {lengths[0]} to {lengths[-1]}; set "
            "pad_to_multiple_of to make them few (`warmup advise` ranks the settings by projected compile plus "
            "training time)"
        )


def _nothing_compiles_warning(plan: PlanBuilder) -> None:
    """torch_compile on under Inductor, yet no pass goes through the compiled wrapper: nothing to warm."""
    if plan.spec.target.backend != "inductor" or plan.args.compile_backend is None:
        return
    if plan.signatures and not plan.dynamo_keys:
        plan.warn(
            f"torch_compile is on, but TRL's {plan.spec.trainer} trainer calls no module through the torch.compile "
            "wrapper (every listed pass is labelled eager), so under Inductor the job compiles nothing and there "
            "is nothing to warm"
        )


__all__ = ["MAX_SIGNATURES", "Plan", "SpecError", "estimate_seconds", "plan", "plan_spec"]
