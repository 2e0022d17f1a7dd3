"""The Launch facts a trl config's launcher and sharding fields come to (warmup/job/trl_config.py)."""

from __future__ import annotations

import dataclasses

from warmup.job.trl_config import Launch


def test_launch_is_frozen_and_hashable_with_its_dicts_left_out_of_the_hash():
    launch = Launch(processes=8, distributed_type="FSDP", fsdp_version=2, fsdp={"offload_params": True})
    assert hash(launch) == hash(dataclasses.replace(launch, fsdp={"offload_params": False}))
    assert launch != dataclasses.replace(launch, fsdp={"offload_params": False})
    assert {launch: 1}[launch] == 1


def test_the_mode_is_named_precisely():
    zero3 = Launch(
        processes=8,
        distributed_type="DEEPSPEED",
        zero_stage=3,
        offload_param="cpu",
        source="examples/accelerate_configs/deepspeed_zero3.yaml",
    )
    assert zero3.sharded
    assert zero3.describe() == (
        "DeepSpeed ZeRO-3 with CPU offload of parameters, 8 processes from "
        "examples/accelerate_configs/deepspeed_zero3.yaml"
    )
    fsdp = Launch(processes=16, machines=2, distributed_type="FSDP", fsdp_version=2, source="fsdp2.yaml")
    assert fsdp.describe() == "FSDP2, 16 processes on 2 machines from fsdp2.yaml"
    assert not Launch(processes=8, distributed_type="MULTI_GPU").sharded


def launch_options():
    """Every option of accelerate's own launch parser (the installed accelerate), by its `--dest` spelling."""
    from accelerate.commands.launch import launch_command_parser

    return [
        action
        for action in launch_command_parser()._actions
        if f"--{action.dest}" in action.option_strings and action.dest != "help"
    ]


def sample_value(action):
    if action.nargs == 0:
        return True
    if action.choices:
        return next(iter(action.choices))
    if action.default not in (None, True, False, ()):
        return action.default if not isinstance(action.default, tuple) else "false,false,false"
    return 1 if action.type is int else 0.5 if action.type is float else "x"


def test_every_option_of_accelerates_launch_parser_is_a_launch_key_of_a_trl_config():
    """Held to the installed accelerate: each of its launch options is taken as `trl` hands it over (a flag that
    takes no value is refused with the reason), none is called an unknown field."""
    from warmup.job.spec import Spec
    from warmup.job.trl_args import config_class
    from warmup.job.trl_config import _script_parser, read_trl_args

    options = launch_options()
    assert len(options) > 100  # accelerate 1.15 has about 120
    trls = set(_script_parser("sft")[1]) | {
        "env"
    }  # `debug`, `gradient_accumulation_steps`: TRL reads them itself
    for action in (a for a in options if a.dest not in trls):
        value = sample_value(action)
        spec = Spec(trainer="sft", model="m", args={action.dest: value})
        problems = {p.loc: p.msg for p in read_trl_args(spec, config_class("sft")).problems}
        told = problems.get(f"args.{action.dest}", "")
        assert "unknown field" not in told, action.dest
        if action.nargs == 0:
            assert "takes the training script's place" in told, action.dest
