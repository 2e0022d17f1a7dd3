"""Check a spec's `args` against TRL's real config class and resolve them for the target.

TRL's config classes are the authority on field names, types, defaults and the rules between
fields; we build the real class (SFTConfig, GRPOConfig, ...) with the user's fields and read the
resolved values back. A few things depend on where the job runs rather than on this machine, and
are resolved for the spec's target instead:

- `pad_to_multiple_of: auto` is 128 on Neuron and None elsewhere, exactly as TRL's `__post_init__`;
- GRPO / RLOO `generation_batch_size` and `steps_per_generation` use the target's world size;
- the compile backend comes from the target.

The class is built with `use_cpu=True` so that bf16 / fp16 settings meant for an accelerator do not
fail on the machine doing the planning; their values are read from the user's fields.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
import typing
import warnings
from typing import Any

from pydantic import TypeAdapter, ValidationError

from warmup._compat import accelerate as compat_accelerate
from warmup.errors import FieldProblem, MissingDependencyError, SpecError
from warmup.job.peft_args import peft_problems
from warmup.job.spec import Spec
from warmup.job.trl_launch import Launch, with_trainer_fsdp
from warmup.trainers.registry import FAMILIES, family

# Integer fields that size tensors: zero or negative values are impossible (TRL does not check all).
POSITIVE_INT_FIELDS = (
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "gradient_accumulation_steps",
    "max_length",
    "max_completion_length",
    "num_generations",
    "num_generations_eval",
    "generation_batch_size",
    "steps_per_generation",
    "num_iterations",
    "precompute_ref_batch_size",
    "eval_steps",
)

# Fields transformers' __post_init__ rewrites into another type (`fsdp: "full_shard offload"` becomes True, its
# options moved into fsdp_config): their types are checked as given.
REWRITTEN_BY_TRANSFORMERS = ("fsdp", "fsdp_config")


# TRL's package is a lazy module: its first attribute reads import submodules, and two threads doing that
# at once on a cold process can see the half-initialised package ("module 'trl' has no attribute
# 'SFTConfig'"): the API plans concurrent requests in threads. Classes are resolved once, under a lock.
_config_classes: dict[str, type] = {}
_config_classes_lock = threading.Lock()


def config_class(trainer: str) -> type:
    """TRL's config dataclass for a trainer kind (thread-safe, resolved once per kind)."""
    found = _config_classes.get(trainer)
    if found is not None:
        return found
    with _config_classes_lock:
        return _resolve_config_class(trainer)


def warm_up_trl() -> None:
    """Import every TRL config class and build one of each now. The first build imports torch and
    accelerate (seconds, tens of seconds on a busy machine): a server does it before it takes requests
    instead of making its first ones wait, and its request threads then never import concurrently."""
    with _config_classes_lock, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for trainer in FAMILIES:
            _resolve_config_class(trainer)(
                output_dir="warmup-plan", use_cpu=True, bf16=False, report_to="none"
            )


def _resolve_config_class(trainer: str) -> type:
    """Under `_config_classes_lock`."""
    if trainer not in _config_classes:
        try:
            import trl
        except ImportError:
            raise MissingDependencyError(
                "planning needs TRL: pip install 'trl-warmup[trl]' (torch, transformers, trl)"
            ) from None
        _config_classes[trainer] = getattr(trl, family(trainer).config_class)
    return _config_classes[trainer]


@functools.cache
def _fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


@functools.cache
def _adapter(annotation: Any) -> TypeAdapter[Any] | None:
    try:
        return TypeAdapter(annotation)
    except Exception:  # exotic annotations (enums of transformers, forward refs) are left to TRL itself
        return None


