"""How `trl <trainer> --config FILE` reads a config, reproduced with TRL's own parser (TRL 1.16).

`trl <trainer>` (trl/cli/commands/training.py) builds the training script's `TrlParser` over its
dataclasses (ScriptArguments or the script's own subclass, the trainer config, ModelConfig,
DatasetMixtureConfig), takes `env` out of the YAML, and sets every key the parser knows as that
argument's default: argparse then converts string values with the argument's type, as it does any
string default (`learning_rate: 1e-5`, which YAML reads as text, becomes a float; `loss_type: sigmoid`
stays a string that DPOConfig turns into a one-item list). Every other key goes to `accelerate launch`
as `--key value`, after `accelerate_config` is resolved to a file (a path, or one of TRL's presets):
`num_processes` and `mixed_precision` are accelerate's, anything accelerate does not know is refused
there ("unrecognized arguments"). That is the whole answer to "does `trl` accept this config":
`read_trl_args` asks the same parsers the same questions, without launching anything and without
setting the config's `env` in this process, and collects every problem with its field and its fix.

The fix for a field an older TRL or transformers had comes from their own deprecation messages
(`warmup/data/trl_hints.json`, built by `tools/trl_hints.py` from their releases), followed to the
field that exists now; a few fixes no message states are kept by hand below, each with its source.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import importlib
import json
import threading
from importlib import resources
from typing import Any

from warmup.errors import FieldProblem, MissingDependencyError
from warmup.job.spec import Spec, trl_refuses
from warmup.job.trl_launch import Launch as Launch  # re-exported: the interface's first home
from warmup.job.trl_launch import LaunchProblem, placed_files, read_launch
from warmup.trainers.registry import family

# Fixes no deprecation message states (the field is still there, or left without a word).
HAND_HINTS: dict[str, str] = {
    "dataset_mixture": (
        "alignment-handbook's mixture format, not TRL's: `trl` reads `datasets:` (a list of {path, name, split, "
        "columns, fraction}: handbook id -> path, config -> name, weight -> fraction) with `test_split_size`"
    ),
    "chat_template": (
        "TRL's configs take a template file, not the template text: write it to a .jinja file and set "
        "chat_template_path: FILE"
    ),
    "dataset_mixer": (
        "alignment-handbook's older mixture format ({dataset id: fraction}): `trl` reads `datasets:` (a list of "
        "{path, name, split, columns, fraction}) or dataset_name"
    ),
    "dataset_splits": (
        "alignment-handbook's split list: `trl` reads dataset_train_split and dataset_test_split (one name each)"
    ),
    "preprocessing_num_workers": "an alignment-handbook key; TRL's trainers read dataset_num_proc",
    "use_flash_attention_2": "a model setting in TRL: attn_implementation: flash_attention_2",
}
# Values TRL renamed (the field stayed).
VALUE_HINTS: dict[tuple[str, str], str] = {
    # TRL PR #3696 "Fix mislabeling: 'First-fit decreasing' is actually 'Best-fit-decreasing'" (v0.20)
    ("packing_strategy", "ffd"): "'ffd' was renamed 'bfd' in TRL 0.20 (it always was best-fit decreasing): "
    "packing_strategy: bfd",
}
# ModelConfig's bitsandbytes switches (a trl config's QLoRA).
QUANTIZATION = {
    key: "bitsandbytes quantization (QLoRA) does not run on Neuron or under torch.compile: train without "
    "load_in_4bit / load_in_8bit to warm the job"
    for key in ("load_in_4bit", "load_in_8bit")
}
# GRPO / RLOO / distillation: what replaced the prompt truncation, in the planner's terms.
PROMPT_FACT = (
    "TRL no longer truncates prompts, so the plan needs the longest prompt from the data: pass --dataset PATH "
    "(or give data.max_prompt_tokens in the side file)"
)
# Trainer config fields that check the planning machine (bf16 / tf32 support, DeepSpeed installed, the
# accelerator's name): the config is built here without them, their values are read from what the user gave.
MACHINE_CHECKED = {
    "use_cpu": True,
    "bf16": False,
    "fp16": False,
    "bf16_full_eval": False,
    "fp16_full_eval": False,
    "tf32": None,
    "deepspeed": None,
    "report_to": "none",
}


@dataclasses.dataclass(frozen=True)
class TrlArgs:
    """A spec's `args` read as `trl <trainer> --config` reads them."""

    trainer: dict[str, Any]  # trainer config fields the user set, converted as TRL's parser converts them
    script: dict[str, Any]  # the script's own arguments (reward_funcs, reward_model_name_or_path, ...)
    launch: Launch
    env: dict[str, str]  # the config's `env:` (TRL sets it in the training process)
    warnings: list[str]
    problems: list[FieldProblem]  # what `trl` refuses, each with its fix


