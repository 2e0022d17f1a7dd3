"""What `accelerate launch` runs for a `trl <trainer> --config` job, read with accelerate's own code (1.15).

`trl` hands every key its script's parser does not know to `accelerate launch` as `--key str(value)`, in the
file's order, after `accelerate_config` is turned into `--config_file FILE` put first (so a `config_file:` key,
which comes later, wins: argparse keeps the last value). Here the same line goes through accelerate's launch parser
and, when it names a config file, through accelerate's launch validation (warmup/_compat/accelerate.py), which applies accelerate's
precedence: an explicit key wins over the file (a section key such as `zero_stage` when the key was given, a
top-level one such as `num_processes` when it is not None), the file's `distributed_type` picks the launcher.
Paths are opened as accelerate opens them: relative to the working directory. The one machine check on that path
(bf16 support, asked of this machine when `mixed_precision` is given) is left out: the target says where the job
runs. Without a config file accelerate counts the training machine's GPUs; that machine is not this one, so the
plan takes the count the config gives (or the target's world size).

The DeepSpeed settings come from accelerate's DeepSpeedPlugin, built as the training process builds it: from the
JSON (`deepspeed_config_file`, or the trainer config's `deepspeed`, a path or an inline dict) and the launcher's
deepspeed keys, which fill the JSON's "auto" values. FSDP's are accelerate's fsdp keys (the file's `fsdp_config`
and explicit `fsdp_*` keys) and the TrainingArguments `fsdp` / `fsdp_config` as transformers maps them onto the
plugin's arguments (`fsdp_plugin_args`), which win.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from warmup.errors import FieldProblem
from warmup.job.spec import missing_launch_file


@dataclasses.dataclass(frozen=True)
class Launch:
    """What a `trl <trainer> --config` job runs as, as far as the compiled graphs care: the launcher (`accelerate
    launch` with the config's launch keys and its accelerate config file, by accelerate's precedence) and the
    trainer config's sharding fields (TrainingArguments `deepspeed`, `fsdp`, `fsdp_config`). docs/trl-configs.md
    says how each field is read.

    Frozen; `fsdp` and `deepspeed` are plain dicts left out of the hash: treat them as read-only.
    """

    # Processes the launch starts, all machines together (accelerate's num_processes after its precedence: the
    # config's key, else the accelerate config file's; 1 when the file's distributed_type is NO or MULTI_CPU without
    # mpirun). None when the launch names no count (no file, no key): `accelerate launch` then counts the training
    # machine's GPUs, and the spec's target.world_size stands.
    processes: int | None = None
    # Machines (nodes) the processes run on: num_machines as given or the file's; None when neither says (1).
    machines: int | None = None
    # accelerate's DistributedType as the training process sees it: NO, MULTI_GPU, MULTI_CPU, DEEPSPEED, FSDP,
    # MEGATRON_LM, XLA, ... A `deepspeed` trainer field makes it DEEPSPEED; `fsdp` makes a multi-process job FSDP.
    distributed_type: str = "NO"
    # The launcher's mixed precision (TrainingArguments reads it when bf16 / fp16 are unset).
    mixed_precision: str | None = None
    dynamo_backend: str | None = None  # compile every prepared module, even with torch_compile off
    dynamo_mode: str | None = None
    dynamo_dynamic: bool | None = None
    # DeepSpeed only (None otherwise), as accelerate's DeepSpeedPlugin resolves them from `deepspeed`:
    zero_stage: int | None = None  # ZeRO stage 0-3
    # The device the optimizer state / the parameters (ZeRO-3) are offloaded to: "cpu", "nvme"; None: not offloaded.
    offload_optimizer: str | None = None
    offload_param: str | None = None
    # ZeRO-3 builds the model already partitioned (deepspeed.zero.Init; accelerate's `zero3_init_flag`).
    zero3_init: bool | None = None
    # FSDP only (None / empty otherwise):
    fsdp_version: int | None = None  # 1 (FullyShardedDataParallel) or 2 (fully_shard)
    # accelerate's fsdp_config keys as given, without the `fsdp_` prefix (sharding_strategy / reshard_after_forward,
    # auto_wrap_policy, transformer_layer_cls_to_wrap, activation_checkpointing, offload_params,
    # cpu_ram_efficient_loading, state_dict_type, ...; "true" / "false" as booleans): the launcher's, then the
    # TrainingArguments `fsdp` / `fsdp_config` mapped onto the same keys (they win, as the Trainer's plugin
    # arguments win over the launcher's).
    fsdp: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    # The effective DeepSpeed config: the JSON (`deepspeed_config_file`, or the trainer's `deepspeed` path or inline
    # dict) or, without one, the config accelerate builds from its deepspeed_config keys; accelerate's keys folded in
    # as DeepSpeedPlugin folds them ("auto" values filled). Empty unless distributed_type is DEEPSPEED.
    deepspeed: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    sequence_parallel: int = 1  # context / sequence parallel size: sequences are split across processes
    # Where the launch was read from: the accelerate config file, TRL's preset, the trainer fields.
    source: str | None = None

    @property
    def sharded(self) -> bool:
        """DeepSpeed or FSDP wrap and shard the model (graphs differ from a DDP run's)."""
        return self.distributed_type in ("DEEPSPEED", "FSDP")

    def describe(self) -> str:
        """The mode in words: "DeepSpeed ZeRO-3 with CPU offload of parameters, 8 processes from FILE"."""
        if self.distributed_type == "DEEPSPEED":
            mode = "DeepSpeed" + (f" ZeRO-{self.zero_stage}" if self.zero_stage is not None else "")
            offloads = [
                f"{device.upper()} offload of {what}"
                for device, what in (
                    (self.offload_optimizer, "the optimizer state"),
                    (self.offload_param, "parameters"),
                )
                if device
            ]
            if offloads:
                mode += " with " + " and ".join(offloads)
        elif self.distributed_type == "FSDP":
            mode = f"FSDP{self.fsdp_version or ''}"
            if self.fsdp.get("offload_params") is True:
                mode += " with CPU offload of parameters"
        else:
            mode = self.distributed_type
        where = []
        if self.processes is not None:
            where.append(f"{self.processes} process{'es' if self.processes != 1 else ''}")
        if self.machines is not None and self.machines > 1:
            where.append(f"on {self.machines} machines")
        told = " ".join(where)
        return f"{mode}{', ' + told if told else ''} from {self.source or 'accelerate launch flags'}"


class LaunchProblem(Exception):
    """What `accelerate launch` (or the training process it starts) refuses, and the config key it is about."""

    def __init__(self, loc: str, message: str) -> None:
        super().__init__(message)
        self.problem = FieldProblem(loc, message)


# accelerate's launchers that start num_processes processes (launch_command: deepspeed_launcher,
# multi_gpu_launcher for FSDP / Megatron-LM / multi-GPU, the TPU launchers); the simple launcher starts one
# (several only under mpirun, from the file's mpirun_config).
MULTI_PROCESS_FLAGS = {
    "use_deepspeed": "DEEPSPEED",
    "use_fsdp": "FSDP",
    "use_megatron_lm": "MEGATRON_LM",
    "multi_gpu": "MULTI_GPU",
    "tpu": "XLA",
}
# TrainingArguments' `fsdp_plugin_args` (transformers) -> the accelerate fsdp_config key it sets.
PLUGIN_ARGS_TO_FSDP_KEYS = {
    "cpu_offload": "offload_params",
    "transformer_cls_names_to_wrap": "transformer_layer_cls_to_wrap",
}


@contextlib.contextmanager
def placed_files(
    leftover: dict[str, Any], files: dict[str, Any]
) -> Iterator[tuple[dict[str, Any], dict[str, str]]]:
    """The launch keys with the files they name (the spec's `files`, read where the config was read) written to a
    scratch directory, for accelerate to open as it opens them, and each scratch path's name as the config wrote it."""
    if not files:
        yield leftover, {}
        return
    with tempfile.TemporaryDirectory(prefix="warmup-launch-") as scratch:
        placed: dict[str, str] = {}

        def place(name: str, content: Any) -> str:
            if name not in placed:
                target = Path(scratch) / str(len(placed)) / Path(name).name
                target.parent.mkdir()
                json_file = (
                    target.suffix == ".json"
                    or not isinstance(content, dict)
                    or "zero_optimization" in content
                )
                target.write_text(json.dumps(content) if json_file else yaml.safe_dump(content))
                placed[name] = str(target)
            return placed[name]

        keys = dict(leftover)
        for key in ("config_file", "accelerate_config"):
            name = keys.get(key)
            if isinstance(name, str) and isinstance(files.get(name), dict):
                content = dict(files[name])
                section = content.get("deepspeed_config")
                if isinstance(section, dict) and section.get("deepspeed_config_file") in files:
                    json_name = section["deepspeed_config_file"]
                    content["deepspeed_config"] = {
                        **section,
                        "deepspeed_config_file": place(json_name, files[json_name]),
                    }
                keys[key] = place(name, content)
        name = keys.get("deepspeed_config_file")
        if isinstance(name, str) and name in files:
            keys["deepspeed_config_file"] = place(name, files[name])
        yield keys, {path: name for name, path in placed.items()}


def read_launch(
    argv: list[str],
    keys: dict[str, str],
    labels: dict[str, str],
    trainer_deepspeed: Any,
    parser: argparse.ArgumentParser,
    files: dict[str, Any] | None = None,
) -> Launch:
    """The Launch of `accelerate launch ARGV SCRIPT` with the trainer config's `deepspeed` value. `keys` maps each
    accelerate dest the config set to the config key that set it (where a problem is), `labels` a file's path on
    the line to the name the config gave it, `files` the spec's launch files (the trainer's `deepspeed` path is
    looked up there). Raises LaunchProblem."""
    from warmup._compat.accelerate import validate_launch_command

    args = parser.parse_args([*argv, "SCRIPT"])
    given = set(getattr(args, "nondefault", ()))
    defaults = None
    explicit_precision = args.mixed_precision
    if args.config_file is not None:
        where = keys.get("config_file", "args.config_file")
        file_name = labels.get(str(args.config_file), str(args.config_file))
        if not Path(args.config_file).is_file():
            raise LaunchProblem(where, missing_launch_file(file_name, "`accelerate launch`"))
        args.mixed_precision = None  # an explicit value wins anyway; the check it triggers asks this machine
        try:
            args, defaults, _ = validate_launch_command(args)
        except (ValueError, OSError, yaml.YAMLError) as error:
            raise LaunchProblem(where, f"`accelerate launch` refuses {file_name}: {error}") from None
        if explicit_precision is not None:
            args.mixed_precision = explicit_precision
    source = (
        labels.get(str(args.config_file), str(args.config_file)) if args.config_file is not None else None
    )

    distributed = next((mode for flag, mode in MULTI_PROCESS_FLAGS.items() if getattr(args, flag)), None)
    if distributed == "MULTI_GPU" and defaults is not None:
        distributed = str(defaults.distributed_type.value)  # MULTI_NPU, MULTI_XPU, ... launch alike
    if distributed is not None:
        processes = args.num_processes
    elif defaults is not None:
        distributed = str(defaults.distributed_type.value)  # NO, MULTI_CPU
        processes = args.num_processes if getattr(args, "mpirun_hostfile", None) else 1
    else:
        # No file: accelerate turns multi-GPU on for num_processes > 1 on a machine of several GPUs (the target's).
        processes = args.num_processes
        distributed = "MULTI_GPU" if processes is not None and processes > 1 else "NO"

    deepspeed: dict[str, Any] = {}
    stage = offload_optimizer = offload_param = zero3_init = None
    if trainer_deepspeed is not None or distributed == "DEEPSPEED":
        json_config = trainer_deepspeed
        if isinstance(json_config, str) and isinstance((files or {}).get(json_config), dict):
            json_config = (files or {})[json_config]  # the JSON as read where the config was read
        plugin = _deepspeed_plugin(args, defaults, json_config, keys, labels)
        distributed = "DEEPSPEED"
        deepspeed = {
            k: v for k, v in plugin.deepspeed_config.items() if k != "steps_per_print"
        }  # inf: a log knob
        stage = int(plugin.zero_stage)
        offload_optimizer = _device(plugin.offload_optimizer_device)
        offload_param = _device(plugin.offload_param_device)
        zero3_init = bool(plugin.zero3_init_flag)
        if trainer_deepspeed is not None:
            told = trainer_deepspeed if isinstance(trainer_deepspeed, str) else "an inline dict"
            source = f"deepspeed: {told}" + (f" under {source}" if source else "")

    fsdp: dict[str, Any] = {}
    version = None
    if distributed == "FSDP":
        # The file's fsdp_config keys (accelerate copied them onto args) and the fsdp keys given explicitly.
        named = {f"fsdp_{k.removeprefix('fsdp_')}" for k in (defaults.fsdp_config if defaults else {})}
        named |= {dest for dest in given if dest.startswith("fsdp_")}
        fsdp = {dest.removeprefix("fsdp_"): _boolean(getattr(args, dest)) for dest in sorted(named)}
        version = int(fsdp.pop("version", None) or args.fsdp_version)

    dynamo_backend = str(args.dynamo_backend or "no").lower()
    dynamo = (defaults.dynamo_config or {}) if defaults is not None else {}
    sequence = 1
    for dest in ("parallelism_config_cp_size", "parallelism_config_sp_size"):
        sequence *= int(getattr(args, dest, None) or 1)
    return Launch(
        processes=processes,
        machines=args.num_machines,
        distributed_type=distributed,
        mixed_precision=args.mixed_precision,
        dynamo_backend=None if dynamo_backend == "no" else dynamo_backend,
        dynamo_mode=args.dynamo_mode
        if "dynamo_mode" in given or "mode" in dynamo or "dynamo_mode" in dynamo
        else None,
        dynamo_dynamic=bool(args.dynamo_use_dynamic) or None,
        zero_stage=stage,
        offload_optimizer=offload_optimizer,
        offload_param=offload_param,
        zero3_init=zero3_init,
        fsdp_version=version,
        fsdp=fsdp,
        deepspeed=deepspeed,
        sequence_parallel=sequence,
        source=source,
    )


def with_trainer_fsdp(launch: Launch, plugin_args: dict[str, Any] | None) -> Launch:
    """Fold TrainingArguments `fsdp` / `fsdp_config` in, as transformers hands them to accelerate's FSDP plugin
    (`fsdp_plugin_args`): its arguments win over the launcher's; FSDP applies when several processes run."""
    if not plugin_args:
        return launch
    args = dict(plugin_args)
    version = int(args.pop("fsdp_version", 2))
    mapped = {PLUGIN_ARGS_TO_FSDP_KEYS.get(key, key): _boolean(value) for key, value in args.items()}
    if launch.processes == 1:
        return launch  # accelerate applies FSDP to multi-process runs only (AcceleratorState)
    source = "fsdp / fsdp_config" + (f" under {launch.source}" if launch.source else "")
    return dataclasses.replace(
        launch,
        distributed_type="FSDP",
        fsdp_version=version,
        fsdp={**launch.fsdp, **mapped},
        source=source,
    )


def _deepspeed_plugin(
    args: argparse.Namespace,
    defaults: Any,
    trainer_deepspeed: Any,
    keys: dict[str, str],
    labels: dict[str, str],
) -> Any:
    """accelerate's DeepSpeedPlugin as the training process builds it from the launcher's settings."""
    from accelerate.utils import DeepSpeedPlugin

    config: Any = trainer_deepspeed if trainer_deepspeed is not None else args.deepspeed_config_file
    where = (
        "args.deepspeed"
        if trainer_deepspeed is not None
        else keys.get("deepspeed_config_file", keys.get("config_file", "args.config_file"))
    )
    if isinstance(config, str) and not Path(config).is_file():
        raise LaunchProblem(where, missing_launch_file(labels.get(config, config), "the training process"))
    if config is not None and defaults is not None:
        # DeepSpeedPlugin._deepspeed_config_checks: with a DeepSpeed JSON, these accelerate keys must not be set
        ignored = {
            "gradient_accumulation_steps",
            "gradient_clipping",
            "zero_stage",
            "offload_optimizer_device",
            "offload_param_device",
            "offload_param_nvme_path",
            "offload_optimizer_nvme_path",
            "zero3_save_16bit_model",
            "mixed_precision",
        }
        clash = sorted(set(defaults.deepspeed_config) & ignored)
        if clash:
            raise LaunchProblem(
                keys.get("config_file", "args.config_file"),
                f"accelerate refuses deepspeed_config keys {', '.join(clash)} beside a DeepSpeed config file "
                "(DeepSpeedPlugin: they are ignored when using `deepspeed_config_file`): set them in the JSON",
            )
    # The environment accelerate's deepspeed launcher gives the training process (prepare_deepspeed_cmd_env),
    # as the arguments the plugin reads it into.
    kwargs: dict[str, Any] = {"hf_ds_config": config}
    if args.zero_stage is not None:
        kwargs["zero_stage"] = int(args.zero_stage)
    if args.gradient_accumulation_steps is not None:
        kwargs["gradient_accumulation_steps"] = int(args.gradient_accumulation_steps)
    if args.gradient_clipping is not None:
        kwargs["gradient_clipping"] = float(args.gradient_clipping)
    for dest in ("offload_optimizer_device", "offload_param_device"):
        if getattr(args, dest) is not None:
            kwargs[dest] = str(getattr(args, dest)).lower()
    for dest in ("offload_optimizer_nvme_path", "offload_param_nvme_path"):
        if getattr(args, dest) is not None:
            kwargs[dest] = str(getattr(args, dest))
    if args.zero3_init_flag is not None:
        kwargs["zero3_init_flag"] = _boolean(args.zero3_init_flag) is True
    if args.zero3_save_16bit_model is not None:
        kwargs["zero3_save_16bit_model"] = _boolean(args.zero3_save_16bit_model) is True
    try:
        return DeepSpeedPlugin(**kwargs)
    except ValueError as error:
        raise LaunchProblem(where, f"accelerate's DeepSpeed plugin refuses it: {error}") from None


def _device(value: Any) -> str | None:
    text = str(value).lower() if value is not None else "none"
    return None if text == "none" else text


def _boolean(value: Any) -> Any:
    """accelerate's "true" / "false" strings (any case) as booleans; other values as given."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value