@dataclasses.dataclass(frozen=True)
class TrainerArgs:
    """The trainer config as the job will see it: TRL's resolved instance plus the target's values."""

    config: Any  # the TRL config instance (SFTConfig, GRPOConfig, ...)
    given: dict[str, Any]  # the fields the user set, as given
    bf16: bool
    fp16: bool
    compile_backend: str | None  # None when the job does not torch.compile
    compile_mode: str | None
    launch: Launch = dataclasses.field(default_factory=Launch)  # what `trl` hands to `accelerate launch`
    script: dict[str, Any] = dataclasses.field(default_factory=dict)  # the script's own arguments
    notes: tuple[str, ...] = ()  # warnings about the config itself (deprecations, env)

    def __getattr__(self, name: str) -> Any:
        # Attribute access falls through to the TRL config: `args.per_device_train_batch_size`.
        return getattr(self.config, name)

    @property
    def autocast(self) -> str | None:
        return "bf16" if self.bf16 else "fp16" if self.fp16 else None

    def trainer_kwargs(self) -> dict[str, Any]:
        """The trainer config fields the job sets, as TRL's parser read them (what the job's config is built from)."""
        return dict(self.given)


def resolve_trainer_args(spec: Spec) -> TrainerArgs:
    """Validate `spec.args` as `trl <trainer> --config` reads them, build TRL's config class, and resolve it for
    `spec.target`.

    Raises SpecError naming every bad field (`args.<name>`) with the reason and the fix.
    """
    from warmup.job.trl_config import MACHINE_CHECKED, read_trl_args, value_problem

    cls = config_class(spec.trainer)
    fields = _fields(cls)
    trl = read_trl_args(spec, cls)
    given = dict(trl.trainer)
    problems = list(trl.problems)
    problems += _impossible_values(given, spec.trainer)
    problems += [
        FieldProblem(f"args.{name}", hint)
        for name, value in given.items()
        if (hint := value_problem(name, value)) is not None
    ]
    problems += peft_problems(spec.peft)
    if problems:
        raise SpecError(problems)

    kwargs = {**given, **{k: v for k, v in MACHINE_CHECKED.items() if k in fields}}
    if isinstance(given.get("fsdp_config"), str) and isinstance(spec.files.get(given["fsdp_config"]), dict):
        kwargs["fsdp_config"] = dict(
            spec.files[given["fsdp_config"]]
        )  # the JSON as read where the config was
    kwargs.setdefault("output_dir", "warmup-plan")
    # "auto" resolves per target, exactly as TRL does on the device the job runs on.
    kwargs["pad_to_multiple_of"] = resolve_pad_to_multiple_of(given.get("pad_to_multiple_of", "auto"), spec)
    generation = None
    if "steps_per_generation" in fields:
        # TRL derives the generation batch from the number of processes of the machine it runs on;
        # derive it for the target and hand TRL the result so its own checks see the target's value.
        generation = _generation_batch(given, fields, spec.target.world_size)
        kwargs["generation_batch_size"], kwargs["steps_per_generation"] = generation[1], None
        # TRL checks the *global* eval batch against num_generations_eval; built here on one process,
        # hand it the global size and restore the per-device value afterwards.
        eval_batch = given.get("per_device_eval_batch_size", fields["per_device_eval_batch_size"].default)
        kwargs["per_device_eval_batch_size"] = eval_batch * spec.target.world_size
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught, compat_accelerate.shared_state_kept():
            warnings.simplefilter("always")
            config = cls(**kwargs)
    except (ValueError, TypeError) as error:
        message = str(error)
        loc = _field_named_in(message, given)
        hint = value_problem(loc.removeprefix("args."), given.get(loc.removeprefix("args.")))
        raise SpecError(
            [FieldProblem(loc, f"TRL refuses it: {message}" + (f"; {hint}" if hint else ""))]
        ) from None
    if generation is not None:
        config.steps_per_generation, config.generation_batch_size = generation
        config.per_device_eval_batch_size = eval_batch
    # Types are checked on what TRL made of the values (`loss_type: sigmoid` is a one-item list by now).
    problems = _mistyped(
        {
            name: given[name] if name in REWRITTEN_BY_TRANSFORMERS else getattr(config, name)
            for name in given
            if name not in MACHINE_CHECKED
        },
        cls,
        given,
    )
    if problems:
        raise SpecError(problems)

    bf16 = given.get("bf16")
    fp16 = bool(given.get("fp16", False))
    if bf16 is None:  # TRL's rule (trl/trainer/base_config.py): bf16 unless fp16
        bf16 = not fp16
    autocast = "bf16" if bf16 else "fp16" if fp16 else None
    if autocast is None and trl.launch.mixed_precision in ("bf16", "fp16"):
        # TrainingArguments takes the launcher's ACCELERATE_MIXED_PRECISION when neither is set
        autocast = trl.launch.mixed_precision
    compile_backend = None
    compile_mode = given.get("torch_compile_mode")
    if (
        config.torch_compile
        or given.get("torch_compile_backend")
        or compile_mode
        or trl.launch.dynamo_backend
    ):
        compile_backend = "neuron" if spec.target.backend == "neuron" else "inductor"
        user_backend = given.get("torch_compile_backend") or trl.launch.dynamo_backend
        where = (
            "args.torch_compile_backend" if given.get("torch_compile_backend") else "args.accelerate_config"
        )
        if user_backend and user_backend != compile_backend:
            raise SpecError(
                f"compile backend {user_backend!r} does not match the target backend {spec.target.backend!r}",
                loc=where,
            )
        compile_mode = compile_mode or trl.launch.dynamo_mode
    notes = list(trl.warnings) + _deprecations(caught, given)
    max_length = getattr(config, "max_length", None)
    if isinstance(max_length, int) and max_length < 0:
        notes.append(negative_max_length_note(max_length, getattr(config, "truncation_mode", "keep_start")))
    # transformers maps `fsdp` / `fsdp_config` onto accelerate's FSDP plugin arguments as it builds the config
    launch = with_trainer_fsdp(trl.launch, getattr(config, "fsdp_plugin_args", None))
    return TrainerArgs(
        config=config,
        given=given,
        bf16=autocast == "bf16",
        fp16=autocast == "fp16",
        compile_backend=compile_backend,
        compile_mode=compile_mode,
        launch=launch,
        script=trl.script,
        notes=tuple(notes),
    )