_lock = threading.Lock()


@functools.cache
def _script_parser(trainer: str) -> tuple[Any, dict[str, tuple[argparse.Action, type]]]:
    """The training script's own TrlParser and, per argument, its action and the dataclass that owns it."""
    try:
        module = importlib.import_module(f"trl.scripts.{trainer}")
    except ImportError:
        raise MissingDependencyError("planning needs TRL: pip install 'trl-warmup[trl]'") from None
    parser = module.make_parser(prog=f"trl {trainer}")
    owners = {}
    for cls in parser.dataclass_types:
        for field in dataclasses.fields(cls):
            if field.init:
                owners[field.name] = cls
    actions = {}
    for action in parser._actions:
        if action.dest in owners and f"--{action.dest}" in action.option_strings:
            actions[action.dest] = (action, owners[action.dest])
    return parser, actions


@functools.cache
def _launch_parser() -> argparse.ArgumentParser:
    from accelerate.commands.launch import launch_command_parser

    parser: argparse.ArgumentParser = launch_command_parser()
    return parser


class _Refused(Exception):
    pass


def _raise(message: str) -> None:
    raise _Refused(message)


def read_trl_args(spec: Spec, config_class: type) -> TrlArgs:
    """Read `spec.args` as `trl <spec.trainer> --config` does; what it refuses is in `.problems`."""
    with _lock:  # the parsers are shared; argparse keeps state while it parses
        return _read(spec, config_class)


def _read(spec: Spec, config_class: type) -> TrlArgs:
    given = dict(spec.args)
    problems: list[FieldProblem] = []
    warnings: list[str] = []
    env = given.pop("env", None)
    if env is not None and not isinstance(env, dict):
        problems.append(
            FieldProblem("args.env", "`env` is a mapping of environment variables (TRL refuses it)")
        )
        env = None
    env = {str(k): str(v) for k, v in (env or {}).items()}
    parser, actions = _script_parser(spec.trainer)
    trainer_fields = {f.name for f in dataclasses.fields(config_class) if f.init}
    trainer: dict[str, Any] = {}
    script: dict[str, Any] = {}
    leftover: dict[str, Any] = {}
    for name, value in given.items():
        found = actions.get(name)
        if found is None:
            leftover[name] = value
            continue
        action, owner = found
        if isinstance(value, str):
            try:
                value = parser._get_value(action, value)  # argparse's conversion of a string default
            except argparse.ArgumentError as error:
                problems.append(FieldProblem(f"args.{name}", f"{error.message} (TRL's parser refuses it)"))
                continue
        if name in trainer_fields:
            trainer[name] = value
        elif name in QUANTIZATION and value:
            problems.append(FieldProblem(name, QUANTIZATION[name]))
        elif owner.__name__ == "ModelConfig":
            problems.append(
                FieldProblem(
                    f"args.{name}", "a ModelConfig field: write it at the top level of the TRL config"
                )
            )
        else:
            script[name] = value
    launch = _read_launcher(spec, leftover, trainer, problems)
    if launch.processes is not None and launch.processes != spec.target.world_size:
        # spec.py counts the processes without accelerate (warmup.job.spec.launched_processes); they must agree
        problems.append(
            FieldProblem(
                "target.world_size",
                f"the target says {spec.target.world_size} training processes but the config launches "
                f"{launch.describe()}: make them equal, or drop world_size and let the config decide",
            )
        )
    given_count = leftover.get("num_processes")
    if launch.processes == 1 and isinstance(given_count, int) and given_count > 1:
        warnings.append(
            f"num_processes {given_count} is not what runs: the accelerate config's distributed_type is "
            f"{launch.distributed_type}, for which accelerate launches one process ({launch.source})"
        )
    if env:
        warnings += _env_warnings(env)
    return TrlArgs(
        trainer=trainer, script=script, launch=launch, env=env, warnings=warnings, problems=problems
    )


