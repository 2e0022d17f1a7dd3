"""The spec: what a training job is, as far as its compiled graphs are concerned.

A spec names the TRL trainer, the model (only its config and tokenizer are read), the trainer's
config fields under TRL's own names, optional facts about the dataset, and the target the job runs
on. It is read from our YAML/JSON form or imported from the YAML a user passes to
`trl <trainer> --config ...`.

This module needs neither TRL nor torch: a training pod loads specs with the base install. The deep
check against TRL's real config classes lives in `warmup.trl_args` and runs where TRL is installed.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
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

TrainerKind = Literal["sft", "dpo", "kto", "reward", "grpo", "rloo", "distillation"]
TRAINER_KINDS: tuple[str, ...] = get_args(TrainerKind)
Backend = Literal["neuron", "inductor"]
Device = Literal["neuron", "cuda", "cpu"]

# The only NEURON_RT_VISIBLE_CORES groups a worker or training process may take
# (docs/compile-caches.md, 'NeuronCore groups').
SUPPORTED_NEURON_CORE_GROUPS = ("0", "1", "2", "3", "0,1", "2,3", "0-1", "2-3", "0-3")

# Keys of TRL's CLI dataclasses (`trl sft --config x.yaml`) that are not trainer config fields.
# ScriptArguments: dataset selection, irrelevant to shapes (the data facts say what matters).
TRL_CLI_SCRIPT_KEYS = frozenset(
    {
        "dataset_name",
        "dataset_config",
        "dataset_train_split",
        "dataset_test_split",
        "dataset_streaming",
        "ignore_bias_buffers",
        "datasets",
        "dataset_mixture",
        "config",
    }
)
# ModelConfig: how the model is loaded. TRL's scripts turn these into `model_init_kwargs`.
TRL_CLI_MODEL_INIT_KEYS = {
    "model_revision": "revision",
    "dtype": "dtype",
    "attn_implementation": "attn_implementation",
}
TRL_CLI_PEFT_KEYS = frozenset(
    {
        "use_peft",
        "lora_r",
        "lora_alpha",
        "lora_dropout",
        "lora_target_modules",
        "lora_target_parameters",
        "lora_modules_to_save",
        "lora_task_type",
        "use_rslora",
        "use_dora",
    }
)
TRL_CLI_QUANTIZATION_KEYS = frozenset(
    {"load_in_8bit", "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage"}
)


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

    num_train_examples: PositiveInt | None = Field(None, description="Examples in the train split.")
    num_eval_examples: NonNegativeInt | None = Field(None, description="Examples in the eval split.")
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

    @field_validator("trainer", mode="before")
    @classmethod
    def _known_trainer(cls, value: Any) -> Any:
        if isinstance(value, str) and value.lower() in TRAINER_KINDS:
            return value.lower()
        raise ValueError(unknown_trainer_message(value))

    @field_validator("args", "peft")
    @classmethod
    def _plain_config(cls, value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if value is not None:
            check_config_value(value, info.field_name or "")
        return value

    @model_validator(mode="after")
    def _teacher_only_for_distillation(self) -> Spec:
        if self.trainer == "distillation" and not self.teacher_model:
            raise ValueError("the distillation trainer needs teacher_model (a hub id or local directory)")
        if self.trainer != "distillation" and self.teacher_model:
            raise ValueError(f"teacher_model is only used by the distillation trainer, not {self.trainer!r}")
        return self

    def canonical_json(self) -> str:
        """A stable JSON form: the same spec always gives the same bytes."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def key(self) -> str:
        """sha256 of the canonical JSON; the same spec submitted twice has the same key."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()


def unknown_trainer_message(value: Any) -> str:
    close = difflib.get_close_matches(str(value).lower(), TRAINER_KINDS, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown trainer {value!r}: expected one of {', '.join(TRAINER_KINDS)}{hint}"


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
    data: dict[str, Any], *, trainer: str | None = None, target: dict[str, Any] | None = None
) -> Spec:
    """Validate a spec given as a mapping, in our form or in TRL's CLI form.

    `trainer` and `target` fill in what a TRL CLI config does not say (the CLI subcommand and where
    the job runs); in our form they override the document's values when given.
    """
    if not isinstance(data, dict):
        raise SpecError(f"a spec is a mapping, not {type(data).__name__}")
    if is_trl_cli_config(data):
        data = from_trl_cli_config(data, trainer=trainer)
    elif trainer is not None:
        data = {**data, "trainer": trainer}
    if target is not None:
        data = {**data, "target": {**(data.get("target") or {}), **target}}
    raw_trainer = data.get("trainer")
    if raw_trainer is None:
        raise SpecError("required field (which TRL trainer the job runs)", loc="trainer")
    if not (isinstance(raw_trainer, str) and raw_trainer.lower() in TRAINER_KINDS):
        raise UnknownTrainerError(unknown_trainer_message(raw_trainer), loc="trainer")
    try:
        return Spec.model_validate(data)
    except ValidationError as error:
        raise SpecError(_problems(error)) from None


def is_trl_cli_config(data: dict[str, Any]) -> bool:
    """TRL's CLI configs are flat and name the model `model_name_or_path`."""
    return "model_name_or_path" in data and "args" not in data


