"""`warmup advise`: the padding that makes the whole job fastest, from the dataset's real lengths.

Every distinct padded length is a compile (about a minute on Neuron, about twelve for a GRPO static-cache
size), while coarse padding makes every step process padding. For the job as configured and for each
candidate `pad_to_multiple_of` (and, when the caller accepts cutting or dropping a stated share of the
examples, a shorter `max_length`, or for GRPO / RLOO a prompt-length filter), the advisor computes:

- the signatures the job compiles: the real planner's plan of the spec with that setting and the dataset's
  facts, exactly what `warmup plan` lists for it;
- their compile seconds (`warmup.planner.estimate.CompileCosts`: recorded seconds where the service has them);
- the padded tokens of an epoch and the padding waste, by replaying the trainer's own sampler order and
  TRL's padding over the per-example lengths (`warmup.advise.simulate`);
- the projected wall time of the job: compile + every optimizer step, a step's time proportional to the
  padded tokens of its slowest process (`warmup.advise.cost.StepCosts`).

The recommendation is the option with the least projected time.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from warmup.advise.cost import StepCosts
from warmup.advise.data import (
    HISTOGRAM_SOURCE,
    MAX_TOKENS,
    DatasetLengths,
    PreparedSplit,
    SplitLengths,
    data_facts,
    lengths_from_facts,
    lengths_from_histogram,
    load_lengths,
    prepare,
)
from warmup.advise.simulate import EpochWork, Geometry, JobWork, epochs, job_work
from warmup.errors import PlanTooLargeError, SpecError
from warmup.job.model_facts import read_model_facts
from warmup.job.spec import Spec
from warmup.job.trl_args import TrainerArgs, resolve_trainer_args
from warmup.planner.estimate import CompileCosts
from warmup.planner.planning import plan_spec
from warmup.signature import Plan, Signature
from warmup.trainers.registry import FAMILIES, family

# Candidate multiples; the list stops at the first that holds the longest row after truncation (one length).
DEFAULT_MULTIPLES: tuple[int | None, ...] = (None, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)

__all__ = [
    "Advice",
    "AdviceOption",
    "DatasetLengths",
    "SplitLengths",
    "advise",
    "lengths_from_facts",
    "lengths_from_histogram",
    "load_lengths",
    "replay_epochs",
]


class AdviceOption(BaseModel):
    """One setting of the job and what it costs."""

    model_config = ConfigDict(frozen=True)

    pad_to_multiple_of: int | None
    max_length: int | None = Field(description="SFT / DPO / Reward: TRL's max_length under this option.")
    max_prompt_length: int | None = Field(
        None,
        description="GRPO / RLOO: prompts longer than this are dropped from the dataset (not a TRL field).",
    )
    current: bool = Field(description="The job as configured.")
    args: dict[str, Any] = Field(description="The trainer config fields this option sets.")
    signatures: list[Signature] = Field(description="What `warmup plan` lists for this setting.")
    compile_seconds: float
    padded_tokens: int = Field(
        description="Tokens in the padded training tensors of the first epoch, all processes."
    )
    real_tokens: int = Field(description="The non-padding tokens among them.")
    padding_waste: float = Field(description="The share of padded_tokens that is padding.")
    steps: int = Field(description="Optimizer steps of the job.")
    train_seconds: float = Field(description="Projected time of the steps.")
    projected_seconds: float = Field(description="compile_seconds + train_seconds.")
    examples_truncated: int = Field(description="Training examples with a row cut by max_length.")
    examples_dropped: int = Field(description="Training examples removed (by TRL, or by the prompt filter).")
    warnings: list[str] = Field(default_factory=list, description="The plan's warnings.")


class RefusedOption(BaseModel):
    pad_to_multiple_of: int | None
    max_length: int | None
    max_prompt_length: int | None = None
    reason: str


class Advice(BaseModel):
    trainer: str
    backend: str
    device: str
    world_size: int
    dataset: str
    current: AdviceOption
    options: list[AdviceOption] = Field(description="Every option evaluated, the current one included.")
    recommended: AdviceOption
    saving_seconds: float = Field(description="current.projected_seconds - recommended.projected_seconds.")
    saving_fraction: float
    refused: list[RefusedOption] = Field(default_factory=list, description="Options the planner refused.")
    compile_costs: str = Field(description="Where the compile seconds come from.")
    step_costs: str = Field(description="Where the step time comes from.")
    assumptions: list[str] = Field(default_factory=list)


def advise(
    spec: Spec,
    lengths: DatasetLengths | None = None,
    *,
    multiples: Sequence[int | None] | None = None,
    max_truncated: float = 0.0,
    completion_tokens: int | None = None,
    compile_costs: CompileCosts | Callable[[list[Signature]], CompileCosts] | None = None,
    step_seconds: float | None = None,
    step_seconds_from: str = "",
) -> Advice:
    """Evaluate the job as configured and each candidate setting; recommend the fastest.

    `lengths`: the dataset's per-example lengths; None takes an SFT spec's data.length_histogram.
    `max_truncated`: the share of training examples an option may cut or drop (0: none beyond what the job's
    own max_length does). `completion_tokens`: GRPO / RLOO, the assumed length of every completion (default:
    the generation limit). `step_seconds`: one measured optimizer step of the job as configured, and
    `step_seconds_from` where it was measured (shown in the advice's step_costs).
    `compile_costs`: compile seconds per signature, or a function that builds them from every planned
    signature (the service looks up what it recorded for them); default: the seed figures.
    """
    if not family(spec.trainer).advised:
        advised = sorted(kind for kind, record in FAMILIES.items() if record.advised)
        raise SpecError(
            f"warmup advise covers {', '.join(advised)}, not {spec.trainer}",
            loc="trainer",
        )
    if not 0.0 <= max_truncated < 1.0:
        raise SpecError(f"must be a share in [0, 1), got {max_truncated}", loc="max_truncated")
    args = resolve_trainer_args(spec)
    _check_padded_batches(spec, args)
    _check_bounds(spec, args, multiples)
    model = read_model_facts(spec.model)  # a model that cannot be read is the problem to name first
    if lengths is None:
        lengths = lengths_from_histogram(spec.trainer, spec.data.length_histogram)
    current = _Setting(args.pad_to_multiple_of, _max_length(spec, args), None)
    online = family(spec.trainer).generation_groups
    key = _truncation_key(spec, args, lengths.train)
    settings = _candidates(current, key, multiples, max_truncated, online=online)
    assumptions: list[str] = []
    evaluated: list[tuple[_Setting, Plan, PreparedSplit, JobWork]] = []
    refused: list[RefusedOption] = []
    with _each_message_once(TRAINING_ARGS_LOGGER):
        for setting in settings:
            try:
                evaluated.append(_evaluate(spec, args, lengths, setting, completion_tokens, assumptions))
            except PlanTooLargeError as error:
                if setting == current:
                    raise
                refused.append(RefusedOption(**setting.fields(), reason=str(error)))
    if compile_costs is None:
        compile_costs = CompileCosts(spec.target.backend)
    elif not isinstance(compile_costs, CompileCosts):
        compile_costs = compile_costs([s for _, plan, _, _ in evaluated for s in plan.signatures])
    current_work = next(work for setting, _, _, work in evaluated if setting == current)
    if step_seconds is not None:
        if current_work.steps == 0:
            raise SpecError("the job as configured makes no step to calibrate against", loc="step_seconds")
        step_costs = StepCosts.measured(
            step_seconds, current_work.work / current_work.steps, step_seconds_from
        )
    else:
        step_costs = StepCosts.seed(model, spec.target.device)
    options = [
        _option(
            setting, plan, split, work, setting == current, compile_costs, step_costs, spec, lengths.dropped
        )
        for setting, plan, split, work in evaluated
    ]
    current_option = next(o for o in options if o.current)
    recommended = min(options, key=lambda o: (o.projected_seconds, not o.current))
    saving = current_option.projected_seconds - recommended.projected_seconds
    return Advice(
        trainer=spec.trainer,
        backend=spec.target.backend,
        device=spec.target.device,
        world_size=spec.target.world_size,
        dataset=lengths.source,
        current=current_option,
        options=options,
        recommended=recommended,
        saving_seconds=saving,
        saving_fraction=saving / current_option.projected_seconds
        if current_option.projected_seconds
        else 0.0,
        refused=refused,
        compile_costs=compile_costs.describe(),
        step_costs=step_costs.source,
        assumptions=[*_standing_assumptions(spec, lengths), *dict.fromkeys(assumptions)],
    )


# transformers' TrainingArguments logs its warnings each time a TRL config is built: once per option here.
TRAINING_ARGS_LOGGER = "transformers.training_args"


@contextlib.contextmanager
def _each_message_once(name: str) -> Iterator[None]:
    seen: set[str] = set()

    def first_time(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        fresh = message not in seen
        seen.add(message)
        return fresh

    logger = logging.getLogger(name)
    logger.addFilter(first_time)
    try:
        yield
    finally:
        logger.removeFilter(first_time)


# --- the settings compared ------------------------------------------------------------------------------


class _Setting(NamedTuple):
    multiple: int | None  # pad_to_multiple_of
    max_length: int | None
    max_prompt: int | None  # GRPO / RLOO: the prompt filter

    def fields(self) -> dict[str, int | None]:
        return {
            "pad_to_multiple_of": self.multiple,
            "max_length": self.max_length,
            "max_prompt_length": self.max_prompt,
        }


def _max_length(spec: Spec, args: TrainerArgs) -> int | None:
    return None if family(spec.trainer).generation_groups else args.max_length


def _check_padded_batches(spec: Spec, args: TrainerArgs) -> None:
    if family(spec.trainer).packs and (args.packing or args.padding_free):
        raise SpecError(
            "warmup advise compares padded batches; with packing or padding_free the rows are filled to "
            "max_length or concatenated, so pad_to_multiple_of has no padding to trade: set packing: false",
            loc="args.packing" if args.packing else "args.padding_free",
        )
    strategy = getattr(args.config, "train_sampling_strategy", "random")
    if not family(spec.trainer).generation_groups and strategy not in ("random", "sequential"):
        raise SpecError(
            f"warmup advise replays the random and sequential samplers, not {strategy!r}",
            loc="args.train_sampling_strategy",
        )
    accelerator = args.accelerator_config
    if getattr(accelerator, "split_batches", False) or getattr(accelerator, "dispatch_batches", None):
        raise SpecError(
            "warmup advise replays accelerate's default sharding (split_batches and dispatch_batches off)",
            loc="args.accelerator_config",
        )


# Rows of one step over every process that the replay holds in memory at once: far above any real job.
MAX_ROWS_PER_STEP = 1 << 22


def _check_bounds(spec: Spec, args: TrainerArgs, multiples: Sequence[int | None] | None) -> None:
    """Refuse, before any work, numbers no job has that would make the replay overflow or fill memory."""
    for multiple in [args.pad_to_multiple_of, *(multiples or [])]:
        if multiple is not None and not 0 < multiple <= MAX_TOKENS:
            loc = "args.pad_to_multiple_of" if multiple == args.pad_to_multiple_of else "multiples"
            raise SpecError(f"a padding multiple must be in 1..{MAX_TOKENS}, not {multiple}", loc=loc)
    rows = args.per_device_train_batch_size * spec.target.world_size
    if family(spec.trainer).generation_groups:
        rows *= args.steps_per_generation
    if rows > MAX_ROWS_PER_STEP:
        raise SpecError(
            f"per_device_train_batch_size x world_size{' x steps_per_generation' if family(spec.trainer).generation_groups else ''}"
            f" is {rows} rows a step, more than warmup advise replays ({MAX_ROWS_PER_STEP})",
            loc="args.per_device_train_batch_size",
        )


def _truncation_key(spec: Spec, args: TrainerArgs, split: SplitLengths) -> np.ndarray:
    """Per example, the length a max_length (or prompt filter) must reach to leave it whole."""
    if family(spec.trainer).generation_groups:
        return split.prompt
    if split.rejected is None:
        if family(spec.trainer).paired:
            raise SpecError(
                f"the {spec.trainer} trainer needs preference data: give each example's rejected length",
                loc="dataset",
            )
        return np.asarray(split.prompt + split.completion)
    return np.asarray(split.prompt + np.maximum(split.completion, split.rejected))


def _candidates(
    current: _Setting,
    key: np.ndarray,
    multiples: Sequence[int | None] | None,
    max_truncated: float,
    *,
    online: bool,
) -> list[_Setting]:
    longest = int(key.max())
    cap = longest if current.max_length is None else min(current.max_length, longest)  # the longest row
    if multiples is None:
        multiples = []
        for multiple in DEFAULT_MULTIPLES:
            multiples.append(multiple)
            if multiple is not None and multiple >= cap:
                break
    quantile = int(np.sort(key)[max(math.ceil((1.0 - max_truncated) * len(key)) - 1, 0)])
    settings = [current]
    for multiple in dict.fromkeys([current.multiple, *multiples]):
        settings.append(_Setting(multiple, current.max_length, None))
        if max_truncated <= 0.0:
            continue
        bound = quantile if not multiple else -(-quantile // multiple) * multiple
        if bound < cap:
            settings.append(_Setting(multiple, None, bound) if online else _Setting(multiple, bound, None))
    return list(dict.fromkeys(settings))


# --- one option -----------------------------------------------------------------------------------------


def _evaluate(
    spec: Spec,
    args: TrainerArgs,
    lengths: DatasetLengths,
    setting: _Setting,
    completion_tokens: int | None,
    assumptions: list[str],
) -> tuple[_Setting, Plan, PreparedSplit, JobWork]:
    train = _prepare(spec, args, lengths.train, setting)
    evals = _prepare(spec, args, lengths.eval, setting) if lengths.eval is not None else None
    facts = data_facts(spec.trainer, train, evals)
    if evals is None and spec.data.num_eval_examples is not None:
        facts["num_eval_examples"] = spec.data.num_eval_examples  # what the spec says of a split not given
    option_spec = option_spec_for(spec, setting, facts)
    plan = plan_spec(option_spec)
    option = resolve_trainer_args(option_spec)
    work = job_work(
        train,
        _geometry(option_spec, option, completion_tokens, assumptions),
        gradient_accumulation_steps=option.gradient_accumulation_steps,
        num_train_epochs=option.num_train_epochs,
        max_steps=option.max_steps,
    )
    return setting, plan, train, work


def replay_epochs(
    spec: Spec, lengths: DatasetLengths, count: int, *, completion_tokens: int | None = None
) -> list[EpochWork]:
    """The first `count` epochs of the job as configured, replayed (padded and real tokens per epoch)."""
    args = resolve_trainer_args(spec)
    setting = _Setting(args.pad_to_multiple_of, _max_length(spec, args), None)
    stream = epochs(
        _prepare(spec, args, lengths.train, setting), _geometry(spec, args, completion_tokens, [])
    )
    return [epoch for epoch, _ in zip(stream, range(count), strict=False)]


def option_spec_for(spec: Spec, setting: _Setting, facts: dict[str, Any]) -> Spec:
    """The spec of the job under `setting`, with the dataset's facts: what `warmup plan` plans for it."""
    document = spec.model_dump(mode="json")
    document["args"] = {**document["args"], **option_args(spec, setting)}
    document["data"] = facts
    return Spec.model_validate(document)


def option_args(spec: Spec, setting: _Setting) -> dict[str, Any]:
    fields: dict[str, Any] = {"pad_to_multiple_of": setting.multiple}
    if not family(spec.trainer).generation_groups:
        fields["max_length"] = setting.max_length
    return fields


def _prepare(spec: Spec, args: TrainerArgs, split: SplitLengths, setting: _Setting) -> PreparedSplit:
    completion_only = (
        bool(split.prompt.any()) and getattr(args.config, "completion_only_loss", None) is not False
    )
    return prepare(
        split,
        spec.trainer,
        max_length=setting.max_length,
        completion_only_loss=completion_only,
        keep_start=getattr(args.config, "truncation_mode", "keep_start") == "keep_start",
        max_prompt_length=setting.max_prompt,
    )


def _geometry(
    spec: Spec, args: TrainerArgs, completion_tokens: int | None, assumptions: list[str]
) -> Geometry:
    world_size = spec.target.world_size
    accelerator = args.accelerator_config
    common: dict[str, Any] = {
        "trainer": spec.trainer,
        "batch": args.per_device_train_batch_size,
        "world_size": world_size,
        "multiple": args.pad_to_multiple_of,
        "drop_last": bool(args.dataloader_drop_last),
        "even_batches": bool(getattr(accelerator, "even_batches", True)),
    }
    if not family(spec.trainer).generation_groups:
        precompute = bool(getattr(args.config, "precompute_ref_log_probs", False))
        # DPO: the reference model's forward runs beside each training step, unless precomputed
        references = "ref" in family(spec.trainer).step_phases
        return Geometry(
            **common,
            seed=args.data_seed if args.data_seed is not None else args.seed,
            sequential=args.train_sampling_strategy == "sequential",
            reference_every_step=references and not precompute,
            precompute_batch=(args.precompute_ref_batch_size or args.per_device_train_batch_size)
            if references and precompute
            else None,
        )
    generation = dict(getattr(args.config, "generation_kwargs", None) or {})
    limit = generation.get("max_new_tokens", args.max_completion_length)
    completion = limit if completion_tokens is None else min(completion_tokens, limit)
    assumptions.append(
        f"every completion is {completion} tokens long"
        + (
            " (the generation limit; give completion_tokens for another length)"
            if completion_tokens is None
            else ""
        )
    )
    if family(spec.trainer).old_logps_every_round:
        old = True
    else:
        generate_every = args.steps_per_generation * args.num_iterations
        old = args.gradient_accumulation_steps % generate_every != 0 or bool(
            args.use_vllm and args.vllm_importance_sampling_correction
        )
    return Geometry(
        **common,
        seed=args.seed,  # RepeatSampler takes seed, not data_seed
        sequential=not getattr(args.config, "shuffle_dataset", True),
        num_generations=args.num_generations,
        steps_per_generation=args.steps_per_generation,
        num_iterations=args.num_iterations,
        completion_tokens=completion,
        forward_passes=int(old) + int(args.beta != 0.0),
    )


def _option(
    setting: _Setting,
    plan: Plan,
    split: PreparedSplit,
    work: JobWork,
    current: bool,
    compile_costs: CompileCosts,
    step_costs: StepCosts,
    spec: Spec,
    dropped_before: int,
) -> AdviceOption:
    compile_seconds = sum(compile_costs.seconds(s) for s in plan.signatures)
    train_seconds = work.work * step_costs.seconds_per_token
    epoch = work.first_epoch
    return AdviceOption(
        **setting.fields(),
        current=current,
        args=option_args(spec, setting),
        signatures=plan.signatures,
        compile_seconds=compile_seconds,
        padded_tokens=epoch.padded,
        real_tokens=epoch.real,
        padding_waste=1.0 - epoch.real / epoch.padded if epoch.padded else 0.0,
        steps=work.steps,
        train_seconds=train_seconds,
        projected_seconds=compile_seconds + train_seconds,
        examples_truncated=split.truncated,
        examples_dropped=split.dropped + dropped_before,
        warnings=plan.warnings,
    )


def _standing_assumptions(spec: Spec, lengths: DatasetLengths) -> list[str]:
    notes = [
        "step time is proportional to the padded tokens of the slowest process (forward-only passes at a third); "
        "evaluation is not in the projection (its signatures are in the compile time)",
    ]
    if family(spec.trainer).generation_groups:
        notes.append(
            "generation's decode steps are not in the projection (the same for every option); the prefill is"
        )
    if lengths.source == HISTOGRAM_SOURCE:
        notes.append(
            "lengths from the spec's histogram: the dataset order is unknown, so waste is an estimate"
        )
    return notes
