"""The spec: what a training job is, as far as its compiled graphs are concerned.

A spec names the TRL trainer, the model (only its config and tokenizer are read), the trainer's
config fields under TRL's own names, optional facts about the dataset, and the target the job runs
on. It is read from our YAML/JSON form or imported from the YAML a user passes to
`trl <trainer> --config ...`.

This module needs neither TRL nor torch: a training pod loads specs with the base install. A trl
config's keys are sorted by the fields of TRL's script dataclasses: the installed TRL's where it is installed
(`warmup.job.trl_fields`, remembered once computed), else those shipped as data
(`warmup/data/trl_cli_fields.json`); reading them as TRL reads them (`warmup.job.trl_config`) and the
check against TRL's real config classes (`warmup.job.trl_args`) run where TRL is installed, when the job
is planned or warmed. A side file (`read_job(side=...)`) carries what `trl` must not see: the
trainer, the target, the data facts or the dataset to compute them from, the worker pool.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import math
import os
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from warmup.errors import FieldProblem, SpecError, UnknownTrainerError
from warmup.trainers.registry import FAMILIES, family

TrainerKind = Literal["sft", "dpo", "kto", "reward", "grpo", "rloo", "distillation"]
TRAINER_KINDS: tuple[str, ...] = get_args(TrainerKind)
Backend = Literal["neuron", "inductor"]
Device = Literal["neuron", "cuda", "cpu"]

# The only NEURON_RT_VISIBLE_CORES groups a worker or training process may take
# (docs/compile-caches.md, 'NeuronCore groups').
SUPPORTED_NEURON_CORE_GROUPS = ("0", "1", "2", "3", "0,1", "2,3", "0-1", "2-3", "0-3")

# Keys a spec or a side file carries for trl-warmup itself; `trl` never sees them.
# `dataset` names a local dataset whose facts are computed here (the service takes only the facts),
# `sample` limits that to the first N examples of each split, `pool` is the worker pool to warm for.
JOB_KEYS = ("dataset", "sample", "pool")
SIDE_FILE_KEYS = frozenset({"trainer", "target", "data", "teacher_model", *JOB_KEYS})
# TRL scripts turn these ModelConfig fields into `model_init_kwargs` (trl/scripts/<trainer>.py `main`).
TRL_MODEL_INIT_KEYS = {
    "model_revision": "revision",
    "dtype": "dtype",
    "attn_implementation": "attn_implementation",
}


# Bounds on what a spec may ask for, each far above any real job: a spec is read by a shared service,
# and a number or a nesting without a bound is work without one.
MAX_WORLD_SIZE = 1 << 16  # training processes
MAX_MODEL_NAME = 4096  # a hub id or a local path (PATH_MAX)
MAX_NESTING = 16  # levels of mappings and lists inside args / peft (TRL's own configs use three)
# Keys and list items inside args / peft, all levels together (TRL's largest config has ~250 fields);
# each unknown key costs a fuzzy search for the field the user meant.
MAX_CONFIG_VALUES = 4096


def check_config_value(value: Any, path: str) -> None:
    """Refuse what no trainer config holds and JSON cannot round-trip: deep nesting, NaN and infinities,
    and more values than any config has."""
    count = 0
    pending: list[tuple[Any, str, int]] = [(value, path, 0)]
    while pending:
        item, where, depth = pending.pop()
        if depth > MAX_NESTING:
            raise ValueError(f"{where} is nested more than {MAX_NESTING} levels deep")
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{where} is {item}, not a finite number")
        children = (
            item.items()
            if isinstance(item, dict)
            else enumerate(item)
            if isinstance(item, list | tuple)
            else ()
        )
        for key, child in children:
            count += 1
            if count > MAX_CONFIG_VALUES:
                raise ValueError(
                    f"{path} holds more than {MAX_CONFIG_VALUES} fields and items; a trainer config has a few hundred"
                )
            pending.append((child, f"{where}.{key}", depth + 1))


class _StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Target(_StrictModel):
    """Where the training job runs: the compile backend, the device and how many processes."""

    backend: Backend = Field("neuron", description="Compile backend: TorchNeuron or PyTorch Inductor.")
    device: Device = Field("neuron", description="Device type the training processes use.")
    world_size: PositiveInt = Field(
        1, le=MAX_WORLD_SIZE, description="Number of training processes (all nodes together)."
    )
    neuron_rt_visible_cores: str | None = Field(
        None, description="NEURON_RT_VISIBLE_CORES of each training process, if the job pins cores."
    )

    @model_validator(mode="after")
    def _backend_matches_device(self) -> Target:
        if self.backend == "neuron" and self.device != "neuron":
            raise ValueError(f"backend 'neuron' runs on device 'neuron', not {self.device!r}")
        if self.backend == "inductor" and self.device == "neuron":
            raise ValueError(
                "backend 'inductor' runs on device 'cuda' or 'cpu'; use backend 'neuron' on Trainium"
            )
        return self


class DataFacts(_StrictModel):
    """What is known about the dataset, in tokens as the trainer sees them (after templating)."""

    num_train_examples: PositiveInt | None = Field(
        None, description="Examples in the train split (the dataset's count, packing or not)."
    )
    num_eval_examples: NonNegativeInt | None = Field(None, description="Examples in the eval split.")
    num_train_rows: PositiveInt | None = Field(
        None,
        description="SFT with packing: the packed rows TRL makes of the train split (what batches are made of; "
        "`warmup facts` counts them). Unknown: every size the last batch can have is listed.",
    )
    num_eval_rows: NonNegativeInt | None = Field(
        None, description="SFT with packing: the packed rows of the eval split."
    )
    max_tokens: PositiveInt | None = Field(
        None, description="Longest example (prompt + completion, incl. special tokens)."
    )
    min_tokens: PositiveInt | None = Field(None, description="Shortest example.")
    max_prompt_tokens: PositiveInt | None = Field(
        None, description="Longest prompt (GRPO / RLOO / distillation)."
    )
    min_prompt_tokens: PositiveInt | None = Field(None, description="Shortest prompt.")
    length_histogram: dict[PositiveInt, PositiveInt] | None = Field(
        None, description="Example length in tokens -> number of examples of that length."
    )
    estimated_from: PositiveInt | None = Field(
        None,
        description="The facts were read from only this many examples per split (`--sample`): an estimate; "
        "lengths beyond them are not planned.",
    )

    @model_validator(mode="after")
    def _ranges(self) -> DataFacts:
        for low, high in (("min_tokens", "max_tokens"), ("min_prompt_tokens", "max_prompt_tokens")):
            lo, hi = getattr(self, low), getattr(self, high)
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"{low} ({lo}) is larger than {high} ({hi})")
        prompt, whole = self.max_prompt_tokens, self.max_tokens
        if prompt is not None and whole is not None and prompt > whole:
            raise ValueError(
                f"max_prompt_tokens ({self.max_prompt_tokens}) is larger than max_tokens ({self.max_tokens})"
            )
        return self

    @property
    def longest(self) -> int | None:
        """The longest example, from max_tokens or the histogram."""
        if self.max_tokens is not None:
            return self.max_tokens
        return max(self.length_histogram) if self.length_histogram else None

    @property
    def shortest(self) -> int | None:
        """The shortest example, from min_tokens or the histogram."""
        if self.min_tokens is not None:
            return self.min_tokens
        return min(self.length_histogram) if self.length_histogram else None


class Spec(_StrictModel):
    """A training job as trl-warmup sees it."""

    trainer: TrainerKind = Field(description="The TRL trainer: " + ", ".join(TRAINER_KINDS) + ".")
    model: str = Field(
        min_length=1,
        max_length=MAX_MODEL_NAME,
        description="Hub id or local directory; only config and tokenizer are read.",
    )
    teacher_model: str | None = Field(
        None, max_length=MAX_MODEL_NAME, description="Distillation only: the teacher's hub id or directory."
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="The trainer's config fields under TRL's own names (SFTConfig, ...).",
    )
    peft: dict[str, Any] | None = Field(
        None,
        description="LoRA settings (TRL ModelConfig names: lora_r, lora_alpha, ...), if the job uses PEFT.",
    )
    data: DataFacts = Field(default_factory=DataFacts)
    target: Target = Field(default_factory=Target)
    files: dict[str, Any] = Field(
        default_factory=dict,
        description="The files the job's launch names (its accelerate config file, a DeepSpeed or FSDP JSON), read "
        "where the config was read: the path as the config writes it -> the file's parsed content. Whoever plans or "
        "warms the spec reads these, not its own disk; `warmup` fills them when it reads a config.",
    )

    @field_validator("trainer", mode="before")
    @classmethod
    def _known_trainer(cls, value: Any) -> Any:
        if isinstance(value, str) and value.lower() in TRAINER_KINDS:
            return value.lower()
        raise ValueError(unknown_trainer_message(value))

    @field_validator("args", "peft", "files")
    @classmethod
    def _plain_config(cls, value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if value is not None:
            check_config_value(value, info.field_name or "")
        return value

    @model_validator(mode="after")
    def _teacher_only_where_needed(self) -> Spec:
        needs_teacher = family(self.trainer).needs_teacher
        if needs_teacher and not self.teacher_model:
            raise ValueError(f"the {self.trainer} trainer needs teacher_model (a hub id or local directory)")
        if not needs_teacher and self.teacher_model:
            taught = " or ".join(kind for kind, record in FAMILIES.items() if record.needs_teacher)
            raise ValueError(f"teacher_model is only used by the {taught} trainer, not {self.trainer!r}")
        return self

    def canonical_json(self) -> str:
        """A stable JSON form: the same spec always gives the same bytes."""
        dumped = self.model_dump(mode="json")
        if not dumped["files"]:
            del dumped["files"]  # a spec without launch files keeps the key it had before they were carried
        return json.dumps(dumped, sort_keys=True, separators=(",", ":"))

    def key(self) -> str:
        """sha256 of the canonical JSON; the same spec submitted twice has the same key."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()