def from_trl_cli_config(data: dict[str, Any], *, trainer: str | None = None) -> dict[str, Any]:
    """Turn the YAML of `trl <trainer> --config x.yaml` into our spec form.

    ModelConfig's loading fields become `model_init_kwargs`, as TRL's own scripts do; LoRA fields become
    `peft`; dataset selection is dropped (give `data` facts instead); the rest are trainer config fields.
    """
    flat = dict(data)
    spec: dict[str, Any] = {"model": flat.pop("model_name_or_path")}
    spec["trainer"] = trainer or flat.pop("trainer", None)
    flat.pop("trainer", None)
    for key in ("teacher_model", "data", "target"):
        if key in flat:
            spec[key] = flat.pop(key)
    if "teacher_model_name_or_path" in flat:
        spec["teacher_model"] = flat.pop("teacher_model_name_or_path")
    init_kwargs = dict(flat.pop("model_init_kwargs", None) or {})
    for cli_key, init_key in TRL_CLI_MODEL_INIT_KEYS.items():
        if flat.get(cli_key) is not None:
            init_kwargs[init_key] = flat[cli_key]
        flat.pop(cli_key, None)
    peft = {key: flat.pop(key) for key in list(flat) if key in TRL_CLI_PEFT_KEYS}
    if peft.pop("use_peft", False):
        spec["peft"] = peft
    quantization = {key: flat.pop(key) for key in list(flat) if key in TRL_CLI_QUANTIZATION_KEYS}
    if any(quantization.get(k) for k in ("load_in_8bit", "load_in_4bit")):
        raise SpecError(
            "bitsandbytes quantization does not run on Neuron or under torch.compile", loc="load_in_4bit"
        )
    for key in TRL_CLI_SCRIPT_KEYS:
        flat.pop(key, None)
    if init_kwargs:
        flat["model_init_kwargs"] = init_kwargs
    spec["args"] = flat
    return spec


def load_spec(
    source: str | Path | dict[str, Any],
    *,
    trainer: str | None = None,
    target: dict[str, Any] | None = None,
) -> Spec:
    """Load a spec from a YAML/JSON file, a YAML/JSON string, or a mapping."""
    if isinstance(source, dict):
        return parse_spec(source, trainer=trainer, target=target)
    text: str
    path = Path(source) if isinstance(source, Path) or "\n" not in str(source) else None
    if path is not None and path.exists():
        try:
            text = path.read_text()
        except OSError as error:
            raise SpecError(f"cannot read spec file {path}: {error.strerror}") from None
    elif (
        path is not None
        and isinstance(source, Path | str)
        and str(source).endswith((".yaml", ".yml", ".json"))
    ):
        raise SpecError(f"spec file {source} does not exist")
    else:
        text = str(source)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SpecError(f"not valid YAML or JSON: {error}") from None
    return parse_spec(data, trainer=trainer, target=target)