def _read_launcher(
    spec: Spec, leftover: dict[str, Any], trainer: dict[str, Any], problems: list[FieldProblem]
) -> Launch:
    """The keys the script's parser does not know go to `accelerate launch`, which must know them; then the launch
    line `trl` builds is read as accelerate reads it (warmup/job/trl_launch.py)."""
    from trl.cli.accelerate_config import resolve_accelerate_config_argument

    parser = _launch_parser()
    parser.error = _raise  # type: ignore[method-assign,assignment]  # an answer, not an exit
    keys: dict[str, str] = {}  # accelerate's dest -> the config key that set it
    unknown = 0
    for name, value in leftover.items():
        if name == "accelerate_config":
            continue
        action = _launcher_action(parser, name)
        if action is None:
            unknown += 1
            # The fix costs a fuzzy search: full answers for the first keys, not for thousands of junk keys.
            problems.append(FieldProblem(f"args.{name}", refusal(name, spec.trainer, detailed=unknown <= 20)))
            continue
        try:
            ns, extras = parser.parse_known_args([f"--{name}", str(value), "SCRIPT"])
        except _Refused as error:
            problems.append(FieldProblem(f"args.{name}", f"`accelerate launch` refuses it: {error}"))
            continue
        if extras or ns.training_script != "SCRIPT":  # a flag that takes no value swallows the script's place
            problems.append(FieldProblem(f"args.{name}", _valueless(name)))
            continue
        keys[action.dest] = f"args.{name}"
    named = leftover.get("accelerate_config")
    if named is not None:
        keys.setdefault("config_file", "args.accelerate_config")  # a config_file key comes later and wins
    if problems:
        return Launch()
    with placed_files(leftover, spec.files) as (placed, labels):
        # The line `trl` hands to accelerate: every key as `--key str(value)`, in the file's order.
        argv = [item for name, value in placed.items() for item in (f"--{name}", str(value))]
        try:
            argv = resolve_accelerate_config_argument(argv)
        except ValueError as error:
            problems.append(FieldProblem("args.accelerate_config", f"TRL refuses it: {error}"))
            return Launch()
        if named is not None and argv[:1] == ["--config_file"] and argv[1] not in labels:
            # TRL put the preset accelerate_config names first: named by its name, not its path in site-packages
            labels = {**labels, argv[1]: f"accelerate_config {named}"}
        try:
            return read_launch(argv, keys, labels, trainer.get("deepspeed"), parser, spec.files)
        except LaunchProblem as error:
            problems.append(error.problem)
            return Launch()


def _valueless(name: str) -> str:
    """A flag of accelerate's that takes no value: `trl` still passes the YAML value after it."""
    return (
        f"`trl` hands it to `accelerate launch` as `--{name} VALUE`, but accelerate's --{name} takes no value, so "
        "VALUE takes the training script's place and the launch fails; say it in an accelerate config file "
        "(config_file: FILE, or accelerate_config: a TRL preset) instead"
    )


def _launcher_action(parser: argparse.ArgumentParser, name: str) -> argparse.Action | None:
    """The action of accelerate's launch parser `--name` reaches: an option of its own (`_` or `-`), or
    (argparse's abbreviations) the start of exactly one."""
    flag = f"--{name}"
    options = parser._option_string_actions
    if flag in options:
        return options[flag]
    if not parser.allow_abbrev:
        return None
    found = {options[o] for o in options if o.startswith(flag)}
    return found.pop() if len(found) == 1 else None


def _env_warnings(env: dict[str, str]) -> list[str]:
    from warmup.toolchain.model import compile_env

    relevant = compile_env(env)
    if not relevant:
        return []
    return [
        f"the config's env sets {', '.join(sorted(relevant))}, which change compiled code: TRL sets them in the "
        "training process only, so set them in the environment of `warmup pull` / `exec` and of the warm-up "
        "workers too, or the toolchains will not match"
    ]


# --- the fix for a refused field ------------------------------------------------------------------------


@functools.cache
def _hints() -> dict[str, list[dict[str, Any]]]:
    text = resources.files("warmup.data").joinpath("trl_hints.json").read_text()
    by_field: dict[str, list[dict[str, Any]]] = {}
    for entry in json.loads(text)["entries"]:
        by_field.setdefault(entry["field"], []).append(entry)
    return by_field