def unknown_trainer_message(value: Any) -> str:
    """Which trainers exist; a trainer that left TRL's core for `trl.experimental` is named as such (`orpo` is
    not a misspelt `grpo`), and a spelling suggestion is made only for a name that is no trainer at all."""
    name = str(value).lower()
    known = f"expected one of {', '.join(TRAINER_KINDS)} (the trainers of `trl <trainer> --config`)"
    if name in _experimental_trainers():
        return (
            f"unknown trainer {value!r}: {name.upper()} left TRL's core and CLI for trl.experimental.{name} in TRL 1.x, "
            f"so `trl {name}` does not exist and the job cannot be planned; {known}"
        )
    if name in FORMER_TRL_TRAINERS:  # a real trainer, not a misspelt one: `ppo` is not `dpo`
        return (
            f"unknown trainer {value!r}: {name.upper()} is a trainer of earlier TRL versions that TRL 1.x removed, so "
            f"trl-warmup does not support it; {known}"
        )
    close = difflib.get_close_matches(name, TRAINER_KINDS, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown trainer {value!r}: {known}{hint}"


# Trainers earlier TRL versions had and TRL 1.x removed (PPO last: huggingface/trl#7020); the ones that moved to
# trl.experimental are read from the installed TRL instead (`experimental_trainers`).
FORMER_TRL_TRAINERS = frozenset({"ppo", "prm", "bco", "xpo", "nash_md", "alignprop", "ddpo", "iterative_sft"})


def _experimental_trainers() -> frozenset[str]:
    return frozenset(trl_cli_fields()["experimental_trainers"])


def _problems(error: ValidationError) -> list[FieldProblem]:
    problems = []
    for item in error.errors(include_url=False):
        loc = ".".join(str(part) for part in item["loc"])
        msg = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            msg = "unknown field"
            parent_fields = _fields_at(item["loc"][:-1])
            close = difflib.get_close_matches(str(item["loc"][-1]), parent_fields, n=1)
            if close:
                msg += f"; did you mean {close[0]!r}?"
        problems.append(FieldProblem(loc, msg))
    return problems


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = Spec
    for part in loc:
        annotation = model.model_fields[str(part)].annotation if str(part) in model.model_fields else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def parse_spec(
    data: dict[str, Any],
    *,
    trainer: str | None = None,
    target: dict[str, Any] | None = None,
    side: dict[str, Any] | None = None,
) -> Spec:
    """Validate a spec given as a mapping, in our form or in TRL's CLI form.

    `trainer`, `target` and the side file `side` fill in what a TRL CLI config does not say (the CLI
    subcommand, where the job runs, the data facts); `trainer` and `target` override the document's
    values, and the document's own warm-up keys override the side file's.
    """
    if not isinstance(data, dict):
        raise SpecError(f"a spec is a mapping, not {type(data).__name__}")
    side = dict(side or {})
    for key in JOB_KEYS:
        side.pop(key, None)
    data = dict(data)
    for key in JOB_KEYS:
        if key in data:
            raise SpecError(
                f"{key!r} is read by the warmup command line, not by the service: compute the facts with "
                "`warmup facts --dataset PATH SPEC` and send them as `data`",
                loc=key,
            )
    named_trainer = trainer or data.get("trainer") or side.get("trainer")
    # keys a spec does not have, other than misspellings of its own (`tagret`)
    flat_keys = {
        key
        for key in set(data) - set(Spec.model_fields) - set(JOB_KEYS)
        if not difflib.get_close_matches(str(key), list(Spec.model_fields), n=1, cutoff=0.8)
    }
    if is_trl_cli_config(data) or (
        named_trainer and "args" not in data and ("model" not in data or flat_keys)
    ):
        # A trl config (a spec nests the trainer's fields in `args`), read as `trl <trainer>` reads it even when it
        # lacks model_name_or_path: the errors are TRL's, not the spec format's.
        trainer = trainer or data.pop("trainer", None) or side.get("trainer")
        data = from_trl_cli_config(data, trainer=trainer, side=side)
    else:
        data = {**{k: v for k, v in side.items() if k != "target"}, **data}
        data["target"] = {**(side.get("target") or {}), **(data.get("target") or {})}
        if trainer is not None:
            data["trainer"] = trainer
    if target is not None:
        data = {**data, "target": {**(data.get("target") or {}), **target}}
    data = _local_paths_made_absolute(data)
    data = _target_from_args(data)
    if isinstance(data.get("args"), dict):
        given_files = data.get("files")
        data = {
            **data,
            "files": launch_files(data["args"], given_files if isinstance(given_files, dict) else {}),
        }
    processes = (
        launched_processes(data["args"], data.get("files") or {})
        if isinstance(data.get("args"), dict)
        else None
    )
    if processes is not None:
        data = {**data, "target": {**(data.get("target") or {}), "_processes": processes}}
    _check_world_size(data)
    raw_trainer = data.get("trainer")
    if raw_trainer is None:
        raise SpecError(
            "required field (which TRL trainer the job runs: --trainer, or `trainer:` in the side file)",
            loc="trainer",
        )
    if not (isinstance(raw_trainer, str) and raw_trainer.lower() in TRAINER_KINDS):
        raise UnknownTrainerError(unknown_trainer_message(raw_trainer), loc="trainer")
    try:
        return Spec.model_validate(data)
    except ValidationError as error:
        raise SpecError(_problems(error)) from None


# What a spec names that `trl` reads from disk when it is a local path (transformers' from_pretrained, TRL's
# chat_template_path): a directory or file there, else a Hub id.
LOCAL_PATH_FIELDS = ("model", "teacher_model")
LOCAL_PATH_ARGS = ("chat_template_path",)


def _local_paths_made_absolute(data: dict[str, Any]) -> dict[str, Any]:
    """Relative paths as `trl` resolves them, from the directory it runs in (this process's), made absolute here
    so that the service and its workers read what this machine named, not their own working directory's; a Hub
    id, or a path this machine does not have, stays as written (whoever reads it says where it looked)."""

    def absolute(value: Any) -> Any:
        if not isinstance(value, str) or not value or Path(value).is_absolute():
            return value
        try:
            return os.path.abspath(value) if Path(value).exists() else value
        except (OSError, ValueError):  # a name no filesystem holds: the reader refuses it
            return value

    data = {**data, **{key: absolute(data[key]) for key in LOCAL_PATH_FIELDS if key in data}}
    args = data.get("args")
    if isinstance(args, dict) and any(key in args for key in LOCAL_PATH_ARGS):
        data["args"] = {**args, **{key: absolute(args[key]) for key in LOCAL_PATH_ARGS if key in args}}
    return data


def _target_from_args(data: dict[str, Any]) -> dict[str, Any]:
    """Where the config says it trains, when nothing else does: `use_cpu: true` is the CPU, so Inductor on
    cpu. Without it the default target stays neuron (Trainium, what the project is for), and the command
    line says so wherever it matters (`--target`'s help, `warmup plan`'s summary, a missing Neuron SDK)."""
    given = data.get("target")
    given = given if isinstance(given, dict) else {}
    if "backend" in given or "device" in given or not says_use_cpu(data.get("args")):
        return data
    return {**data, "target": {**given, "backend": "inductor", "device": "cpu"}}


def says_use_cpu(args: Any) -> bool:
    """The trainer's args say `use_cpu: true` (as TRL's parser takes a flag: `true`, `True`, `1`, ...)."""
    value = args.get("use_cpu") if isinstance(args, dict) else None
    return value is True or (isinstance(value, str) and value.strip().lower() in ("true", "1", "yes"))


def is_trl_cli_config(data: dict[str, Any]) -> bool:
    """TRL's CLI configs are flat and name the model `model_name_or_path`."""
    return "model_name_or_path" in data and "args" not in data


@dataclasses.dataclass(frozen=True)
class ScriptFields:
    """The fields of the dataclasses `trl <trainer>` parses besides the trainer config, read from TRL itself."""

    model: frozenset[str]  # ModelConfig
    dataset: frozenset[str]  # the dataset selection: DatasetMixtureConfig, ScriptArguments' dataset_*
    script: frozenset[
        str
    ]  # the script's other arguments (GRPO: reward_funcs, reward_model_name_or_path, ...)


def shipped_trl_cli_fields() -> dict[str, Any]:
    """The lists shipped with trl-warmup: those of the locked stack's TRL, accelerate and transformers."""
    return dict(json.loads(resources.files("warmup.data").joinpath("trl_cli_fields.json").read_text()))


def installed_trl_versions() -> dict[str, str] | None:
    """The installed versions the field lists depend on (read from the packages' metadata, nothing imported);
    None where one of them is not installed (a base install)."""
    from importlib import metadata

    try:
        return {name: metadata.version(name) for name in ("trl", "accelerate", "transformers")}
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def trl_cli_fields() -> dict[str, Any]:
    """What `trl <trainer> --config` reads besides the trainer config: the installed TRL's, accelerate's and
    transformers' (`warmup.job.trl_fields`, computed once per set of versions, which imports TRL), or the lists
    shipped with trl-warmup where they are those versions' or where TRL is not installed: a pod reads its trl
    config with the base install, and `warmup doctor` says which lists it reads."""
    shipped = shipped_trl_cli_fields()
    installed = installed_trl_versions()
    if installed is None or all(shipped.get(name) == version for name, version in installed.items()):
        return shipped
    from warmup.job.trl_fields import fields_for

    return fields_for(installed)


def trl_script_fields(trainer: str) -> ScriptFields:
    """The non-trainer fields `trl <trainer> --config` accepts."""
    if trainer not in TRAINER_KINDS:
        raise UnknownTrainerError(unknown_trainer_message(trainer), loc="trainer")
    fields = trl_cli_fields()
    script = fields["scripts"][trainer]
    return ScriptFields(
        model=frozenset(fields["model"]),
        dataset=frozenset(script["dataset"]),
        script=frozenset(script["script"]),
    )


def from_trl_cli_config(
    data: dict[str, Any], *, trainer: str | None = None, side: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Turn the YAML of `trl <trainer> --config x.yaml` into our spec form, the way TRL's scripts read it.

    Fields are sorted by the dataclass of TRL's script that owns them: ModelConfig's loading fields become
    `model_init_kwargs` and its LoRA fields `peft` (as `main()` of each script does), the dataset selection
    is left out (its facts go in `data`), and everything else stays in `args` as given: the trainer
    config's fields, the script's own arguments, `env` and the keys `trl` hands to `accelerate launch`.
    `warmup.job.trl_config` checks `args` with TRL's parser when the job is planned.
    """
    side = dict(side or {})
    flat = dict(data)
    trainer = trainer or side.get("trainer")
    if trainer is None:
        raise SpecError(
            "required field (which TRL trainer the job runs: --trainer, or `trainer:` in the side file)",
            loc="trainer",
        )
    if not (isinstance(trainer, str) and trainer.lower() in TRAINER_KINDS):
        raise UnknownTrainerError(unknown_trainer_message(trainer), loc="trainer")
    trainer = trainer.lower()
    fields = trl_script_fields(trainer)
    if "model_name_or_path" not in flat:
        raise SpecError(_no_model(flat, trainer))
    spec: dict[str, Any] = {"trainer": trainer, "model": flat.pop("model_name_or_path")}
    for key in ("teacher_model", "data", "target"):
        value = flat.pop(key, None)
        if value is not None:
            spec[key] = value
        elif key in side:
            spec[key] = side[key]
    if "teacher_model_name_or_path" in flat and "teacher_model" not in spec:
        spec["teacher_model"] = flat["teacher_model_name_or_path"]
    flat.pop(
        "teacher_model_name_or_path", None
    )  # DistillationConfig's own name for it (it is read from `teacher_model`)
    model = {key: flat.pop(key) for key in list(flat) if key in fields.model}
    init_kwargs = dict(flat.pop("model_init_kwargs", None) or {})
    for cli_key, init_key in TRL_MODEL_INIT_KEYS.items():
        if model.get(cli_key) is not None:
            init_kwargs.setdefault(init_key, model[cli_key])
    for key in ("load_in_4bit", "load_in_8bit"):
        if model.get(key):  # refused when the job is planned, with every other problem of the file
            flat[key] = model[key]
    if model.get("use_peft"):
        spec["peft"] = {
            key: value
            for key, value in model.items()
            if key.startswith("lora_") or key in ("use_rslora", "use_dora")
        }
    for key in fields.dataset:
        flat.pop(key, None)
    if init_kwargs:
        flat["model_init_kwargs"] = init_kwargs
    spec["args"] = flat
    return spec


# Other tools' names for the model a trl config must name model_name_or_path.
MODEL_KEY_ALIASES = {
    "model": "the spec format's (and some scripts') name for the model",
    "model_id": "optimum-neuron's training scripts' name for the model",
    "model_name": "another script's name for the model",
    "model_path": "another script's name for the model",
}


def _no_model(flat: dict[str, Any], trainer: str) -> list[FieldProblem]:
    """What `trl <trainer>` makes of a config without model_name_or_path: TRL's ModelConfig leaves it None and
    the script has no model to load; every key no dataclass of the script reads and accelerate's launch parser does
    not take is refused by the launcher (the fields the planner's own reading refuses besides are told once the
    config names its model)."""
    problems = [
        FieldProblem(
            "model_name_or_path",
            f"required: `trl` reads the model to train from model_name_or_path (TRL's ModelConfig); without it "
            f"`trl {trainer}` starts with no model to load",
        )
    ]
    fields = trl_cli_fields()
    known = {*fields["model"], *fields["training_arguments"], *fields["scripts"][trainer]["trainer"], "env"}
    known |= trl_script_fields(trainer).script | {"accelerate_config"}
    for key in flat:
        if key in known or accelerate_launch_option(key):
            continue
        whose = MODEL_KEY_ALIASES.get(key)
        fix = (
            f"{whose}: `trl` reads model_name_or_path, rename it"
            if whose
            else "drop it (or see its fix once the config names its model)"
        )
        problems.append(FieldProblem(f"args.{key}", f"{trl_refuses(key, trainer)}; {fix}"))
    return problems


def trl_refuses(name: str, trainer: str) -> str:
    """`trl <trainer>` hands a key no dataclass of its script reads to `accelerate launch`, which refuses it."""
    return f"unknown field (`trl {trainer}` refuses it: accelerate launch: unrecognized arguments: --{name})"


def accelerate_launch_option(name: str) -> bool:
    """Whether `accelerate launch` takes `--name`: one of its options, or (argparse's abbreviations) the start of
    exactly one (the options of accelerate's own launch parser: `trl_cli_fields`)."""
    options = trl_cli_fields()["accelerate_launch"]
    if name in options:
        return True
    # an option's `_` and `-` spellings are one action
    return len({option.replace("-", "_") for option in options if option.startswith(name)}) == 1


# accelerate's DistributedTypes whose launcher starts num_processes processes (accelerate launch_command); the others
# (NO, MULTI_CPU) run the simple launcher: one process, several only under mpirun (mpirun_config.mpirun_hostfile).
MULTI_PROCESS_TYPES = ("DEEPSPEED", "FSDP", "MEGATRON_LM", "XLA")


def launched_processes(args: dict[str, Any], files: dict[str, Any]) -> int | None:
    """How many processes `accelerate launch` starts for a trl config's launch keys, by accelerate's rule: the
    config file (`config_file`, else `accelerate_config`: a file or one of TRL's presets) picks the launcher and its
    count, an explicit `num_processes` wins over the file's. None when the launch names no count (accelerate counts
    the training machine's GPUs). `files`: the launch files' content (`launch_files`). `warmup.job.trl_launch` reads the
    whole launch with accelerate itself; a test holds the two equal."""
    count = _count(args.get("num_processes"))
    if "config_file" in args:  # `trl` puts accelerate_config's file first: a config_file key wins
        config = files.get(str(args["config_file"]))
    elif "accelerate_config" in args:
        name = str(args["accelerate_config"])
        config = files[name] if name in files else trl_cli_fields()["accelerate_presets"].get(name)
    else:
        return count
    if not isinstance(config, dict):
        return None  # accelerate (or TRL) refuses it; warmup.job.trl_config says so with their words
    distributed = str(config.get("distributed_type", "NO")).upper()
    multi = distributed in MULTI_PROCESS_TYPES or (
        distributed.startswith("MULTI_") and distributed != "MULTI_CPU"
    )
    if not multi and not (config.get("mpirun_config") or {}).get("mpirun_hostfile"):
        return 1
    return count if count is not None else _count(config.get("num_processes"))


def launch_files(args: dict[str, Any], files: dict[str, Any]) -> dict[str, Any]:
    """The files a trl config's launch names, read as the launch reads them (relative paths from the working
    directory), so that they travel with the spec: the accelerate config file (`config_file`, or `accelerate_config`
    when it names a file), the DeepSpeed JSON it or the `deepspeed_config_file` key names, the trainer's `deepspeed`
    and `fsdp_config` when they are paths. `files` already carried are kept. A named file that is nowhere is refused,
    naming it (an `accelerate_config` that is no file is TRL's preset name, or TRL's refusal)."""
    found = dict(files)

    def read(path: Any, loc: str, what: str) -> Any:
        if not isinstance(path, str):
            return None
        if path not in found:
            if not Path(path).is_file():
                raise SpecError(missing_launch_file(path, what), loc=loc)
            try:
                found[path] = yaml.safe_load(Path(path).read_text())  # YAML reads the JSON ones too
            except (OSError, yaml.YAMLError) as error:
                raise SpecError(f"cannot read {path}: {error}", loc=loc) from None
        return found[path]

    accelerate_file: Any = None
    if "config_file" in args:
        accelerate_file = read(args["config_file"], "args.config_file", "`accelerate launch`")
    elif isinstance(args.get("accelerate_config"), str) and (
        args["accelerate_config"] in found or Path(args["accelerate_config"]).is_file()
    ):
        accelerate_file = read(args["accelerate_config"], "args.accelerate_config", "`trl`")
    section = accelerate_file.get("deepspeed_config") if isinstance(accelerate_file, dict) else None
    if "deepspeed_config_file" in args:  # an explicit key wins over the file's
        read(args["deepspeed_config_file"], "args.deepspeed_config_file", "the training process")
    elif isinstance(section, dict) and section.get("deepspeed_config_file"):
        loc = "args.config_file" if "config_file" in args else "args.accelerate_config"
        read(section["deepspeed_config_file"], loc, "the training process")
    for key in ("deepspeed", "fsdp_config"):  # TrainingArguments: a path or an inline dict
        read(args.get(key), f"args.{key}", "the training process")
    return found


def missing_launch_file(path: Any, what: str) -> str:
    """The refusal of a file the launch names that is not there (relative paths: accelerate's working directory)."""
    return (
        f"no such file: {path} ({what} reads it from the working directory, {Path.cwd()}; a spec sent elsewhere "
        "carries the files its launch names in `files`, as warmup's commands fill it)"
    )


def _count(value: Any) -> int | None:
    """accelerate's int() of `--num_processes str(value)`; None for what it refuses (warmup.job.trl_config says why)."""
    try:
        count = int(str(value))
    except ValueError:
        return None
    return count if count > 0 and not isinstance(value, bool | float) else None


def _check_world_size(data: dict[str, Any]) -> None:
    """The launcher's process count sets the world size; a target that says otherwise is a contradiction."""
    target = data.get("target")
    if not isinstance(target, dict) or "_processes" not in target:
        return
    target = dict(target)
    processes = target.pop("_processes")
    given = target.get("world_size")
    if given is not None and given != processes:
        raise SpecError(
            f"the target says {given} training processes but the config launches {processes} (num_processes, or "
            "its accelerate config file's): make them equal, or drop world_size and let the config decide",
            loc="target.world_size",
        )
    target["world_size"] = processes
    data["target"] = target


def dataset_selection(source: str | Path | dict[str, Any]) -> dict[str, Any]:
    """The dataset a spec or TRL config file names: `dataset` (our key), or TRL's dataset selection keys
    (`dataset_name`, `datasets`, ...), as given. Empty when it names none."""
    data = source if isinstance(source, dict) else _read_mapping(source)
    if not isinstance(data, dict):
        return {}
    selection = {key: data[key] for key in ("dataset", "sample") if data.get(key) is not None}
    if is_trl_cli_config(data):
        named = data.get("trainer")
        trainer = named if isinstance(named, str) else "sft"
        try:
            names = trl_script_fields(trainer.lower()).dataset
        except UnknownTrainerError:
            return selection
        selection.update({key: data[key] for key in names if key in data})
    return selection


@dataclasses.dataclass(frozen=True)
class Job:
    """A spec file as the command line reads it: the spec, plus the keys only the command line uses."""

    spec: Spec
    dataset: str | bool | None  # a local dataset to compute the data facts from (True: the config's own)
    sample: int | None
    pool: str | None
    selection: dict[str, Any]  # the dataset the file itself names (TRL's dataset_name, datasets, ...)


def read_job(
    source: str | Path | dict[str, Any],
    *,
    trainer: str | None = None,
    target: dict[str, Any] | None = None,
    side: str | Path | dict[str, Any] | None = None,
    dataset: str | bool | None = None,
    sample: int | None = None,
) -> Job:
    """Read a spec or TRL config (file, YAML text or mapping) with its side file and flags.

    The dataset it names (`dataset`, else the spec's or the side file's `dataset:`, a path relative to
    the file that names it) is returned, not read: `warmup.facts` computes its facts (with TRL,
    transformers and datasets), which the command line then puts in the spec's `data`.
    """
    data = source if isinstance(source, dict) else _read_mapping(source)
    if not isinstance(data, dict):
        raise SpecError(f"a spec is a mapping, not {type(data).__name__}")
    side_data = (side if isinstance(side, dict) else _read_mapping(side, what="side file")) if side else {}
    if not isinstance(side_data, dict):
        raise SpecError(f"a side file is a mapping, not {type(side_data).__name__}", loc="side file")
    unknown = sorted(set(side_data) - SIDE_FILE_KEYS)
    if unknown:
        raise SpecError(
            [
                FieldProblem(
                    f"side file.{key}",
                    f"not a warm-up key (the side file holds {', '.join(sorted(SIDE_FILE_KEYS))}; the job's own "
                    "settings stay in the config `trl` reads)",
                )
                for key in unknown
            ]
        )
    extras = {key: data.get(key, side_data.get(key)) for key in JOB_KEYS}
    named_in = source if "dataset" in data else side if "dataset" in side_data else None
    if isinstance(extras["dataset"], str) and isinstance(named_in, str | Path) and "\n" not in str(named_in):
        extras["dataset"] = str(
            Path(named_in).parent / Path(extras["dataset"]).expanduser()
        )  # relative to its file
    if dataset is not None:
        extras["dataset"] = dataset
    if sample is not None:
        extras["sample"] = sample
    spec = parse_spec(
        {k: v for k, v in data.items() if k not in JOB_KEYS}, trainer=trainer, target=target, side=side_data
    )
    return Job(
        spec=spec,
        dataset=extras["dataset"],
        sample=extras["sample"],
        pool=extras["pool"],
        selection=dataset_selection(data),
    )


def load_spec(
    source: str | Path | dict[str, Any],
    *,
    trainer: str | None = None,
    target: dict[str, Any] | None = None,
    side: str | Path | dict[str, Any] | None = None,
) -> Spec:
    """Load a spec from a YAML/JSON file, a YAML/JSON string, or a mapping (see `read_job`).

    A spec that names a dataset (`dataset:`) needs its facts computed first: `warmup.dataset_facts`, or
    any `warmup` command, which does it.
    """
    job = read_job(source, trainer=trainer, target=target, side=side)
    if job.dataset not in (None, False):
        raise SpecError(
            f"the spec names a dataset ({job.dataset}) whose facts are not computed yet: run it through a `warmup` "
            "command (or warmup.dataset_facts) to fill `data`",
            loc="dataset",
        )
    return job.spec


def _read_mapping(source: str | Path, *, what: str = "spec file") -> Any:
    text: str
    path = Path(source) if isinstance(source, Path) or "\n" not in str(source) else None
    if path is not None and path.exists():
        try:
            text = path.read_text()
        except OSError as error:
            raise SpecError(f"cannot read {what} {path}: {error.strerror}") from None
    elif (
        path is not None
        and isinstance(source, Path | str)
        and str(source).endswith((".yaml", ".yml", ".json"))
    ):
        raise SpecError(f"{what} {source} does not exist")
    else:
        text = str(source)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SpecError(f"not valid YAML or JSON: {error}") from None
