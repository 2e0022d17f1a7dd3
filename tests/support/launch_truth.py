"""What `accelerate launch` (1.15) runs for the launch line of a trl config, by accelerate's own code.

`trl` hands the keys its script does not read to accelerate; `trl_launch_line` builds that line with TRL's own
parser and `resolve_accelerate_config_argument`. `accelerate_truth` runs accelerate on it up to starting processes:
its launch parser, `_validate_launch_command` (the config file, its precedence), then the environment its
launcher gives the training process (`prepare_deepspeed_cmd_env` / `prepare_multi_gpu_env`, as `launch_command`
calls them) and the DeepSpeedPlugin the training process builds from that environment. accelerate's FSDP plugin
needs a GPU to build, so FSDP's facts are the FSDP_* variables it reads. This machine's default accelerate config
is not read (the job's machine has its own, or none).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from pathlib import Path
from typing import Any
from unittest import mock

import yaml

ROOT = Path(__file__).resolve().parents[1] / "real_configs"


def write_accelerate_configs(directory: Path) -> Path:
    """Every accelerate config file of the real-config collection, at the path configs name it by."""
    for entry in yaml.safe_load((ROOT / "PROVENANCE.yaml").read_text())["accelerate_configs"]:
        target = directory / entry["named"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((ROOT / entry["file"]).read_text())
    return directory


def trl_launch_line(trainer: str, config: Path) -> list[str]:
    """The arguments `trl <trainer> --config CONFIG` hands to `accelerate launch` (before the script)."""
    from trl.cli.accelerate_config import resolve_accelerate_config_argument

    module = importlib.import_module(f"trl.scripts.{trainer}")
    *_, remaining, _ = module.make_parser().parse_args_and_config(
        ["--config", str(config)], return_remaining_strings=True, separate_remaining_strings=True
    )
    return resolve_accelerate_config_argument(remaining)


@dataclasses.dataclass
class LaunchTruth:
    processes: int
    machines: int | None
    distributed_type: str
    mixed_precision: str | None
    env: dict[str, str]  # what the launcher sets for the training process (ACCELERATE_*, FSDP_*)
    deepspeed: Any = None  # the DeepSpeedPlugin the training process builds


def accelerate_truth(argv: list[str]) -> LaunchTruth:
    import accelerate.commands.launch as launch
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    args = launch.launch_command_parser().parse_args([*argv, "train.py"])
    with mock.patch.object(launch, "default_config_file", "/nonexistent/default_config.yaml"):
        args, defaults, from_file = launch._validate_launch_command(args)
    env: dict[str, str] = {}
    plugin = None
    if args.use_deepspeed:
        # launch_command's own lines before it calls deepspeed_launcher
        fields = list(defaults.deepspeed_config) if defaults else []
        args.deepspeed_fields_from_accelerate_config = ",".join(
            fields + (["mixed_precision"] if from_file else [])
        )
        _, env = prepare_deepspeed_cmd_env(args)
        distributed = "DEEPSPEED"
    elif args.use_fsdp or args.multi_gpu or args.use_megatron_lm:
        env = prepare_multi_gpu_env(args)
        distributed = "FSDP" if args.use_fsdp else "MEGATRON_LM" if args.use_megatron_lm else "MULTI_GPU"
    else:
        distributed = str(defaults.distributed_type.value) if defaults is not None else "NO"
    # the simple launcher starts one process (no mpirun in these configs)
    processes = int(args.nproc_per_node) * int(getattr(args, "nnodes", 1) or 1) if env else 1
    launched = {k: v for k, v in env.items() if k.startswith(("ACCELERATE_", "FSDP_"))}
    if distributed == "DEEPSPEED":
        with mock.patch.dict(os.environ, launched, clear=True):
            plugin = DeepSpeedPlugin()
    return LaunchTruth(
        processes=processes,
        machines=args.num_machines,
        distributed_type=distributed,
        mixed_precision=args.mixed_precision,
        env=launched,
        deepspeed=plugin,
    )