def _deprecations(caught: list[warnings.WarningMessage], given: dict[str, Any]) -> list[str]:
    """TRL's and transformers' own deprecation warnings about fields the user set, in their words."""
    found = []
    for item in caught:
        if not issubclass(item.category, (FutureWarning, DeprecationWarning)):
            continue
        text = str(item.message)
        if any(re.search(rf"`{re.escape(name)}\b", text) for name in given):
            found.append(f"TRL / transformers: {text}")
    return list(dict.fromkeys(found))


def resolve_pad_to_multiple_of(value: Any, spec: Spec) -> int | None:
    """TRL's rule: "auto" is 128 when the training device is Neuron, otherwise no padding."""
    if isinstance(value, str):
        if value == "auto":
            on_neuron = spec.target.device == "neuron" and not spec.args.get("use_cpu", False)
            return 128 if on_neuron else None
        if value.lower() in ("none", "null"):
            return None
        try:
            value = int(value)
        except ValueError:
            raise SpecError(
                f"expected an integer, 'auto' or 'none', got {value!r}", loc="args.pad_to_multiple_of"
            ) from None
    if value is not None and (not isinstance(value, int) or value < 1):
        raise SpecError(f"must be a positive integer, got {value!r}", loc="args.pad_to_multiple_of")
    return value


def _generation_batch(
    given: dict[str, Any], fields: dict[str, dataclasses.Field[Any]], world_size: int
) -> tuple[int, int]:
    """GRPO / RLOO: (steps_per_generation, generation_batch_size) by TRL's rule, for `world_size` processes."""

    def value(name: str) -> Any:
        return given.get(name, fields[name].default)

    batch = value("per_device_train_batch_size")
    global_batch = batch * world_size
    steps = given.get("steps_per_generation")
    size = given.get("generation_batch_size")
    if size is not None and steps is not None:
        raise SpecError(
            "generation_batch_size and steps_per_generation cannot both be set",
            loc="args.steps_per_generation",
        )
    if size is not None:
        if size % global_batch != 0:
            raise SpecError(
                f"generation_batch_size ({size}) must be divisible by the global batch size "
                f"per_device_train_batch_size x world_size ({batch} x {world_size} = {global_batch})",
                loc="args.generation_batch_size",
            )
        return size // global_batch, size
    steps = steps if steps is not None else value("gradient_accumulation_steps")
    return steps, global_batch * steps