def _current_fields(trainer: str) -> dict[str, str]:
    """Every field `trl <trainer>` reads now, with the dataclass that owns it."""
    _, actions = _script_parser(trainer)
    return {name: owner.__name__ for name, (_, owner) in actions.items()}


def refusal(name: str, trainer: str, *, detailed: bool = True) -> str:
    """`trl <trainer>` refuses an unknown key: say so in TRL's terms, then the fix."""
    told = trl_refuses(name, trainer)
    if not detailed:
        return f"{told}; drop it"
    return f"{told}; {fix_for(name, trainer)}"


def fix_for(name: str, trainer: str) -> str:
    current = _current_fields(trainer)
    if name == "max_prompt_length" and family(trainer).generates:
        return f"removed from TRL ({_said(name, trainer)}); {PROMPT_FACT}"
    entries = _hints().get(name, [])
    entry = _best_entry(entries, trainer)
    if entry is not None:
        target = _follow(entry, trainer, current)
        said = _said(name, trainer)
        if target is not None:
            where = current[target]
            kind = (
                "a model setting: top level of the config"
                if where == "ModelConfig"
                else ("a float works: 0.1 = 10% of the steps" if target == "warmup_steps" else where)
            )
            return f"use `{target}` instead ({kind}); {said}"
        gone = entry.get("last_seen", "an older release")
        return (
            f"removed after {gone}: drop it ({said})"
            if entry.get("message")
            else f"removed after {gone}: drop it"
        )
    if name in HAND_HINTS:
        return HAND_HINTS[name]
    if name in ("trainer", "target", "data", "dataset", "pool", "sample"):
        return (
            "a warm-up key: `trl` refuses it in the config; put it in the side file (--side FILE) or a flag"
        )
    # A spelling suggestion only for a slip (two edits at most): a similar-looking name of another tool's
    # (dataset_mixer, hub_model_revision) is not a misspelt TRL field.
    close = [
        c for c in difflib.get_close_matches(name, list(current), n=3, cutoff=0.75) if _edits(name, c) <= 2
    ]
    if close:
        return f"not a field of any dataclass `trl {trainer}` reads; did you mean `{close[0]}`?"
    return f"not a field of any dataclass `trl {trainer}` reads (a key of another script?): drop it"


def _edits(a: str, b: str) -> int:
    """Optimal string alignment distance (insertions, deletions, substitutions, adjacent swaps)."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            cost = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y))
            if i > 1 and j > 1 and x == b[j - 2] and a[i - 2] == y:
                cost = min(cost, previous2[j - 2] + 1)
            current.append(cost)
        previous2, previous = previous, current
    return previous[-1]


def _best_entry(entries: list[dict[str, Any]], trainer: str) -> dict[str, Any] | None:
    """The entry of the trainer's own config first, then shared ones (TrainingArguments, ModelConfig), then any."""
    if not entries:
        return None
    order = [family(trainer).config_class, "TrainingArguments", "ModelConfig", "ScriptArguments"]

    def rank(entry: dict[str, Any]) -> tuple[int, int]:
        scope = order.index(entry["scope"]) if entry["scope"] in order else len(order)
        return (0 if entry.get("replacement") else 1, scope)

    return min(entries, key=rank)


def _follow(entry: dict[str, Any], trainer: str, current: dict[str, str]) -> str | None:
    """Follow replacements (num_of_sequences -> max_seq_length -> max_length) to a field that exists now."""
    seen = {entry["field"]}
    target = entry.get("replacement")
    while target is not None and target not in current and target not in seen:
        seen.add(target)
        nxt = _best_entry(_hints().get(target, []), trainer)
        target = nxt.get("replacement") if nxt else None
    return target if target in current else None


def _said(name: str, trainer: str) -> str:
    entry = _best_entry(_hints().get(name, []), trainer)
    if entry is None or not entry.get("message"):
        return "no deprecation message"
    where = str(entry.get("first_deprecated") or entry.get("last_seen") or "an older release")
    return f'{where.split()[0]} {where.split()[-1]} said: "{entry["message"]}"'


def value_problem(name: str, value: Any) -> str | None:
    """The fix for a value TRL renamed, if this is one."""
    return VALUE_HINTS.get((name, str(value)))