def _mistyped(resolved: dict[str, Any], cls: type, given: dict[str, Any]) -> list[FieldProblem]:
    problems = []
    # The class's own annotations: HfArgumentParser rewrites the `type` of the dataclass's Field objects in place
    # (`int | str | None` becomes `str`), so dataclasses.fields() no longer tells the truth once a parser was built.
    annotations = _annotations(cls)
    for name, value in resolved.items():
        annotation = annotations.get(name)
        adapter = _adapter(annotation) if annotation is not None else None
        if adapter is None or value is None:
            continue
        try:
            adapter.validate_python(value)
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            problems.append(
                FieldProblem(
                    f"args.{name}", f"expected {_type_name(annotation)}, got {given[name]!r} ({first['msg']})"
                )
            )
    return problems


@functools.cache
def _annotations(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # pragma: no cover - TRL's annotations resolve
        return {}


def truncation_slice(max_length: int, truncation_mode: str) -> slice:
    """The slice TRL truncates a row with (SFTTrainer._prepare_dataset, DPO's collator): a negative max_length
    is a Python slice end too (`max_length: -1` drops each row's last token under keep_start, its first under
    keep_end), not "no truncation"."""
    return slice(None, max_length) if truncation_mode != "keep_end" else slice(-max_length, None)


def truncated_length(length: int, max_length: int | None, truncation_mode: str = "keep_start") -> int:
    """A row's length after TRL's truncation."""
    if max_length is None:
        return length
    return len(range(length)[truncation_slice(max_length, truncation_mode)])


def _impossible_values(given: dict[str, Any], trainer: str) -> list[FieldProblem]:
    problems = []
    for name in POSITIVE_INT_FIELDS:
        value = given.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value >= 1:
            continue
        if name == "max_length" and value < 0 and family(trainer).plans_negative_max_length:
            continue  # TRL slices with it: planned as it runs, with a warning (negative_max_length_note)
        problem = f"must be at least 1, got {value}"
        if name == "max_length" and value < 0:
            problem += (
                f" (TRL slices rows with [:{value}]: the {trainer} trainer's truncation with a negative max_length "
                "is not planned here, only SFT's); max_length: null turns truncation off, which a negative value "
                "likely meant"
            )
        problems.append(FieldProblem(f"args.{name}", problem))
    return problems


def negative_max_length_note(max_length: int, truncation_mode: str) -> str:
    dropped = "last" if truncation_mode != "keep_end" else "first"
    how = f"[:{max_length}]" if truncation_mode != "keep_end" else f"[{-max_length}:]"
    return (
        f"max_length {max_length} does not turn truncation off: TRL slices every example with {how}, dropping its "
        f"{dropped} {-max_length} token(s) (planned so); max_length: null is what turns it off, and is likely what "
        "was meant"
    )


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) or str(annotation)
    return re.sub(r"\b(typing|transformers\.[\w.]+)\.", "", text)


# TRL error messages that describe a field without naming it.
_FIELD_PHRASES = {
    "global eval batch size": "per_device_eval_batch_size",
    "generations per prompt": "num_generations",
}


def _field_named_in(message: str, given: dict[str, Any]) -> str:
    """Best guess at the field an error from TRL's __post_init__ is about."""
    for phrase, name in _FIELD_PHRASES.items():
        if phrase in message:
            return f"args.{name}"
    for name in sorted(given, key=len, reverse=True):
        if re.search(rf"\b{re.escape(name)}\b", message):
            return f"args.{name}"
    for name, value in given.items():
        # Strings only: a small number like 2 appears in many messages.
        if isinstance(value, str) and re.search(rf"\b{re.escape(value)}\b", message):
            return f"args.{name}"
    return "args"
